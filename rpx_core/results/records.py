"""The results file's schema: schema-versioned attrs models (a run, its models, each stage's record) and the
check that a stage's result can be written. Each stage's result reloads as the type its declaration names
(``Stage.result``); a stage no loaded plugin declares loads as data."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from rpx_core.convert import converter, describe_errors
from rpx_core.errors import RpxError

SCHEMA_VERSION = 1


#: "interrupted": stopped by SIGINT/SIGTERM (``result`` holds what it finished, if the stage handed it back);
#: ``rpx run --resume`` runs it again. "not_applicable": the stage does not apply to this model (``error`` says why,
#: e.g. a callable rpx cannot look inside is not counted); not a failure, and never shown as a zero.
Status = Literal["ok", "failed", "skipped", "interrupted", "not_applicable"]


#: Statuses a successful run may hold.
SUCCEEDED = ("ok", "not_applicable")


@attrs.frozen
class StageRecord:
    """What happened to one stage: its status, how long it took, its error or skip reason, and its result."""

    status: Status
    seconds: float | None = None  # wall time of the stage
    error: str | None = None  # "ExceptionType: message" for failures, the reason for skips
    traceback: str | None = None  # the failure's traceback, for bug reports
    provided_by: str | None = None  # the plugin whose hook implementation produced the result
    result: Any = None
    stderr_tail: str | None = None  # the last output of a worker that crashed, timed out or exited in this stage
    #: Seconds of setup that happened during this stage ("import": frameworks and the model's module, "build": the
    #: model factory or copy, "place": moving/casting it to the device, "inputs": making the inputs a measured stage
    #: runs, JAX's compilation of their random draws included), excluded from ``seconds``.
    setup: dict[str, float] = attrs.Factory(dict)


StageRecords = dict[str, StageRecord]


@attrs.frozen
class ModelResult:
    """All stage records of one model, plus its flat summary fields for table rows."""

    name: str
    source: str
    backend: str
    device: str
    precision: str
    started: str  # ISO 8601, UTC
    finished: str | None = None
    stages: StageRecords = attrs.Factory(dict)
    #: Flat fields (params_m, flops_g, macs_g, memory_traffic_gb, arithmetic_intensity, actmem_gb_fp16,
    #: latency_p50_ms, ...) that each stage declares (Stage.summary); the built-in ones are defined in rpx_plugins.stages.
    summary: dict[str, float | str] = attrs.Factory(dict)
    #: A sweep's job: "model" (the [[models]] entry) and each swept axis (batch_size, seq_len, resolution, precision,
    #: backend, machine) -> its value, so sweep results read as one table; None outside a sweep.
    coordinates: dict[str, int | str] | None = None
    node: str | None = None  # the cluster node the job ran on (cluster executors); None: this machine
    #: Seconds of setup by phase ("import", "build", "place", "inputs"), summed over the stages during which it happened;
    #: no stage's ``seconds`` includes them.
    setup: dict[str, float] = attrs.Factory(dict)
    notes: str | None = None  # the spec's free-text notes on this model

    @property
    def ok(self) -> bool:
        return all(record.status in SUCCEEDED for record in self.stages.values())

    def result(self, stage: str) -> Any:
        """The result of ``stage``, raising a clear error if it did not succeed."""
        record = self.stages.get(stage)
        if record is None:
            raise KeyError(f"stage {stage!r} did not run for model {self.name!r}")
        if record.status != "ok":
            raise KeyError(f"stage {stage!r} {record.status} for model {self.name!r}: {record.error}")
        return record.result


@attrs.frozen
class PluginInfo:
    """One plugin as loaded for a run (also what ``rpx plugins`` prints)."""

    name: str
    distribution: str
    version: str
    builtin: bool
    status: Literal["loaded", "disabled", "failed", "invalid"]
    hooks: tuple[str, ...] = ()
    error: str | None = None  # why it failed to import or is invalid


@attrs.frozen
class Provenance:
    """What produced a results file, so any figure can be traced back and reproduced."""

    rpx_version: str
    python: str
    created: str  # ISO 8601, UTC
    spec_hash: str
    spec: dict[str, Any]  # the spec as rpx understood it
    spec_path: str | None = None
    command: str | None = None
    finished: str | None = None
    plugins: tuple[PluginInfo, ...] = ()


@attrs.frozen
class RunResult:
    """A whole results file."""

    provenance: Provenance
    schema_version: int = SCHEMA_VERSION
    models: tuple[ModelResult, ...] = ()
    run_stages: StageRecords = attrs.Factory(dict)  # run-scoped stages such as batch_search
    #: The jobs of the run that did not finish (never started, interrupted, lost), by name, in the plan's order:
    #: ``rpx run --resume`` runs them. Written when the run ends, however it ends; None while it runs (or when rpx
    #: itself was killed: then ``provenance.finished`` is unset too).
    unfinished: tuple[str, ...] | None = None

    @property
    def ok(self) -> bool:
        return (not self.unfinished and all(model.ok for model in self.models)
                and all(r.status in SUCCEEDED for r in self.run_stages.values()))

    def model(self, name: str) -> ModelResult:
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(f"no model {name!r} in results; have {', '.join(m.name for m in self.models)}")


converter.register_structure_hook_func(lambda t: t == StageRecords, lambda data, _: _structure_records(data))
converter.register_unstructure_hook_func(
    lambda t: t == StageRecords,
    lambda records: {name: converter.unstructure(record, StageRecord) for name, record in records.items()},
)


def _structure_records(data: dict[str, Any]) -> StageRecords:
    """Stage records with their results as plain data; :func:`typed` turns them into each stage's result type."""
    return {stage: converter.structure(raw, StageRecord) for stage, raw in data.items()}


def typed(run: RunResult, result_types: Mapping[str, type | None], *, where: str = "<results>") -> RunResult:
    """``run`` with every stage result structured into its stage's result type (plain data where none is known)."""

    def convert(records: StageRecords, path: str) -> StageRecords:
        converted = {}
        for stage, record in records.items():
            kind = result_types.get(stage)
            if kind is None or not isinstance(record.result, dict):
                converted[stage] = record
                continue
            try:
                converted[stage] = attrs.evolve(record, result=converter.structure(record.result, kind))
            except Exception as exc:
                lines = describe_errors(exc, f"{path}.{stage}.result")
                raise RpxError(f"{where}: not an rpx results file: {lines[0]}" + _more(lines)) from None
        return converted

    models = tuple(attrs.evolve(model, stages=convert(model.stages, f"models[{index}].stages"))
                   for index, model in enumerate(run.models))
    return attrs.evolve(run, models=models, run_stages=convert(run.run_stages, "run_stages"))


def _more(lines: list[str]) -> str:
    return f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""


def check_result(stage: str, kind: type | None, result: Any) -> None:
    """Refuse a result that is not the stage's result type or that TOML and JSON cannot hold, so one bad plugin
    result fails its own stage instead of the whole run (and the file that holds everything else)."""
    if kind is not None and not isinstance(result, kind):
        raise TypeError(f"stage {stage!r} must return {kind.__name__}, got {type(result).__name__}")
    import tomli_w

    data = to_data(result)
    try:
        tomli_w.dumps({"result": data})
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the result of stage {stage!r} cannot be written to TOML and JSON: {exc}") from None


def to_data(obj: Any) -> Any:
    """Unstructure any result object to plain TOML/JSON-able data (None values dropped)."""
    return converter.unstructure(obj)
