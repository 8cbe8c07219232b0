"""GPU spec packs: the peak FLOP/s and bandwidth a roofline divides by, loaded from TOML and merged into a catalogue.

Figures are data, not code: a pack is a TOML file a plugin can ship, and every entry names its source. Peaks are dense
and per precision, so an fp16 model is never divided by the fp32 vector peak: asking for a precision a GPU has no
figure for is an error here, never a silent fallback to another precision.

Imported by ``rpx gpus`` at start-up, so it must stay free of torch and numpy.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import attrs
import cattrs

from rpx_core.convert import describe_errors, make_converter
from rpx_core.errors import RpxError, UnsupportedError, did_you_mean
from rpx_core.precision import PRECISIONS, check_precision
from rpx_core.safe_read import read_text

#: Market segments a pack entry can declare.
SEGMENTS = ("datacenter", "workstation", "consumer", "edge", "soc", "mobile")


class GPUPackError(RpxError):
    """A GPU pack file is unreadable or invalid; the message names the file and the key path of each problem."""


class GPUConflictError(GPUPackError):
    """Two packs define the same GPU (or name); the message names both packs and how to choose between them."""


class UnknownGPUError(RpxError):
    """No GPU in the catalogue has this name or alias; the message lists the closest names first."""


class AmbiguousGPUError(UnknownGPUError):
    """A name that is no GPU's name or alias begins several of them; the message lists the GPUs it could mean."""


class MissingPeakError(UnsupportedError):
    """The GPU's pack has no peak for this precision; rpx never substitutes another precision's peak."""


@attrs.frozen
class Peak:
    """One precision's vendor peak, dense, at boost clock. Dense because 2:4 sparsity needs pruned weights."""

    tflops: float  # dense peak in 1e12 FLOP/s (int8: 1e12 integer op/s, i.e. TOPS)
    sparse_tflops: float | None = None  # the datasheet's 2:4-sparsity headline, same unit; shown, never used by default
    estimate: bool = False  # true when the figure is derived or uncertain; `note` then says how it was obtained
    note: str | None = None  # derivation, accumulate precision or other caveat


@attrs.frozen
class GPUSpec:
    """One GPU's memory and peaks, as a pack states them."""

    name: str  # canonical name, e.g. "H100-SXM"
    vendor: str  # e.g. "NVIDIA"
    segment: str  # one of SEGMENTS
    #: The vendor's nominal capacity read as GB = 1e9 bytes. Vendors' "80 GB" is often 80 GiB, so this understates the
    #: physical capacity by up to 7%, which roughly absorbs the runtime's own reservation: a conservative fit test.
    memory_gb: float
    memory_type: str  # e.g. "HBM3", "GDDR6X", "LPDDR5 (unified, shared with the CPU)"
    bandwidth_gb_s: float  # peak DRAM bandwidth in GB/s, 1 GB = 1e9 bytes
    #: Precision -> dense peak. fp32 is the vector (non-tensor-core) rate; tf32, fp16, bf16, fp8 and int8 are
    #: tensor/matrix-core rates; int8 figures are integer op/s (TOPS) in the same field.
    peaks: dict[str, Peak]
    source: str  # the datasheet or page the figures come from (title and/or URL)
    aliases: tuple[str, ...] = ()  # other names, including what torch.cuda.get_device_name() reports
    notes: str | None = None  # caveats that apply to the whole entry (power mode, shared memory, ...)
    pack: str | None = None  # the pack that defined it, "name (provider)"; set by load_pack, not written in the file

    def matches(self, device_name: str) -> bool:
        """Whether ``device_name`` ("NVIDIA H100 80GB HBM3") is this GPU's name or alias, case and punctuation aside."""
        return _normalise(device_name) in {_normalise(name) for name in (self.name, *self.aliases)}

    def peak(self, precision: str) -> Peak:
        """The dense peak for ``precision``; raises MissingPeakError rather than falling back to another precision."""
        check_precision(precision)
        if precision not in self.peaks:
            raise MissingPeakError(
                f"GPU {self.name!r} has no {precision} peak in pack {self.pack or '(none)'}; it has: "
                f"{', '.join(self.peaks)}. rpx never substitutes another precision's peak."
            )
        return self.peaks[precision]

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s (op/s for int8) for ``precision``."""
        return self.peak(precision).tflops * 1e12

    @property
    def bandwidth_bytes_s(self) -> float:
        """Peak DRAM bandwidth in bytes/s."""
        return self.bandwidth_gb_s * 1e9

    @property
    def memory_bytes(self) -> int:
        """Nominal capacity in bytes (memory_gb x 1e9)."""
        return round(self.memory_gb * 1e9)


@attrs.frozen
class GPUPack:
    """A loaded pack file: its header, the distribution that ships it, and its GPUs."""

    name: str  # pack name from the [pack] table, e.g. "reference"
    version: str  # pack version from the [pack] table
    source: str  # where the pack's figures come from, overall
    provider: str  # the distribution that ships the pack and its version, e.g. "rpx 0.1.0"
    gpus: tuple[GPUSpec, ...]
    description: str | None = None

    @property
    def label(self) -> str:
        """How messages and results name the pack: "reference (rpx 0.1.0)"."""
        return f"{self.name} ({self.provider})"


# --------------------------------------------------------------------------------------------------------- pack loading


@attrs.frozen
class _PackHeader:
    """The [pack] table."""

    name: str
    version: str
    source: str
    description: str | None = None


@attrs.frozen
class _PackFile:
    """A whole pack file: one [pack] table and the [[gpu]] entries."""

    pack: _PackHeader
    gpu: list[GPUSpec]


def load_pack(path: Path | Traversable, *, provider: str) -> GPUPack:
    """Load and check one pack file; ``provider`` names the distribution that ships it, e.g. "rpx 0.1.0".

    Raises GPUPackError with one line per problem: ``file: gpu[3].peaks.fp16.tflops: expected a number`` (gpu indices
    count from 0, in file order).
    """
    where = str(path)
    try:
        data = tomllib.loads(read_text(path) if isinstance(path, Path) else path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise GPUPackError(f"{where}: cannot read the pack: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise GPUPackError(f"{where}: invalid TOML: {exc}") from exc
    try:
        parsed = _PACK_CONVERTER.structure(data, _PackFile)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise GPUPackError("\n".join(f"{where}: {_dotted(line)}" for line in describe_errors(exc))) from exc
    problems = [*_loader_only_keys(data), *_entry_problems(parsed.gpu)]
    if problems:
        raise GPUPackError("\n".join(f"{where}: {problem}" for problem in problems))
    header = parsed.pack
    pack = GPUPack(
        name=header.name,
        version=header.version,
        source=header.source,
        provider=provider,
        gpus=(),
        description=header.description,
    )
    return attrs.evolve(pack, gpus=tuple(attrs.evolve(spec, pack=pack.label) for spec in parsed.gpu))


def _strict(kind: type, description: str, accepts: tuple[type, ...]) -> Callable[[Any, type], Any]:
    """A structure hook that refuses conversions cattrs would otherwise make ("1.5" -> 1.5, 1 -> "1", "no" -> True)."""

    def hook(value: Any, _: type) -> Any:
        if not isinstance(value, accepts) or (isinstance(value, bool) and kind is not bool):
            raise TypeError(f"expected {description}, got {type(value).__name__} {value!r}")
        return kind(value)

    return hook


def _pack_converter() -> cattrs.Converter:
    """The project's converter, made strict: packs are typed by hand, so a quoted number is a mistake to report."""
    converter = make_converter()
    converter.register_structure_hook(float, _strict(float, "a number", (int, float)))
    converter.register_structure_hook(str, _strict(str, "a string", (str,)))
    converter.register_structure_hook(bool, _strict(bool, "true or false", (bool,)))
    return converter


_PACK_CONVERTER = _pack_converter()


def _dotted(line: str) -> str:
    """cattrs writes dict keys as ``peaks['fp16']``; packs are TOML, so write ``peaks.fp16``."""
    return re.sub(r"\['([^']*)'\]", r".\1", line)


def _loader_only_keys(data: dict[str, Any]) -> list[str]:
    """`pack` is filled in by the loader; a file that sets it per GPU would be silently overwritten, so refuse it."""
    return [
        f"gpu[{index}]: unknown key 'pack'; the pack is named by its [pack] table"
        for index, entry in enumerate(data["gpu"])
        if "pack" in entry
    ]


def _entry_problems(specs: list[GPUSpec]) -> list[str]:
    """Checks the type system cannot express: positive figures, known precisions and segments, unique names."""
    problems = [] if specs else ["gpu: a pack needs at least one [[gpu]] entry"]
    first_use: dict[str, str] = {}
    for index, spec in enumerate(specs):
        where = f"gpu[{index}]"
        problems += _positive(where, memory_gb=spec.memory_gb, bandwidth_gb_s=spec.bandwidth_gb_s)
        if spec.segment not in SEGMENTS:
            problems.append(f"{where}.segment: unknown segment {spec.segment!r}{did_you_mean(spec.segment, SEGMENTS)}")
        if not spec.peaks:
            problems.append(f"{where}.peaks: no peaks; give at least one precision's dense figure")
        for precision, peak in spec.peaks.items():
            problems += _peak_problems(f"{where}.peaks.{precision}", precision, peak)
        for name in (spec.name, *spec.aliases):
            previous = first_use.setdefault(_normalise(name), where)
            if previous != where:
                problems.append(f"{where}: name {name!r} is already used by {previous}")
    return problems


def _peak_problems(where: str, precision: str, peak: Peak) -> list[str]:
    problems = _positive(where, tflops=peak.tflops)
    if precision not in PRECISIONS:
        problems.append(f"{where}: unknown precision {precision!r}{did_you_mean(precision, PRECISIONS)}")
    if peak.sparse_tflops is not None and peak.sparse_tflops < peak.tflops:
        problems.append(f"{where}.sparse_tflops: smaller than the dense tflops; the dense figure goes in tflops")
    if peak.estimate and not peak.note:
        problems.append(f"{where}.note: an estimate needs a note saying how it was obtained")
    return problems


def _positive(where: str, **figures: float) -> list[str]:
    return [f"{where}.{key}: must be greater than 0, got {value}" for key, value in figures.items() if value <= 0]


# ----------------------------------------------------------------------------------------------------------- catalogue


class GPUCatalog:
    """All GPUs of several packs, looked up by name or alias.

    Two packs defining one GPU (or two GPUs claiming one name) is an error where that name is used, because results
    would otherwise depend on plugin load order; ``choose`` (GPU name -> pack name) settles it. Other names, and
    commands that use none of the clashing ones, are unaffected.
    """

    def __init__(self, packs: Iterable[GPUPack], choose: Mapping[str, str] | None = None) -> None:
        self.packs = tuple(packs)
        definitions: dict[str, list[tuple[GPUPack, GPUSpec]]] = {}
        for pack in self.packs:
            for spec in pack.gpus:
                definitions.setdefault(_normalise(spec.name), []).append((pack, spec))
        choices = {_normalise(name): (name, pack) for name, pack in (choose or {}).items()}
        for key, (name, _) in choices.items():
            if key not in definitions:
                known = [defs[0][1].name for defs in definitions.values()]
                raise UnknownGPUError(f"choose: no pack defines GPU {name!r}{did_you_mean(name, known)}")
        resolved: list[tuple[GPUPack, GPUSpec]] = []
        #: Normalised name -> why it cannot be used, for names several packs define without a choice.
        self._conflicts: dict[str, str] = {}
        for key, defs in definitions.items():
            try:
                resolved.append(_resolve(defs, choices.get(key)))
            except GPUConflictError as exc:
                self._conflicts[key] = str(exc)
        self._specs = tuple(spec for _, spec in resolved)
        self._pack_of = {spec.name: pack for pack, spec in resolved}
        self._index = _index_by_name(self._specs, self._conflicts)

    def all(self) -> tuple[GPUSpec, ...]:
        """Every GPU, in pack order then file order; an unsettled clash is an error here, since "all" uses it."""
        if self._conflicts:
            raise GPUConflictError(next(iter(self._conflicts.values())))
        return self._specs

    def usable(self) -> tuple[GPUSpec, ...]:
        """Every GPU whose name is settled (for listings, which show the clashes beside them)."""
        return self._specs

    def conflicts(self) -> list[str]:
        """One line per unsettled clash."""
        return list(dict.fromkeys(self._conflicts.values()))

    def get(self, name: str) -> GPUSpec:
        """The GPU ``name`` means (see :meth:`matching`); AmbiguousGPUError lists the GPUs a prefix could mean,
        UnknownGPUError lists close matches first."""
        key = _normalise(name)
        if key in self._conflicts:
            raise GPUConflictError(self._conflicts[key])
        found = self.matching(name)
        if len(found) > 1:
            raise AmbiguousGPUError(f"GPU {name!r} could mean {', '.join(spec.name for spec in found)}; name one")
        if not found:
            known = self._suggestions(name)
            choices = f"Choose one of: {', '.join(known)}" if known else "No GPU pack is loaded."
            raise UnknownGPUError(f"GPU {name!r} not recognized. {choices}")
        return found[0]

    def matching(self, name: str) -> list[GPUSpec]:
        """The GPUs ``name`` can mean, case and punctuation aside: the one it names (name or alias), else every GPU
        one of whose names or aliases begins with it (``"h100"``: H100-SXM and H100-PCIe), in catalogue order."""
        key = _normalise(name)
        if key in self._index:
            return [self._index[key]]
        if not key:
            return []
        names = {spec.name for index_key, spec in self._index.items() if index_key.startswith(key)}
        return [spec for spec in self._specs if spec.name in names]

    def find_by_device_name(self, device_name: str) -> GPUSpec | None:
        """The GPU a runtime-reported name (torch.cuda.get_device_name()) belongs to, or None if no pack lists it."""
        return self._index.get(_normalise(device_name))

    def pack_of(self, gpu: GPUSpec) -> GPUPack:
        """The pack whose definition of ``gpu`` the catalogue uses."""
        return self._pack_of[gpu.name]

    def _suggestions(self, name: str) -> list[str]:
        close_keys = difflib.get_close_matches(_normalise(name), list(self._index), n=5, cutoff=0.5)
        close = list(dict.fromkeys(self._index[key].name for key in close_keys))
        return close + sorted(spec.name for spec in self._specs if spec.name not in close)


def peak_data(peak: Peak) -> dict[str, Any]:
    """One precision's figure as data: the dense ``tflops`` (int8: TOPS), whether it is ``derived`` (an estimate,
    ``note`` says how it was obtained), the ``note`` and the 2:4-sparse headline, each None when the pack has none."""
    return {"tflops": peak.tflops, "derived": peak.estimate, "note": peak.note, "sparse_tflops": peak.sparse_tflops}


def gpu_rows(catalog: GPUCatalog) -> list[dict[str, Any]]:
    """One row per GPU for ``rpx gpus``: memory, bandwidth and, per precision, :func:`peak_data`."""
    return [
        {
            "name": spec.name,
            "vendor": spec.vendor,
            "segment": spec.segment,
            "memory_gb": spec.memory_gb,
            "bandwidth_gb_s": spec.bandwidth_gb_s,
            "precisions": {precision: peak_data(peak) for precision, peak in spec.peaks.items()},
            "pack": spec.pack or "",
        }
        for spec in catalog.usable()
    ]


def describe_gpu(gpu: GPUSpec, catalog: GPUCatalog) -> dict[str, Any]:
    """Everything the catalogue knows about one GPU, as plain data for ``rpx gpus NAME`` (absent fields left out;
    each precision as :func:`peak_data`)."""
    pack = catalog.pack_of(gpu)
    data = attrs.asdict(gpu, filter=lambda _, value: value is not None)
    data["aliases"] = list(gpu.aliases)
    data["peaks"] = {precision: peak_data(peak) for precision, peak in gpu.peaks.items()}
    return {**data, "pack_version": pack.version, "pack_source": pack.source}


def _resolve(definitions: list[tuple[GPUPack, GPUSpec]], choice: tuple[str, str] | None) -> tuple[GPUPack, GPUSpec]:
    """The one definition of a GPU name: the only one, or the one ``choose`` picks among clashing packs."""
    if choice is None:
        if len(definitions) == 1:
            return definitions[0]
        name = definitions[0][1].name
        labels = " and ".join(f"pack {pack.label}" for pack, _ in definitions)
        first = definitions[0][0]
        example = first.name if sum(pack.name == first.name for pack, _ in definitions) == 1 else first.label
        raise GPUConflictError(
            f'GPU {name!r} is defined by {labels}; pick one under [choose.gpus], e.g. "{name}" = "{example}"'
        )
    name, wanted = choice
    for pack, spec in definitions:
        if wanted in (pack.name, pack.label):
            return pack, spec
    labels = ", ".join(pack.label for pack, _ in definitions)
    raise GPUConflictError(f"choose: GPU {name!r} -> pack {wanted!r}, but only these packs define it: {labels}")


def _index_by_name(specs: Iterable[GPUSpec], conflicts: dict[str, str]) -> dict[str, GPUSpec]:
    """Normalised name and alias -> spec. A name two GPUs claim would make lookups ambiguous: it goes to
    ``conflicts`` (and out of the index) instead."""
    index: dict[str, GPUSpec] = {}
    for spec in specs:
        for name in (spec.name, *spec.aliases):
            key = _normalise(name)
            other = index.setdefault(key, spec)
            if other is not spec:
                conflicts[key] = (f"name {name!r} is claimed by GPU {other.name!r} (pack {other.pack}) "
                                  f"and GPU {spec.name!r} (pack {spec.pack})")
    for key in conflicts:
        index.pop(key, None)
    return index


def _normalise(name: str) -> str:
    """Case- and punctuation-free form, so "NVIDIA A100-SXM4-80GB" and "nvidia a100 sxm4 80gb" compare equal."""
    return re.sub(r"[^0-9a-z]", "", name.casefold())
