"""A sweep: the spec's ``[sweep]`` table (:class:`rpx_core.spec.schema.Sweep`), a matrix over models, input shapes, precisions, backends and target machines,
expanded into one job per point.

Each point becomes a job of its own, named from its coordinates (``llama[seq_len=512,precision=bf16]``), so the name
is the same whenever the same spec is expanded and ``rpx run --resume`` keeps every finished point of a sweep. Points
that describe the same work (a value written twice) are one job. Shapes are set on the spec's inputs by rule:

* ``batch_size`` sets each input's ``batch_dim`` (as ``batch_sizes`` does for throughput);
* ``seq_len`` sets dimension 1 of every integer (token id) input with at least two dimensions, ``[batch, seq]``;
* ``resolution`` sets the last two dimensions of every four-dimensional floating-point input, ``[N, C, H, W]``.

A shape axis that no input of a model can take is an error naming the model, never silently ignored. A sweep of more
jobs than its ``max_jobs`` is refused, counted before anything is expanded.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import Any

import attrs

from rpx_core.spec.schema import AXES, FLOAT_DTYPES, InputSpec, ModelSpec, Sweep


@attrs.frozen
class Point:
    """One job of a sweep: the model as it runs there (named after the point, shapes set) and its coordinates."""

    model: ModelSpec
    precision: str
    backend: str
    machine: str | None
    coordinates: dict[str, Any]  # "model" and each swept axis -> its value here


def job_name(model: str, values: dict[str, Any]) -> str:
    """``model[axis=value,...]`` over the swept axes; the model's own name when nothing but models is swept."""
    inner = ",".join(f"{axis}={values[axis]}" for axis in AXES if axis in values)
    return f"{model}[{inner}]" if inner else model


def expand(sweep: Sweep | None, models: Iterable[ModelSpec], precision: str, backend: str) -> list[Point]:
    """Every point of the sweep (one per model without one), in model order then axis order, duplicates dropped."""
    models = list(models)
    if sweep is None:
        return [Point(model, precision, backend, None, {}) for model in models]
    axes = sweep.axes()
    chosen = [model for model in models if not sweep.models or model.name in sweep.models]
    points: dict[str, Point] = {}  # by job name: repeated axis values were dropped, so a name is one job
    for model in chosen:
        for combination in itertools.product(*axes.values()):
            values = dict(zip(axes, combination, strict=True))
            shaped = attrs.evolve(reshape(model, values), name=job_name(model.name, values))
            point = Point(shaped, values.get("precision", precision), values.get("backend", backend),
                          values.get("machine"), {"model": model.name, **values})
            points.setdefault(shaped.name, point)
    return list(points.values())


def reshape(model: ModelSpec, values: dict[str, Any]) -> ModelSpec:
    """``model`` with the point's batch size, sequence length and resolution set on its inputs."""
    inputs = []
    for spec_input in model.inputs:
        shape = list(spec_input.with_batch(values.get("batch_size")).shape)
        if "seq_len" in values and takes_seq_len(spec_input):
            shape[1] = values["seq_len"]
        if "resolution" in values and takes_resolution(spec_input):
            shape[-2:] = [values["resolution"]] * 2
        inputs.append(attrs.evolve(spec_input, shape=tuple(shape)))
    return attrs.evolve(model, inputs=tuple(inputs))


def takes_seq_len(spec_input: InputSpec) -> bool:
    return spec_input.dtype not in FLOAT_DTYPES and spec_input.dtype != "bool" and len(spec_input.shape) >= 2


def takes_resolution(spec_input: InputSpec) -> bool:
    return spec_input.dtype in FLOAT_DTYPES and len(spec_input.shape) == 4


def job_count(sweep: Sweep, models: Iterable[ModelSpec]) -> int:
    """How many jobs :func:`expand` makes, counted without making them."""
    chosen = [model for model in models if not sweep.models or model.name in sweep.models]
    return len(chosen) * math.prod(len(values) for values in sweep.axes().values())


def size_problems(sweep: Sweep, models: list[ModelSpec]) -> list[str]:
    """A sweep over ``max_jobs`` (or a limit that is no count) is refused before anything is expanded."""
    if sweep.max_jobs < 1:
        return [f"sweep.max_jobs: must be >= 1, got {sweep.max_jobs}"]
    count = job_count(sweep, models)
    if count <= sweep.max_jobs:
        return []
    chosen = sum(1 for model in models if not sweep.models or model.name in sweep.models)
    factors = " x ".join([f"{chosen} model(s)", *(f"{len(values)} {axis}" for axis, values in sweep.axes().items())])
    return [f"sweep: {count:,} jobs ({factors}) is more than sweep.max_jobs ({sweep.max_jobs:,}); set [sweep] "
            f"max_jobs = {count} to run them all"]


def sweep_problems(sweep: Sweep, models: Iterable[ModelSpec]) -> list[str]:
    """What is wrong with the ``[sweep]`` table against the spec's models, as ``sweep.key: problem`` lines."""
    models = list(models)
    names = [model.name for model in models]
    problems = [f"sweep.models[{index}]: no [[models]] entry is named {name!r} (models: {', '.join(names)})"
                for index, name in enumerate(sweep.models) if name not in names]
    problems += size_problems(sweep, models)
    chosen = [model for model in models if not sweep.models or model.name in sweep.models]
    rules = {
        "batch_size": ("input with a batch dimension", lambda i: i.batch_dim is not None),
        "seq_len": ("integer (token id) input of shape [batch, seq, ...]", takes_seq_len),
        "resolution": ("floating-point input of shape [N, C, H, W]", takes_resolution),
    }
    for axis, (wanted, fits) in rules.items():
        if not getattr(sweep, axis):
            continue
        for model in chosen:
            if model.input_factory:
                problems.append(f"sweep.{axis}: model {model.name!r} makes its inputs with an input_factory, whose "
                                "shapes a sweep cannot set; give it `inputs` instead")
            elif not any(fits(spec_input) for spec_input in model.inputs):
                problems.append(f"sweep.{axis}: model {model.name!r} has no {wanted} to set")
    return problems
