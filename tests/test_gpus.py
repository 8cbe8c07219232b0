"""GPU spec packs: the shipped reference pack, pack-file errors, the catalogue's lookups and clashes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rpx_core.errors import RpxError
from rpx_core.precision import PRECISIONS, UnknownPrecisionError
from rpx_core.registry.gpus import (
    AmbiguousGPUError,
    GPUCatalog,
    GPUConflictError,
    GPUPack,
    GPUPackError,
    MissingPeakError,
    UnknownGPUError,
    describe_gpu,
    gpu_rows,
    load_pack,
)
from rpx_plugins.reference_gpus import reference_pack_path

PROVIDER = "rpx 0.1.0"


@pytest.fixture(scope="module")
def reference() -> GPUPack:
    return load_pack(reference_pack_path(), provider=PROVIDER)


@pytest.fixture(scope="module")
def catalog(reference: GPUPack) -> GPUCatalog:
    return GPUCatalog([reference])


# ------------------------------------------------------------------------------------------------------ reference pack


def test_reference_pack_is_shipped_inside_rpx_plugins() -> None:
    path = reference_pack_path()
    assert path.name == "reference.toml"
    assert path.is_file()


def test_reference_pack_covers_at_least_15_gpus_each_with_a_source(reference: GPUPack) -> None:
    assert len(reference.gpus) >= 15
    for spec in reference.gpus:
        assert spec.source.strip(), spec.name
        assert spec.pack == f"reference ({PROVIDER})"


def test_reference_pack_spans_the_required_segments(reference: GPUPack) -> None:
    segments = {spec.segment for spec in reference.gpus}
    assert {"datacenter", "workstation", "consumer", "edge", "soc"} <= segments


@pytest.mark.parametrize(
    "name",
    [
        "A100 SXM 80GB", "A100 PCIe 80GB", "H100 SXM", "H100 PCIe", "H200 SXM", "L4", "L40S", "V100 SXM2 32GB", "T4",
        "MI300X", "RTX 4090", "RTX 3090", "RTX 6000 Ada", "Jetson AGX Orin 64GB", "Jetson Orin Nano 8GB",
        "Apple M2 Max", "Apple M3 Max", "TPU v5e",
    ],
)
def test_reference_pack_has_the_required_gpus(catalog: GPUCatalog, name: str) -> None:
    assert catalog.get(name).peaks


def test_apple_figures_are_marked_as_estimates(reference: GPUPack) -> None:
    apple = [spec for spec in reference.gpus if spec.vendor == "Apple"]
    assert len(apple) == 2
    for spec in apple:
        for peak in spec.peaks.values():
            assert peak.estimate and peak.note


def test_every_estimate_says_how_it_was_obtained(reference: GPUPack) -> None:
    for spec in reference.gpus:
        for precision, peak in spec.peaks.items():
            assert precision in PRECISIONS
            assert peak.tflops > 0
            if peak.estimate:
                assert peak.note, f"{spec.name} {precision}"


def test_sparse_headlines_are_twice_the_dense_figures(reference: GPUPack) -> None:
    # A typo check independent of the datasheets: 2:4 sparsity doubles tensor throughput, so a stored pair that is not
    # close to 1:2 means one of the two numbers was mistyped (L40S fp16, 362.05 vs 733, is the datasheet's own 1% gap).
    for spec in reference.gpus:
        for precision, peak in spec.peaks.items():
            if peak.sparse_tflops is not None:
                assert peak.sparse_tflops / peak.tflops == pytest.approx(2, rel=0.02), f"{spec.name} {precision}"


def test_datasheet_figures_for_h100_sxm_and_a100(catalog: GPUCatalog) -> None:
    # NVIDIA datasheets: H100 SXM FP16 tensor 1,979 TFLOPS with sparsity, "1/2 lower without"; 3.35 TB/s; 80 GB.
    h100 = catalog.get("H100-SXM")
    assert h100.peaks["fp16"].tflops == 989.4
    assert h100.peaks["fp16"].sparse_tflops == 1978.9
    assert h100.peak_flops("fp16") == pytest.approx(989.4e12)
    assert h100.peaks["fp32"].tflops == 67
    assert h100.bandwidth_bytes_s == pytest.approx(3.35e12)
    assert h100.memory_bytes == 80_000_000_000
    # A100 80GB: FP16 tensor 312 dense (624 sparse), FP32 vector 19.5; SXM 2,039 GB/s, PCIe 1,935 GB/s.
    assert catalog.get("A100-SXM-80GB").peak_flops("fp16") == pytest.approx(312e12)
    assert catalog.get("A100-SXM-80GB").peak_flops("fp32") == pytest.approx(19.5e12)
    assert catalog.get("A100-PCIe-80GB").bandwidth_gb_s == 1935


# ------------------------------------------------------------------------------------------------------------- lookups


@pytest.mark.parametrize(
    ("device_name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_a_measured_gpu_is_found_by_its_device_name(catalog: GPUCatalog, device_name: str, expected: str) -> None:
    spec = catalog.find_by_device_name(device_name)
    assert spec is not None and spec.name == expected
    assert spec.matches(device_name)


def test_an_unlisted_or_ambiguous_device_name_finds_nothing(catalog: GPUCatalog) -> None:
    assert catalog.find_by_device_name("NVIDIA GeForce GTX 1080") is None
    # Every Jetson Orin module reports "Orin"; guessing one of them would be wrong half the time.
    assert catalog.find_by_device_name("Orin") is None


def test_get_ignores_case_and_punctuation(catalog: GPUCatalog) -> None:
    assert catalog.get("h100-sxm").name == "H100-SXM"
    assert catalog.get("A100 SXM 80GB").name == "A100-SXM-80GB"
    assert catalog.get("nvidia a100-sxm4-80gb").name == "A100-SXM-80GB"
    assert not catalog.get("H100-SXM").matches("NVIDIA H100 PCIe")


def test_an_unknown_name_lists_close_matches_first(catalog: GPUCatalog) -> None:
    with pytest.raises(UnknownGPUError) as excinfo:
        catalog.get("H1000")
    message = str(excinfo.value)
    assert message.startswith("GPU 'H1000' not recognized. Choose one of: ")
    names = message.split("Choose one of: ")[1].split(", ")
    assert names[0].startswith("H100")
    assert sorted(names) == sorted(spec.name for spec in catalog.all())
    assert isinstance(excinfo.value, RpxError)


def test_a_prefix_means_every_gpu_it_begins_and_one_gpu_only_when_unique(catalog: GPUCatalog) -> None:
    assert [spec.name for spec in catalog.matching("h100")] == ["H100-SXM", "H100-PCIe"]
    assert [spec.name for spec in catalog.matching("A100-sxm")] == ["A100-SXM-80GB", "A100-SXM-40GB"]
    assert catalog.get("h200").name == "H200-SXM"  # a unique prefix
    assert catalog.get("GeForce RTX 40").name == "RTX-4090"  # of an alias
    assert [spec.name for spec in catalog.matching("L4")] == ["L4"]  # an exact name wins over L40S it begins
    with pytest.raises(AmbiguousGPUError, match=r"^GPU 'H100' could mean H100-SXM, H100-PCIe; name one$"):
        catalog.get("H100")
    assert catalog.matching("") == [] and catalog.matching("zz") == []
    assert catalog.find_by_device_name("NVIDIA H100") is None  # a runtime's name is never matched by prefix


def test_an_empty_catalogue_says_no_pack_is_loaded() -> None:
    with pytest.raises(UnknownGPUError, match=r"^GPU 'H100' not recognized\. No GPU pack is loaded\.$"):
        GPUCatalog([]).get("H100")


def test_all_returns_every_gpu_in_file_order(catalog: GPUCatalog, reference: GPUPack) -> None:
    assert [spec.name for spec in catalog.all()] == [spec.name for spec in reference.gpus]


def test_rows_give_each_precision_as_data_with_whether_it_is_derived(catalog: GPUCatalog) -> None:
    rows = {row["name"]: row for row in gpu_rows(catalog)}
    h100 = rows["H100-SXM"]["precisions"]
    assert {name: peak["tflops"] for name, peak in h100.items()} == {
        "fp32": 67, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9, "int8": 1978.9}
    assert h100["fp16"] == {"tflops": 989.4, "derived": False, "note": None, "sparse_tflops": 1978.9}
    orin = rows["Jetson-AGX-Orin-64GB"]["precisions"]
    assert [(name, peak["derived"]) for name, peak in orin.items()] == [("fp32", False), ("fp16", True), ("int8", False)]
    assert orin["fp16"]["note"]  # a derived figure says how it was obtained
    assert rows["TPU-v5e"]["pack"] == f"reference ({PROVIDER})"


def test_describe_gives_every_stated_field_and_the_pack(catalog: GPUCatalog, reference: GPUPack) -> None:
    data = describe_gpu(catalog.get("T4"), catalog.pack_of(catalog.get("T4")), catalog)
    fp16 = data["peaks"]["fp16"]
    assert fp16 == {"tflops": 65, "derived": False, "note": fp16["note"], "sparse_tflops": None}
    assert fp16["sparse_tflops"] is None  # Turing has no 2:4 sparsity: none, not zero
    assert data["aliases"] == ["Tesla T4", "NVIDIA T4"]
    assert (data["pack_version"], data["pack_source"]) == (reference.version, reference.source)
    assert catalog.pack_of(catalog.get("T4")) is reference


# --------------------------------------------------------------------------------------------------------------- peaks


def test_a_missing_precision_is_an_error_never_a_fallback(catalog: GPUCatalog) -> None:
    t4 = catalog.get("T4")
    with pytest.raises(MissingPeakError) as excinfo:
        t4.peak_flops("bf16")
    message = str(excinfo.value)
    assert "'T4'" in message and "bf16" in message and "fp32, tf32, fp16, int8" in message
    # The TPU has bf16 but no published fp32 figure.
    with pytest.raises(MissingPeakError):
        catalog.get("TPU-v5e").peak_flops("fp32")


def test_tf32_on_a_gpu_without_tf32_tensor_cores_is_an_explicit_noted_entry(catalog: GPUCatalog) -> None:
    v100 = catalog.get("V100-SXM2-32GB")
    assert v100.peaks["tf32"].tflops == v100.peaks["fp32"].tflops
    assert "No TF32 tensor cores" in v100.peaks["tf32"].note


def test_an_unknown_precision_suggests_the_closest(catalog: GPUCatalog) -> None:
    with pytest.raises(UnknownPrecisionError, match="did you mean 'fp16'"):
        catalog.get("H100-SXM").peak_flops("fp61")


# ---------------------------------------------------------------------------------------------------------- bad packs

GOOD_GPU = """
[[gpu]]
name = "X1"
aliases = ["Acme X1"]
vendor = "Acme"
segment = "datacenter"
memory_gb = 10
memory_type = "HBM3"
bandwidth_gb_s = 100
source = "Acme X1 datasheet"

[gpu.peaks.fp16]
tflops = 50
"""


def write_pack(tmp_path: Path, gpus: str, name: str = "acme", filename: str = "bad.toml") -> Path:
    path = tmp_path / filename
    path.write_text(f'[pack]\nname = "{name}"\nversion = "1"\nsource = "Acme datasheets"\n{gpus}', encoding="utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(GPUPackError) as excinfo:
        load_pack(path, provider="acme-gpus 1.2")
    return str(excinfo.value)


def test_a_valid_pack_loads(tmp_path: Path) -> None:
    pack = load_pack(write_pack(tmp_path, GOOD_GPU, filename="good.toml"), provider="acme-gpus 1.2")
    assert pack.label == "acme (acme-gpus 1.2)"
    assert pack.gpus[0].peak_flops("fp16") == pytest.approx(50e12)
    assert pack.gpus[0].memory_bytes == 10_000_000_000


def test_a_wrong_type_names_the_file_and_key_path(tmp_path: Path) -> None:
    path = write_pack(tmp_path, GOOD_GPU.replace("tflops = 50", 'tflops = "50"'))
    message = load_error(path)
    assert message.startswith(f"{path}: gpu[0].peaks.fp16.tflops: ")
    assert "expected a number" in message
    assert "\n" not in message


def test_a_boolean_is_not_a_number(tmp_path: Path) -> None:
    message = load_error(write_pack(tmp_path, GOOD_GPU.replace("memory_gb = 10", "memory_gb = true")))
    assert "gpu[0].memory_gb: " in message and "expected a number" in message


def test_an_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    message = load_error(write_pack(tmp_path, GOOD_GPU.replace("bandwidth_gb_s", "bandwith_gb_s")))
    assert "bad.toml: gpu[0]: unknown key 'bandwith_gb_s'; did you mean 'bandwidth_gb_s'?" in message


def test_a_missing_field_is_named(tmp_path: Path) -> None:
    message = load_error(write_pack(tmp_path, GOOD_GPU.replace('source = "Acme X1 datasheet"\n', "")))
    assert message == f"{tmp_path / 'bad.toml'}: gpu[0].source: required key is missing"


def test_an_unknown_precision_or_segment_suggests_the_closest(tmp_path: Path) -> None:
    gpus = GOOD_GPU.replace("peaks.fp16", "peaks.fp61").replace('"datacenter"', '"datacentre"')
    message = load_error(write_pack(tmp_path, gpus))
    assert ("gpu[0].peaks.fp61: expected one of 'fp32', 'tf32', 'fp16', 'bf16', 'fp8', 'int8', got 'fp61'; "
            "did you mean 'fp16'?") in message
    assert "gpu[0].segment: unknown segment 'datacentre'; did you mean 'datacenter'?" in message


def test_an_estimate_without_a_note_is_refused(tmp_path: Path) -> None:
    message = load_error(write_pack(tmp_path, GOOD_GPU.replace("tflops = 50", "tflops = 50\nestimate = true")))
    assert message.endswith("gpu[0].peaks.fp16.note: an estimate needs a note saying how it was obtained")


def test_non_positive_figures_and_inverted_sparse_headlines_are_refused(tmp_path: Path) -> None:
    gpus = GOOD_GPU.replace("bandwidth_gb_s = 100", "bandwidth_gb_s = 0").replace(
        "tflops = 50", "tflops = 50\nsparse_tflops = 25"
    )
    message = load_error(write_pack(tmp_path, gpus))
    assert "gpu[0].bandwidth_gb_s: must be greater than 0, got 0" in message
    assert "gpu[0].peaks.fp16.sparse_tflops: smaller than the dense tflops" in message


def test_the_second_entry_is_indexed_and_duplicate_names_are_refused(tmp_path: Path) -> None:
    message = load_error(write_pack(tmp_path, GOOD_GPU + GOOD_GPU.replace('name = "X1"', 'name = "acme-x1"')))
    assert "gpu[1]: name 'acme-x1' is already used by gpu[0]" in message


def test_a_gpu_entry_cannot_name_its_pack(tmp_path: Path) -> None:
    message = load_error(write_pack(tmp_path, GOOD_GPU.replace('vendor = "Acme"', 'vendor = "Acme"\npack = "other"')))
    assert "gpu[0]: unknown key 'pack'" in message


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[pack\nname = 'x'\n", encoding="utf-8")
    message = load_error(path)
    assert message.startswith(f"{path}: invalid TOML: ")
    assert "\n" not in message


def test_a_pack_without_gpus_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.toml"
    path.write_text('gpu = []\n[pack]\nname = "acme"\nversion = "1"\nsource = "Acme datasheets"\n', encoding="utf-8")
    assert load_error(path) == f"{path}: gpu: a pack needs at least one [[gpu]] entry"


# ------------------------------------------------------------------------------------------------------------- clashes


@pytest.fixture
def two_packs(tmp_path: Path) -> tuple[GPUPack, GPUPack]:
    acme = load_pack(write_pack(tmp_path, GOOD_GPU, filename="acme.toml"), provider="acme-gpus 1.2")
    other = GOOD_GPU.replace("tflops = 50", "tflops = 60").replace('"Acme X1"', '"Other X1"')
    rival = load_pack(write_pack(tmp_path, other, name="rival", filename="rival.toml"), provider="rival-gpus 3.0")
    return acme, rival


def test_two_packs_defining_one_gpu_is_an_error_naming_both_where_it_is_used(two_packs: tuple[GPUPack, GPUPack]) -> None:
    catalog = GPUCatalog(two_packs)  # building the catalogue does not fail: only using the clashing name does
    with pytest.raises(GPUConflictError) as excinfo:
        catalog.get("X1")
    message = str(excinfo.value)
    assert "'X1'" in message
    assert "acme (acme-gpus 1.2)" in message and "rival (rival-gpus 3.0)" in message
    assert "choose" in message
    with pytest.raises(GPUConflictError, match="'X1'"):
        catalog.all()  # "all" uses every name
    assert catalog.conflicts() == [message]
    assert "X1" not in {spec.name for spec in catalog.usable()}


def test_choose_settles_a_clash(two_packs: tuple[GPUPack, GPUPack]) -> None:
    assert GPUCatalog(two_packs, choose={"X1": "rival"}).get("X1").peak_flops("fp16") == pytest.approx(60e12)
    assert GPUCatalog(two_packs, choose={"x1": "acme"}).get("Acme X1").peak_flops("fp16") == pytest.approx(50e12)


def test_choose_must_name_a_pack_that_defines_the_gpu(two_packs: tuple[GPUPack, GPUPack]) -> None:
    with pytest.raises(GPUConflictError, match="only these packs define it"):
        GPUCatalog(two_packs, choose={"X1": "reference"}).get("X1")
    assert GPUCatalog(two_packs, choose={"X11": "acme"}).problems == [
        "choose.gpus.X11: no pack defines GPU 'X11'; did you mean 'X1'?"]
    assert GPUCatalog(two_packs, choose={"Other X1": "rival"}).get("X1").pack == "rival (rival-gpus 3.0)"  # an alias


def test_an_alias_claimed_by_two_gpus_is_an_error(tmp_path: Path, reference: GPUPack) -> None:
    thief = GOOD_GPU.replace('"Acme X1"', '"NVIDIA H100 80GB HBM3"')
    pack = load_pack(write_pack(tmp_path, thief, filename="thief.toml"), provider="acme-gpus 1.2")
    catalog = GPUCatalog([reference, pack])
    with pytest.raises(GPUConflictError, match="'NVIDIA H100 80GB HBM3' is claimed by GPU 'H100-SXM'"):
        catalog.get("NVIDIA H100 80GB HBM3")
    assert catalog.get("H100-SXM").name == "H100-SXM"  # the canonical names still resolve


# ------------------------------------------------------------------------------------------------------------ start-up


def test_importing_the_gpu_module_does_not_import_torch_or_numpy() -> None:
    code = "import sys, rpx_core.registry.gpus; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    repo = Path(__file__).resolve().parents[1]
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo).stdout
    assert output.strip() == "[]"
