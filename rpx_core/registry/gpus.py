"""GPU spec packs: the peak FLOP/s and bandwidth a roofline divides by, loaded from TOML and merged into a catalogue.

Figures are data, not code: a pack is a TOML file a plugin can ship, and every entry names its source. Peaks are dense
and per precision, so an fp16 model is never divided by the fp32 vector peak: asking for a precision a GPU has no
figure for is an error here, never a silent fallback to another precision.

Imported by ``rpx gpus`` at start-up, so it must stay free of torch and numpy.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import attrs
import cattrs

from rpx_core.convert import converter, describe_errors
from rpx_core.errors import RpxError, UnsupportedError, closest, did_you_mean
from rpx_core.precision import PrecisionName, check_precision
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


#: The largest figure a pack may give (TFLOP/s, GB/s, GB): a million times today's largest parts; above it, the unit
#: is wrong (a figure in FLOP/s where TFLOP/s belong), and a bound divided by it would round to zero.
MAX_FIGURE = 1e6


def _figure(_: Any, attribute: attrs.Attribute, value: float | None) -> None:
    """A pack's figure is above 0 and at most MAX_FIGURE (the converter already refuses nan, inf and strings)."""
    if value is None:
        return
    if not value > 0:
        raise ValueError(f"must be greater than 0, got {value:g}")
    if value > MAX_FIGURE:
        raise ValueError(f"must be at most {MAX_FIGURE:g}, got {value:g}; is the unit right (TFLOP/s, GB/s, GB)?")


def _sparse(instance: Any, attribute: attrs.Attribute, value: float | None) -> None:
    _figure(instance, attribute, value)
    dense = getattr(instance, "tflops", None)  # absent when it was refused itself
    if value is not None and isinstance(dense, float) and value < dense:
        raise ValueError("smaller than the dense tflops; the dense figure goes in tflops")


def _note(instance: Any, attribute: attrs.Attribute, value: str | None) -> None:
    if instance.estimate and not value:
        raise ValueError("an estimate needs a note saying how it was obtained")


def _segment(_: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in SEGMENTS:
        raise ValueError(f"unknown segment {value!r}{did_you_mean(value, SEGMENTS)}")


@attrs.frozen
class Peak:
    """One precision's vendor peak, dense, at boost clock. Dense because 2:4 sparsity needs pruned weights."""

    tflops: float = attrs.field(validator=_figure)  # dense peak in 1e12 FLOP/s (int8: 1e12 integer op/s, i.e. TOPS)
    sparse_tflops: float | None = attrs.field(default=None, validator=_sparse)  # the datasheet's 2:4-sparsity headline, same unit; shown, never used by default
    estimate: bool = False  # true when the figure is derived or uncertain; `note` then says how it was obtained
    note: str | None = attrs.field(default=None, validator=_note)  # derivation, accumulate precision or other caveat


@attrs.frozen
class GPUSpec:
    """One GPU's memory and peaks, as a pack states them."""

    name: str  # canonical name, e.g. "H100-SXM"
    vendor: str  # e.g. "NVIDIA"
    segment: str = attrs.field(validator=_segment)  # one of SEGMENTS
    #: The vendor's nominal capacity read as GB = 1e9 bytes. Vendors' "80 GB" is often 80 GiB, so this understates the
    #: physical capacity by up to 7%, which roughly absorbs the runtime's own reservation: a conservative fit test.
    memory_gb: float = attrs.field(validator=_figure)
    memory_type: str  # e.g. "HBM3", "GDDR6X", "LPDDR5 (unified, shared with the CPU)"
    bandwidth_gb_s: float = attrs.field(validator=_figure)  # peak DRAM bandwidth in GB/s, 1 GB = 1e9 bytes
    #: Precision -> dense peak. fp32 is the vector (non-tensor-core) rate; tf32, fp16, bf16, fp8 and int8 are
    #: tensor/matrix-core rates; int8 figures are integer op/s (TOPS) in the same field.
    peaks: dict[PrecisionName, Peak]
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


#: The top-level keys of a pack file.
_PACK_KEYS = ("pack", "gpu")


def load_pack(path: Path | Traversable, *, provider: str) -> GPUPack:
    """Load and check one pack file; ``provider`` names the distribution that ships it, e.g. "rpx 0.1.0".

    Raises GPUPackError with one line per problem, every problem of the file at once: ``file:
    gpu[3].peaks.fp16.tflops: expected a number`` (gpu indices count from 0, in file order).
    """
    where = str(path)
    try:
        data = tomllib.loads(read_text(path) if isinstance(path, Path) else path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise GPUPackError(f"{where}: cannot read the pack: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GPUPackError(f"{where}: invalid TOML: {exc}") from exc
    problems: list[str] = [f"{key}: unknown key {key!r}{did_you_mean(key, _PACK_KEYS)}" for key in data
                           if key not in _PACK_KEYS]
    header = _structured(data.get("pack"), _PackHeader, "pack", problems)
    entries = data.get("gpu")
    if not isinstance(entries, list) or not entries:
        problems.append("gpu: a pack needs at least one [[gpu]] entry")
        entries = []
    specs: list[tuple[int, GPUSpec]] = []
    for index, entry in enumerate(entries):
        if isinstance(entry, dict) and "pack" in entry:  # set by the loader: a file's own would be overwritten
            problems.append(f"gpu[{index}]: unknown key 'pack'; the pack is named by its [pack] table")
            continue
        spec = _structured(entry, GPUSpec, f"gpu[{index}]", problems)
        if spec is not None:
            specs.append((index, spec))
    problems += _entry_problems(specs)
    if problems or header is None:
        raise GPUPackError("\n".join(f"{where}: {problem}" for problem in problems))
    pack = GPUPack(name=header.name, version=header.version, source=header.source, provider=provider, gpus=(),
                   description=header.description)
    return attrs.evolve(pack, gpus=tuple(attrs.evolve(spec, pack=pack.label) for _, spec in specs))


def _structured(data: Any, cls: type, path: str, problems: list[str]) -> Any:
    """``data`` as ``cls``, or None with its problems added (each entry on its own, so one bad entry hides nothing)."""
    if data is None:
        problems.append(f"{path}: required key is missing")
        return None
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        problems.extend(_dotted(line) for line in describe_errors(exc, path))
        return None


def _dotted(line: str) -> str:
    """cattrs writes dict keys as ``peaks['fp16']``; packs are TOML, so write ``peaks.fp16``."""
    return re.sub(r"\['([^']*)'\]", r".\1", line)


def _entry_problems(specs: list[tuple[int, GPUSpec]]) -> list[str]:
    """Checks across entries: a peak at least, and names and aliases used once in the pack."""
    problems = []
    first_use: dict[str, str] = {}
    for index, spec in specs:
        where = f"gpu[{index}]"
        if not spec.peaks:
            problems.append(f"{where}.peaks: no peaks; give at least one precision's dense figure")
        for name in (spec.name, *spec.aliases):
            previous = first_use.setdefault(_normalise(name), where)
            if previous != where:
                problems.append(f"{where}: name {name!r} is already used by {previous}")
    return problems


# ----------------------------------------------------------------------------------------------------------- catalogue


class GPUCatalog:
    """All GPUs of several packs, looked up by name or alias.

    Two packs defining one GPU (or two GPUs claiming one name) is an error where that name is used, because results
    would otherwise depend on plugin load order; ``choose`` (GPU name -> pack name) settles it. Other names, and
    commands that use none of the clashing ones, are unaffected.
    """

    def __init__(self, packs: Iterable[GPUPack], choose: Mapping[str, str] | None = None,
                 problems: Iterable[str] = ()) -> None:
        self.packs = tuple(packs)
        definitions: dict[str, list[tuple[GPUPack, GPUSpec]]] = {}
        for pack in self.packs:
            for spec in pack.gpus:
                definitions.setdefault(_normalise(spec.name), []).append((pack, spec))
        #: What is wrong with the packs this catalogue was asked to load (left out of it) and with ``choose``, one
        #: line each; the catalogue holds every GPU that loaded.
        self.problems = list(problems)
        choices = self._choices(choose or {}, definitions)
        resolved: list[tuple[GPUPack, GPUSpec]] = []
        #: Normalised name -> why it cannot be used, for names several packs define without a choice.
        self._conflicts: dict[str, str] = {}
        #: Normalised name -> every definition of it, for listings that show a clash with both providers.
        self._clashing: dict[str, list[tuple[GPUPack, GPUSpec]]] = {}
        for key, defs in definitions.items():
            try:
                resolved.append(_resolve(defs, choices.get(key)))
            except GPUConflictError as exc:
                self._conflicts[key] = str(exc)
                self._clashing[key] = defs
        self._specs = tuple(spec for _, spec in resolved)
        self._pack_of = {spec.name: pack for pack, spec in resolved}
        self._index = _index_by_name(self._specs, self._conflicts)

    def _choices(self, choose: Mapping[str, str],
                 definitions: dict[str, list[tuple[GPUPack, GPUSpec]]]) -> dict[str, tuple[str, str]]:
        """``[choose.gpus]`` by the normalised canonical name of the GPU each entry names (by name or alias); an entry
        naming no GPU is a problem line."""
        canonical = {_normalise(name): key for key, defs in definitions.items()
                     for _, spec in defs for name in (spec.name, *spec.aliases)}
        choices = {}
        for name, pack in choose.items():
            key = canonical.get(_normalise(name))
            if key is None:
                known = [defs[0][1].name for defs in definitions.values()]
                self.problems.append(f"choose.gpus.{name}: no pack defines GPU {name!r}{did_you_mean(name, known)}")
            else:
                choices[key] = (name, pack)
        return choices

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

    def clashing(self, name: str | None = None) -> list[tuple[GPUPack, GPUSpec]]:
        """Every definition of the GPUs several packs define without a choice, for listings that show the clash
        with both providers; with ``name``, those it can mean, as :meth:`matching` reads a name."""
        key = _normalise(name or "")
        names = {clash: {_normalise(n) for _, spec in defs for n in (spec.name, *spec.aliases)}
                 for clash, defs in self._clashing.items()}
        chosen = [clash for clash, known in names.items() if key in known]
        if not chosen and key:
            chosen = [clash for clash, known in names.items() if any(n.startswith(key) for n in known)]
        return [definition for clash in (chosen if name else names) for definition in self._clashing[clash]]

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

    def clash_of(self, name: str) -> str | None:
        """Why the GPU called ``name`` cannot be used as it is (several packs define it), or None."""
        return self._conflicts.get(_normalise(name))

    def described(self, name: str) -> list[tuple[GPUPack, GPUSpec]]:
        """Every definition ``name`` can mean, for showing in full: the GPUs :meth:`matching` finds, and each
        definition of a clashing GPU it names."""
        return [(self.pack_of(spec), spec) for spec in self.matching(name)] + self.clashing(name)

    def pack_of(self, gpu: GPUSpec) -> GPUPack:
        """The pack whose definition of ``gpu`` the catalogue uses."""
        return self._pack_of[gpu.name]

    def _suggestions(self, name: str) -> list[str]:
        close_keys = closest(_normalise(name), self._index, n=5, cutoff=0.5)
        close = list(dict.fromkeys(self._index[key].name for key in close_keys))
        return close + sorted(spec.name for spec in self._specs if spec.name not in close)


def peak_data(peak: Peak) -> dict[str, Any]:
    """One precision's figure as data: the dense ``tflops`` (int8: TOPS), whether it is ``derived`` (an estimate,
    ``note`` says how it was obtained), the ``note`` and the 2:4-sparse headline, each None when the pack has none."""
    return {"tflops": peak.tflops, "derived": peak.estimate, "note": peak.note, "sparse_tflops": peak.sparse_tflops}


def gpu_rows(catalog: GPUCatalog) -> list[dict[str, Any]]:
    """One row per GPU for ``rpx gpus``: memory, bandwidth and, per precision, :func:`peak_data`; a GPU several packs
    define without a choice has a row per pack, each with ``clash`` saying so (None for the others)."""
    definitions = [(catalog.pack_of(spec), spec) for spec in catalog.usable()] + catalog.clashing()
    return [
        {
            "name": spec.name,
            "vendor": spec.vendor,
            "segment": spec.segment,
            "memory_gb": spec.memory_gb,
            "bandwidth_gb_s": spec.bandwidth_gb_s,
            "precisions": {precision: peak_data(peak) for precision, peak in spec.peaks.items()},
            "pack": spec.pack or "",
            "clash": catalog.clash_of(spec.name),
        }
        for _, spec in definitions
    ]


def describe_gpu(gpu: GPUSpec, pack: GPUPack, catalog: GPUCatalog) -> dict[str, Any]:
    """Everything one pack says about one GPU, as plain data for ``rpx gpus NAME`` (absent fields left out; each
    precision as :func:`peak_data`; ``clash`` when another pack defines it too and nothing chose between them)."""
    data = attrs.asdict(gpu, filter=lambda _, value: value is not None)
    data["aliases"] = list(gpu.aliases)
    data["peaks"] = {precision: peak_data(peak) for precision, peak in gpu.peaks.items()}
    return {**data, "pack_version": pack.version, "pack_source": pack.source, "clash": catalog.clash_of(gpu.name)}


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
