"""``rpx gpus`` through the real command: structured JSON per precision, a readable text view with its legend, and
names matched by unique prefix or alias (an ambiguous one lists every GPU it could mean)."""

from __future__ import annotations

import json

from tests.conftest import rpx_cli


def test_json_gives_each_precision_as_figure_derived_and_note() -> None:
    done = rpx_cli("gpus", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    orin = rows["Jetson-AGX-Orin-64GB"]["precisions"]["fp16"]
    assert orin["tflops"] == 42.5 and orin["derived"] is True and orin["note"]
    assert rows["H100-SXM"]["precisions"]["bf16"] == {"tflops": 989.4, "derived": False, "note": None,
                                                      "sparse_tflops": 1978.9}


def test_text_view_has_a_legend_and_no_python_reprs() -> None:
    listed = rpx_cli("gpus")
    assert listed.returncode == 0, listed.stderr
    orin = next(line for line in listed.stdout.splitlines() if line.startswith("Jetson-AGX-Orin-64GB "))
    assert "fp16 42.5~" in orin and "204.8 GB/s" in orin
    assert "~ after a figure: derived or uncertain" in listed.stdout
    one = rpx_cli("gpus", "t4")
    assert one.returncode == 0, one.stderr
    assert "also known as: Tesla T4, NVIDIA T4" in one.stdout
    for text in (listed.stdout, one.stdout):
        assert "('" not in text and "{'" not in text and "None" not in text


def test_an_ambiguous_prefix_lists_the_gpus_it_could_mean_and_an_unknown_name_the_closest() -> None:
    h100 = rpx_cli("gpus", "H100")
    assert h100.returncode == 0, h100.stderr
    assert h100.stdout.startswith("'H100' could mean 2 GPUs:")
    assert "H100-SXM  (NVIDIA, datacenter)" in h100.stdout and "H100-PCIe  (NVIDIA, datacenter)" in h100.stdout
    assert "H200" not in h100.stdout
    as_json = rpx_cli("gpus", "h100", "--json")
    assert [gpu["name"] for gpu in json.loads(as_json.stdout)] == ["H100-SXM", "H100-PCIe"]
    unknown = rpx_cli("gpus", "H1OO-SXM")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("rpx: error: GPU 'H1OO-SXM' not recognized. Choose one of: H100-SXM")
    assert len(unknown.stderr.strip().splitlines()) == 1
