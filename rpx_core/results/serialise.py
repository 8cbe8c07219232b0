"""Results files as text: written as TOML or JSON by the one converter, read back with the schema checked.

:class:`ModelCache` keeps each unchanged model's text between the rewrites of a running file
(rpx_core.results.writer)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from rpx_core.convert import converter, describe_errors
from rpx_core.errors import RpxError
from rpx_core.results.records import SCHEMA_VERSION, ModelResult, RunResult, StageRecord, _more, to_data, typed
from rpx_core.results.safe_write import Input, atomic_write
from rpx_core.safe_read import RESULTS_LIMIT, read_text


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
    unfinished = data.pop("unfinished", None)
    text = _toml(data, run, cache)
    return text if unfinished is None else f"unfinished = {toml_strings(unfinished)}\n{text}"


def toml_strings(strings: list[str]) -> str:
    """A TOML array of basic strings on one line: an interrupted sweep's job names may be a million, which tomli-w
    writes in seconds. JSON's string escapes are TOML's, but for DEL, which TOML also wants escaped."""
    return json.dumps(list(strings), ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml(data: dict[str, Any], run: RunResult, cache: ModelCache | None) -> str:
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


def write(run: RunResult, path: Path, fmt: Literal["toml", "json"] | None = None, protected: Iterable[Input] = (),
          cache: ModelCache | None = None) -> Path:
    """Write atomically to a regular file or a new path that is none of ``protected`` (see rpx_core.results.safe_write)."""
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
    if version is None and _looks_like_a_spec(data):
        raise RpxError(f"{where}: this is a spec (its [[models]] name sources), not a results file: run it with "
                       f"`rpx run {where}` and give the results file it writes (the spec's `output`)")
    if version != SCHEMA_VERSION:
        raise RpxError(f"{where}: results schema_version {version!r} is not supported by this rpx (reads {SCHEMA_VERSION})")
    try:
        run = converter.structure(data, RunResult)
    except Exception as exc:
        lines = describe_errors(exc)
        raise RpxError(f"{where}: not an rpx results file: {lines[0]}" + _more(lines)) from None
    return typed(run, result_types or {}, where=where)


def _looks_like_a_spec(data: Any) -> bool:
    """A spec's data: models that name their ``source`` (results files record models with stages instead)."""
    models = data.get("models") if isinstance(data, dict) else None
    return isinstance(models, list) and any(isinstance(model, dict) and "source" in model and "stages" not in model
                                            for model in models)


def load(path: str | Path, result_types: Mapping[str, type | None] | None = None) -> RunResult:
    """Load a results file written by ``rpx run`` (TOML or JSON, by suffix); see :func:`loads`."""
    path = Path(path)
    try:
        text = read_text(path, RESULTS_LIMIT)
    except FileNotFoundError:
        raise RpxError(f"{path}: no such results file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RpxError(f"{path}: cannot read the results file: {exc}") from None
    return loads(text, sniff_format(text, path), where=str(path), result_types=result_types)


def sniff_format(text: str, path: Path) -> Literal["toml", "json"]:
    """JSON if the text is a JSON object (``rpx run --format json -o x.toml`` writes one), else by suffix: a TOML
    document cannot start with ``{``."""
    return "json" if text.lstrip().startswith("{") else format_for(path)
