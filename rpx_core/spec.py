"""The spec: one attrs model of everything a ``spec.toml`` may say, and loading it with key-path errors.

A spec is pure data (import paths, shapes, names), so each model's work can later be shipped to a worker process or
another machine as-is.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

import attrs

from rpx_core.convert import converter, structure
from rpx_core.errors import SpecError
from rpx_core.precision import PrecisionName

SCHEMA_VERSION = 1
DEFAULT_STAGES = ("count_params", "count_flops", "estimate_traffic", "system_card")
Dtype = Literal["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"]
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def _non_negative_dims(_: Any, attribute: attrs.Attribute, value: tuple[int, ...]) -> None:
    if any(dim < 0 for dim in value):
        raise ValueError(f"dimensions must be >= 0, got {list(value)}")


@attrs.frozen
class InputSpec:
    """One model input: a tensor of ``shape`` and ``dtype``. Integer inputs (token ids) are drawn from [0, high)."""

    shape: tuple[int, ...] = attrs.field(validator=_non_negative_dims)
    dtype: Dtype = "float32"
    name: str | None = None  # pass as this keyword argument instead of positionally
    high: int | None = None  # exclusive upper bound of integer values (e.g. the vocabulary size)
    batch_dim: int | None = 0  # the dimension batch sizes scale; None for inputs without one

    def with_batch(self, batch_size: int | None) -> InputSpec:
        """This input at ``batch_size``; None keeps the shape as written."""
        if self.batch_dim is None or batch_size is None:
            return self
        shape = list(self.shape)
        shape[self.batch_dim] = batch_size
        return attrs.evolve(self, shape=tuple(shape))


@attrs.frozen
class ModelSpec:
    """A model built by calling ``source`` (``pkg.module:callable`` or ``path/to/file.py:callable``) with ``kwargs``."""

    name: str
    source: str
    kwargs: dict[str, Any] = attrs.Factory(dict)
    inputs: tuple[InputSpec, ...] = ()
    #: ``pkg.module:callable(batch_size, device, dtype)`` returning the positional args tuple (or (args, kwargs)),
    #: for inputs shapes alone cannot describe.
    input_factory: str | None = None
    #: Build the model only on the meta device: for models too large to materialise. Measured stages then fail clearly.
    meta_only: bool = False
    def batch_size(self, override: int | None = None) -> int | None:
        """The batch size inputs are made at: ``override`` when some input has a batch dimension, 1 for an
        input_factory (asked for 1 by default), else the batch dimension of the first input that has one, as
        written; None when no input has a batch dimension."""
        if self.input_factory:
            return override or 1
        for spec_input in self.inputs:
            if spec_input.batch_dim is not None:
                return override or spec_input.shape[spec_input.batch_dim]
        return None

    #: Items this stage emits per input frame (a detector's detections); used by batch_search to compare in frames.
    fan_out: float = 1.0


@attrs.frozen
class Choices:
    """Resolve name clashes between plugins: which provider's backend, GPU or stage to use."""

    backends: dict[str, str] = attrs.Factory(dict)  # backend name -> plugin name
    gpus: dict[str, str] = attrs.Factory(dict)  # GPU name -> pack name
    stages: dict[str, str] = attrs.Factory(dict)  # stage name -> plugin name


@attrs.frozen
class Spec:
    """A whole ``spec.toml``. Relative model files and GPU packs are resolved against the spec file's folder."""

    models: tuple[ModelSpec, ...]
    name: str = "rpx"
    stages: tuple[str, ...] = DEFAULT_STAGES
    backend: str = "cpu"
    device: str | None = None  # e.g. "cuda:1"; default: the backend's default device
    precision: PrecisionName = "fp32"
    batch_sizes: tuple[int, ...] = (1,)  # throughput is measured at each; latency always at batch 1
    gpus: tuple[str, ...] = ()  # GPU names to compute rooflines for; ["all"] for every known GPU
    gpu_packs: tuple[str, ...] = ()  # extra GPU pack TOML files
    #: Results file, relative to the working directory; ``{name}`` is the spec name; the suffix picks TOML or JSON.
    output: str = "rpx-results/{name}.toml"
    options: dict[str, dict[str, Any]] = attrs.Factory(dict)  # per-stage options, checked against the stage's options
    choose: Choices = attrs.Factory(Choices)
    on_unavailable: Literal["error", "skip"] = "error"  # what to do when the backend is not available here
    schema: int = SCHEMA_VERSION
    base_dir: str = "."  # set by load_spec; not read from the file
    #: True when the spec names no backend (set by spec_from_dict, not read from the file): ``run_spec`` then infers
    #: the backend from the first model (rpx_core.adapters), falling back to ``backend``'s default.
    backend_inferred: bool = False

    def output_path(self) -> Path:
        return Path(self.output.format(name=self.name))

    def to_data(self) -> dict[str, Any]:
        """The spec as plain data, as rpx understood it (defaults filled in), without where it was read from."""
        data = converter.unstructure(self)
        del data["base_dir"], data["backend_inferred"]
        return data

    def digest(self) -> str:
        """A stable hash of the spec's content (independent of its location), recorded with every result."""
        return hashlib.sha256(json.dumps(self.to_data(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; raise SpecError with ``file: key.path: problem`` lines."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    return spec_from_dict(data, where=str(path), base_dir=str(path.parent), default_name=path.stem)


def spec_from_dict(data: dict[str, Any], *, where: str = "<spec>", base_dir: str = ".", default_name: str = "rpx") -> Spec:
    for key, why in (("base_dir", "it is set from the spec's location"), ("backend_inferred", "rpx sets it")):
        if key in data:
            raise SpecError(f"{where}: {key}: unknown key {key!r} ({why})")
    data = {"name": default_name, **data, "base_dir": base_dir, "backend_inferred": "backend" not in data}
    spec: Spec = structure(data, Spec, where=where)
    _check_semantics(spec, where)
    return spec


def _check_semantics(spec: Spec, where: str) -> None:
    problems: list[str] = []
    if spec.schema != SCHEMA_VERSION:
        problems.append(f"schema: this rpx reads schema {SCHEMA_VERSION}, the spec says {spec.schema}")
    if not spec.models:
        problems.append("models: at least one [[models]] entry is required")
    names = [model.name for model in spec.models]
    for index, model in enumerate(spec.models):
        if names.count(model.name) > 1:
            problems.append(f"models[{index}].name: {model.name!r} is used by more than one model")
        if ":" not in model.source:
            problems.append(f"models[{index}].source: expected 'package.module:callable' or 'file.py:callable'")
        if not model.inputs and not model.input_factory:
            problems.append(f"models[{index}]: give inputs (shapes and dtypes) or an input_factory")
        for position, spec_input in enumerate(model.inputs):
            if spec_input.batch_dim is not None and spec_input.batch_dim >= len(spec_input.shape):
                problems.append(f"models[{index}].inputs[{position}].batch_dim: out of range for shape {list(spec_input.shape)}")
    try:
        spec.output.format(name=spec.name)
    except (KeyError, IndexError, ValueError) as exc:
        problems.append(f"output: {spec.output!r} is not a valid template (only {{name}} is filled in): {exc!r}")
    if any(size < 1 for size in spec.batch_sizes):
        problems.append("batch_sizes: every batch size must be >= 1")
    if problems:
        raise SpecError("\n".join(f"{where}: {problem}" for problem in problems))
