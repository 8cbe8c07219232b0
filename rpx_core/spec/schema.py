"""The spec: one attrs model of everything a ``spec.toml`` may say, and loading it with key-path errors.

A spec is pure data (import paths, shapes, names), so each model's work can later be shipped to a worker process or
another machine as-is.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import re
import string
import tomllib
from pathlib import Path
from typing import Any, Literal

import attrs

from rpx_core import convert
from rpx_core.convert import NONE_AS, converter, structure
from rpx_core.errors import SpecError
from rpx_core.precision import PrecisionName
from rpx_core.results.safe_write import path_safe
from rpx_core.safe_read import read_text
from rpx_core.spec.limits import Execution

SCHEMA_VERSION = 1
DEFAULT_STAGES = ("count_params", "count_flops", "estimate_traffic", "system_card")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
Dtype = Literal["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"]


def _non_negative_dims(_: Any, attribute: attrs.Attribute, value: tuple[int, ...]) -> None:
    if any(dim < 1 for dim in value):
        raise ValueError(f"every dimension must be >= 1 (a tensor with a zero dimension runs no work), got {list(value)}")


#: How a spec file says an input has no batch dimension (TOML has no null; the Python API takes None).
NO_BATCH_DIM = "none"


def _batch_dim(value: int | str | None) -> int | str | None:
    """``"none"`` is no batch dimension (None); :func:`_batch_dim_index` refuses what is neither."""
    return None if value == NO_BATCH_DIM else value


def _batch_dim_index(_: Any, attribute: attrs.Attribute, value: int | str | None) -> None:
    if isinstance(value, str):
        raise ValueError(f'expected an integer >= 0 (the batch dimension) or "none" (no batch dimension), got '
                         f"{value!r}", attribute)
    if value is not None and value < 0:
        raise ValueError(f'must be >= 0 (dimensions count from 0; "none" for an input without a batch dimension), '
                         f"got {value}", attribute)


@attrs.frozen
class InputSpec:
    """One model input: a tensor of ``shape`` and ``dtype``. Integer inputs (token ids) are drawn from [0, high)."""

    shape: tuple[int, ...] = attrs.field(validator=convert.shape)
    dtype: Dtype = "float32"
    name: str | None = None  # pass as this keyword argument instead of positionally
    high: int | None = None  # exclusive upper bound of integer values (e.g. the vocabulary size)
    #: The dimension batch sizes scale (counted from 0); None (``"none"`` in a spec file) for an input without one.
    #: Read as ``int | str | None`` so the spelling ``"none"`` reaches the converter; an int or None once made.
    batch_dim: int | str | None = attrs.field(default=0, converter=_batch_dim, validator=_batch_dim_index,
                                              metadata={NONE_AS: NO_BATCH_DIM})

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
    #: ``pkg.module:callable(batch_size, device, dtype)`` returning a dict of keyword arguments, a tuple of positional
    #: inputs, (args, kwargs), or one input (rpx_plugins.torch.backend.factory_inputs), for inputs shapes alone
    #: cannot describe.
    input_factory: str | None = None
    #: Build the model only on the meta device: for models too large to materialise. Measured stages then fail clearly.
    meta_only: bool = False
    #: The input shape as the model's source reads it (``hf:``: batch x sequence of token ids); for an import path,
    #: one floating tensor of this shape. Instead of ``inputs``.
    input_shape: tuple[int, ...] | None = attrs.field(default=None, validator=convert.shape)
    #: Configuration overrides for a named model (``hf:``: attributes of its AutoConfig, e.g. num_hidden_layers).
    config: dict[str, Any] = attrs.Factory(dict)
    #: Free text kept with the model's results (what it is, where it is served, caveats).
    notes: str | None = None

    def batch_size(self, override: int | None = None) -> int | None:
        """The batch size inputs are made at: ``override`` when some input has a batch dimension, 1 for an
        input_factory (asked for 1 by default), else the batch dimension of the first input that has one, as
        written; None when no input has a batch dimension."""
        if self.input_factory:
            return override or 1
        for spec_input in self.inputs:
            if spec_input.batch_dim is not None:
                return override or spec_input.shape[spec_input.batch_dim]
        if self.input_shape and not self.inputs:  # not yet resolved into inputs (rpx_core.registry.sources.resolve_inputs)
            return override or self.input_shape[0]
        return None

    #: Items this stage emits per input frame (a detector's detections); used by batch_search to compare in frames.
    fan_out: float = 1.0


#: A sweep's axes, in the order they appear in job names and coordinates (rpx_core.spec.sweep).
AXES = ("batch_size", "seq_len", "resolution", "precision", "backend", "machine")


@attrs.frozen
class Sweep:
    """The ``[sweep]`` table (expanded by rpx_core.spec.sweep). An axis left out takes the spec's own value; every axis
    given multiplies the jobs."""

    models: tuple[str, ...] = ()  # names of the [[models]] entries the sweep runs; default: every model
    batch_size: tuple[int, ...] = attrs.field(default=(), validator=convert.batch_sizes)
    seq_len: tuple[int, ...] = attrs.field(default=(), validator=convert.batch_sizes)
    resolution: tuple[int, ...] = attrs.field(default=(), validator=convert.batch_sizes)
    precision: tuple[PrecisionName, ...] = ()
    backend: tuple[str, ...] = ()
    #: GPU models the measured stages run on (a cluster executor places each job on a node with that GPU).
    machine: tuple[str, ...] = ()
    #: The most jobs the sweep may expand to: a bigger one is refused before it is expanded (a typo of an extra
    #: axis value multiplies a run), unless the spec raises this.
    max_jobs: int = 10_000

    def axes(self) -> dict[str, tuple[Any, ...]]:
        """The axes given, in :data:`AXES` order, each without repeated values."""
        return {axis: tuple(dict.fromkeys(getattr(self, axis))) for axis in AXES if getattr(self, axis)}


@attrs.frozen
class Choices:
    """Resolve name clashes between plugins: which provider's backend, GPU, stage or model source to use."""

    backends: dict[str, str] = attrs.Factory(dict)  # backend name -> plugin name
    gpus: dict[str, str] = attrs.Factory(dict)  # GPU name -> pack name
    stages: dict[str, str] = attrs.Factory(dict)  # stage name -> plugin name
    sources: dict[str, str] = attrs.Factory(dict)  # model source scheme -> plugin name


@attrs.frozen
class Spec:
    """A whole ``spec.toml``. Relative model files and GPU packs are resolved against the spec file's folder."""

    models: tuple[ModelSpec, ...]
    name: str = "rpx"
    stages: tuple[str, ...] = DEFAULT_STAGES
    backend: str = "cpu"
    device: str | None = None  # e.g. "cuda:1"; default: the backend's default device
    precision: PrecisionName = "fp32"
    #: Throughput is measured at each; latency always at batch 1.
    batch_sizes: tuple[int, ...] = attrs.field(default=(1,), validator=convert.each(
        convert.dimension_problem, at_least_one="at least one batch size is required"))
    gpus: tuple[str, ...] = ()  # GPU names to compute rooflines for; ["all"] for every known GPU
    gpu_packs: tuple[str, ...] = ()  # extra GPU pack TOML files
    #: Results file, relative to the working directory; ``{name}`` is the spec name; the suffix picks TOML or JSON.
    output: str = "rpx-results/{name}.toml"
    options: dict[str, dict[str, Any]] = attrs.Factory(dict)  # per-stage options, checked against the stage's options
    choose: Choices = attrs.Factory(Choices)
    on_unavailable: Literal["error", "skip"] = "error"  # what to do when the backend is not available here
    execution: Execution = attrs.Factory(Execution)  # worker processes and time limits (rpx_core.spec.limits)
    sweep: Sweep | None = None  # a matrix of jobs over models, shapes, precisions, backends, machines (rpx_core.spec.sweep)
    schema: int = SCHEMA_VERSION
    base_dir: str = "."  # set by load_spec; not read from the file
    #: True when the spec names no backend (set by spec_from_dict, not read from the file): ``run_spec`` then infers
    #: the backend from the first model (rpx_core.registry.adapters), falling back to ``backend``'s default.
    backend_inferred: bool = False

    def output_path(self) -> Path:
        """The results file; the spec's name enters it as one safe path component (``../x`` stays inside)."""
        return Path(fill_output(self.output, path_safe(self.name)))

    def to_data(self) -> dict[str, Any]:
        """The spec as plain data, as rpx understood it (defaults filled in), without where it was read from."""
        data = converter.unstructure(self)
        del data["base_dir"], data["backend_inferred"]
        return data

    def with_execution(self, overrides: dict[str, Any] | None, where: str = "<spec>") -> Spec:
        """This spec with keys of its ``[execution]`` table replaced (``rpx run --executor``, ``--stage-timeout``)."""
        if not overrides:
            return self
        table = {**converter.unstructure(self.execution), **overrides}
        return attrs.evolve(self, execution=structure(table, Execution, where=where, base_path="execution"))

    def digest(self) -> str:
        """A stable hash of the spec's content (independent of its location), recorded with every result."""
        return hashlib.sha256(json.dumps(self.to_data(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; raise SpecError with ``file: key.path: problem`` lines."""
    path = Path(path)
    return spec_from_dict(read_spec_data(path), where=str(path), base_dir=str(path.parent), default_name=path.stem)


def read_spec_data(path: Path) -> dict[str, Any]:
    """The spec file's TOML document; SpecError (one line) when it cannot be read or parsed."""
    try:
        return tomllib.loads(read_text(path))
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise SpecError(f"{path}: not valid TOML: nested too deeply") from None


def output_template_problem(template: str) -> str | None:
    """Why ``output`` is no template rpx fills: its one field is ``{name}``, filled as plain text (no attribute,
    index, conversion or format of it: ``{name.__class__}`` is refused, never evaluated); ``{{``/``}}`` are braces."""
    braces = "write {{ and }} for a literal brace"
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"{template!r} is not a valid template: {exc} ({braces})"
    for _, field, format_spec, conversion in parts:
        if field is not None and (field != "name" or format_spec or conversion):
            written = field + (f"!{conversion}" if conversion else "") + (f":{format_spec}" if format_spec else "")
            return (f"{template!r} is not a valid template: {{{written}}} is not a field rpx fills; only {{name}} is "
                    f"({braces})")
    return None


def fill_output(template: str, name: str) -> str:
    """``template`` with each ``{name}`` replaced by ``name`` as it is; SpecError for anything else in braces."""
    problem = output_template_problem(template)
    if problem:
        raise SpecError(f"output: {problem}")
    parts = string.Formatter().parse(template)
    return "".join(literal + (name if field is not None else "") for literal, field, _, _ in parts)


def spec_from_dict(data: dict[str, Any], *, where: str = "<spec>", base_dir: str = ".", default_name: str = "rpx") -> Spec:
    spec, problems = structure_spec(data, where=where, base_dir=base_dir, default_name=default_name)
    if problems:
        raise SpecError("\n".join(problems))
    assert spec is not None
    return spec


def structure_spec(data: dict[str, Any], *, where: str = "<spec>", base_dir: str = ".",
                   default_name: str = "rpx") -> tuple[Spec | None, list[str]]:
    """The spec and every problem found in it, as ``file: key.path: problem`` lines. A key whose value is wrong is
    reported, then set aside (a model with an error is dropped) so the rest is still checked: one run of
    ``rpx validate`` lists every mistake. The spec is None only when nothing could be made of it."""
    problems = [f"{where}: {line}" for line in nul_problems(data)]
    set_by_rpx = {"base_dir": "it is set from the spec's location", "backend_inferred": "rpx sets it"}
    problems.extend(f"{where}: {key}: unknown key {key!r} ({why})" for key, why in set_by_rpx.items() if key in data)
    data = {"name": default_name, **{key: value for key, value in data.items() if key not in set_by_rpx},
            "base_dir": base_dir, "backend_inferred": "backend" not in data}
    spec = None
    for _ in range(3):  # each round sets aside what the last one found wrong
        try:
            spec = structure(data, Spec, where=where)
            break
        except SpecError as exc:
            lines = str(exc).splitlines()
            problems.extend(line for line in lines if line not in problems)
            data = _set_aside(data, [line.removeprefix(f"{where}: ") for line in lines])
    if spec is None:
        return None, problems
    semantic = _check_semantics(spec, where)
    if any(line.startswith(f"{where}: models") for line in problems):  # models set aside: "no models" says nothing new
        semantic = [line for line in semantic if not line.endswith("at least one [[models]] entry is required")]
    return spec, problems + semantic


def _set_aside(data: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """``data`` without the values at ``paths``' first keys (for ``models[i]...``: without model i)."""
    data = dict(data)
    bad_models = set()
    for line in paths:
        path, _, rest = line.partition(": ")
        top = path.partition(".")[0]
        key, _, index = top.partition("[")
        if key == "models" and index.rstrip("]").isdigit():
            bad_models.add(int(index.rstrip("]")))
        elif key in data and key not in ("base_dir", "name", "backend_inferred"):
            del data[key]
        elif key == "<top>":
            for unknown in re.findall(r"unknown key '([^']*)'", rest or path):
                data.pop(unknown, None)
    if bad_models and isinstance(data.get("models"), list):
        data["models"] = [model for index, model in enumerate(data["models"]) if index not in bad_models]
    elif any(path.startswith("models") for path in paths):
        data.pop("models", None)
        data["models"] = []
    return data


def _key(key: Any) -> str:
    """A key as a key-path part: as written when printable, else quoted (a path stays on one line)."""
    text = str(key)
    return text if text.isprintable() and text else repr(text)


def nul_problems(data: Any, path: str = "") -> list[str]:
    """A NUL character is in no valid name, path or import path (and makes the OS refuse a path): say where."""
    if isinstance(data, dict):
        return [line for key, value in data.items() for line in
                ([f"{path or '<top>'}: key {key!r} contains a NUL character"] if "\0" in str(key) else [])
                + nul_problems(value, f"{path}.{_key(key)}" if path else _key(key))]
    if isinstance(data, list):
        return [line for index, value in enumerate(data) for line in nul_problems(value, f"{path}[{index}]")]
    if isinstance(data, str) and "\0" in data:
        return [f"{path}: contains a NUL character"]
    return []


def _check_semantics(spec: Spec, where: str) -> list[str]:
    problems: list[str] = []
    if not spec.stages:
        problems.append("stages: at least one stage is required (names from `rpx plugins`; omit the key for the "
                        f"default: {', '.join(DEFAULT_STAGES)})")
    if spec.schema != SCHEMA_VERSION:
        problems.append(f"schema: this rpx reads schema {SCHEMA_VERSION}, the spec says {spec.schema}")
    if not spec.models:
        problems.append("models: at least one [[models]] entry is required")
    names = [model.name for model in spec.models]
    for index, model in enumerate(spec.models):
        if names.count(model.name) > 1:
            problems.append(f"models[{index}].name: {model.name!r} is used by more than one model")
        if ":" not in model.source:
            problems.append(f"models[{index}].source: expected 'package.module:callable', 'file.py:callable' or a "
                            "named model such as 'hf:gpt2'")
        given = [key for key in ("inputs", "input_shape", "input_factory") if getattr(model, key)]
        if not given:
            problems.append(f"models[{index}]: give inputs (shapes and dtypes), an input_shape or an input_factory")
        elif len(given) > 1:
            made = " (the factory makes every input)" if "input_factory" in given else ""
            problems.append(f"models[{index}]: give {' or '.join(given)}, not both{made}")
        input_names = [spec_input.name for spec_input in model.inputs if spec_input.name is not None]
        for position, spec_input in enumerate(model.inputs):
            if spec_input.batch_dim is not None and spec_input.batch_dim >= len(spec_input.shape):
                problems.append(f"models[{index}].inputs[{position}].batch_dim: out of range for shape {list(spec_input.shape)}")
            if spec_input.name is None:
                continue
            if not spec_input.name.isidentifier() or keyword.iskeyword(spec_input.name):
                problems.append(f"models[{index}].inputs[{position}].name: {spec_input.name!r} is not a keyword "
                                "argument name (a Python identifier)")
            elif input_names.count(spec_input.name) > 1:
                problems.append(f"models[{index}].inputs[{position}].name: {spec_input.name!r} names more than one input")
    template = output_template_problem(spec.output)
    if template:
        problems.append(f"output: {template}")
    if spec.execution.stage_timeout > spec.execution.job_timeout:
        problems.append(f"execution.stage_timeout: {spec.execution.stage_timeout:g} s is longer than the job_timeout "
                        f"({spec.execution.job_timeout:g} s) that bounds all of a job's stages")
    return [f"{where}: {problem}" for problem in problems]
