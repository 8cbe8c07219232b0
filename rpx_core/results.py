"""The results file: schema-versioned attrs models, written as TOML or JSON by the one converter.

A run's file is rewritten atomically as results arrive (when: rpx_core.pipeline), so whatever was measured survives a
later crash; :class:`ModelCache` keeps each unchanged model's text between rewrites. Each stage's result reloads as
the type its declaration names (``Stage.result``); a stage no loaded plugin declares loads as data.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from rpx_core.convert import converter, describe_errors
from rpx_core.errors import RpxError
from rpx_core.safe_write import atomic_write

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
    #: model factory or copy, "place": moving/casting it to the device), excluded from ``seconds``.
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
    #: Seconds of setup by phase ("import", "build", "place"), summed over the stages during which it happened;
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

    @property
    def ok(self) -> bool:
        return all(model.ok for model in self.models) and all(r.status in SUCCEEDED for r in self.run_stages.values())

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


class ModelCache:
    """Each model's serialised form, kept while the model is unchanged (the same object), and each stage record's,
    kept while the record is: a sweep's file grows with every job, and rewriting it would otherwise serialise every
    finished model again for each new stage, and every record of a running job again for each of its later ones."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[ModelResult, Any]] = {}
        self._toml: dict[str, tuple[ModelResult, str]] = {}
        self._records: dict[tuple[str, str], tuple[StageRecord, Any, list[str]]] = {}  # (model, stage) -> data, toml

    def data(self, model: ModelResult) -> Any:
        kept = self._data.get(model.name)
        if kept is None or kept[0] is not model:
            data = to_data(attrs.evolve(model, stages={}))
            data["stages"] = {name: self._record(model.name, name, record)[1] for name, record in model.stages.items()}
            kept = self._data[model.name] = (model, data)
        return kept[1]

    def toml(self, model: ModelResult) -> str:
        """The model as its ``[[models]]`` table, exactly as tomli-w writes it inside the whole file."""
        kept = self._toml.get(model.name)
        if kept is None or kept[0] is not model:
            kept = self._toml[model.name] = (model, self._model_toml(model))
        return kept[1]

    def _model_toml(self, model: ModelResult) -> str:
        import tomli_w

        data = self.data(model)
        if model.stages:
            # tomli-w writes each record as its own table ([models.stages.NAME] and those under it), a blank line
            # between two, where an empty stages table writes the line [models.stages]
            shell = tomli_w.dumps({"models": [{**data, "stages": {}}]})
            marker = "\n[models.stages]\n"
            records = [self._record_toml(model.name, name, record) for name, record in model.stages.items()]
            if shell.count(marker) == 1 and None not in records:
                return shell.replace(marker, "\n" + "\n".join(records))
        return tomli_w.dumps({"models": [data]})

    def _record(self, model: str, name: str, record: StageRecord) -> tuple[StageRecord, Any, list[str]]:
        kept = self._records.get((model, name))
        if kept is None or kept[0] is not record:
            kept = self._records[(model, name)] = (record, converter.unstructure(record, StageRecord), [])
        return kept

    def _record_toml(self, model: str, name: str, record: StageRecord) -> str | None:
        """The record's tables as tomli-w writes them in a model; None if it writes them otherwise."""
        import tomli_w

        kept = self._record(model, name, record)
        if not kept[2]:
            text = tomli_w.dumps({"models": [{"stages": {name: kept[1]}}]})
            kept[2].append(text.removeprefix("[[models]]\n\n") if text.startswith("[[models]]\n\n[") else "")
        return kept[2][0] or None


def dumps(run: RunResult, fmt: Literal["toml", "json"] = "toml", cache: ModelCache | None = None) -> str:
    """The results file's text; with ``cache``, models unchanged since its last use are not serialised again."""
    if cache is None or not run.models:
        data = to_data(run)
    else:
        data = to_data(attrs.evolve(run, models=()))
        data["models"] = [cache.data(model) for model in run.models]
    if fmt == "json":
        return json.dumps(data, indent=2, allow_nan=False) + "\n"
    import tomli_w

    if cache is None or not run.models:
        return tomli_w.dumps(data)
    chunks = [cache.toml(model) for model in run.models]
    if not all(chunk.startswith("[[models]]\n") for chunk in chunks):  # written inline: no tables to reuse
        return tomli_w.dumps(data)
    # tomli-w writes a table's plain values first, then its tables in key order, each after a blank line
    keys = list(data)
    at = keys.index("models")
    tables = {key for key, value in data.items() if isinstance(value, Mapping)
              or (isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value))}
    head = {key: data[key] for key in keys if key != "models" and (keys.index(key) < at or key not in tables)}
    tail = [key for key in keys[at + 1:] if key in tables]
    text = tomli_w.dumps(head)
    for chunk in chunks + [tomli_w.dumps({key: data[key]}) for key in tail]:
        text += ("\n" if text else "") + chunk
    return text


def write(run: RunResult, path: Path, fmt: Literal["toml", "json"] | None = None, protected: Iterable[Path] = (),
          cache: ModelCache | None = None) -> Path:
    """Write atomically to a regular file or a new path that is none of ``protected`` (see rpx_core.safe_write)."""
    return atomic_write(path, dumps(run, fmt or format_for(path), cache), protected)


def format_for(path: Path) -> Literal["toml", "json"]:
    return "json" if path.suffix.lower() == ".json" else "toml"


def loads(text: str, fmt: Literal["toml", "json"] = "toml", *, where: str = "<results>",
          result_types: Mapping[str, type | None] | None = None) -> RunResult:
    """Parse a results file; stage results become their ``result_types`` (stage name -> class), else stay data."""
    try:
        data = json.loads(text) if fmt == "json" else tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise RpxError(f"{where}: not a valid {fmt.upper()} results file: {exc}") from None
    except RecursionError:
        raise RpxError(f"{where}: not a valid {fmt.upper()} results file: nested too deeply") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise RpxError(f"{where}: results schema_version {version!r} is not supported by this rpx (reads {SCHEMA_VERSION})")
    try:
        run = converter.structure(data, RunResult)
    except Exception as exc:
        lines = describe_errors(exc)
        raise RpxError(f"{where}: not an rpx results file: {lines[0]}" + _more(lines)) from None
    return typed(run, result_types or {}, where=where)


def load(path: str | Path, result_types: Mapping[str, type | None] | None = None) -> RunResult:
    """Load a results file written by ``rpx run`` (TOML or JSON, by suffix); see :func:`loads`."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RpxError(f"{path}: no such results file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RpxError(f"{path}: cannot read the results file: {exc}") from None
    return loads(text, sniff_format(text, path), where=str(path), result_types=result_types)


def sniff_format(text: str, path: Path) -> Literal["toml", "json"]:
    """JSON if the text is a JSON object (``rpx run --format json -o x.toml`` writes one), else by suffix: a TOML
    document cannot start with ``{``."""
    return "json" if text.lstrip().startswith("{") else format_for(path)
