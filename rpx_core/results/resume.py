"""``rpx run --resume``: continue an interrupted run from its results file without redoing anything finished.

A previous file is resumed only if it was made by the same spec, the same rpx version and the same plugin set
(names, distributions, versions): otherwise its figures would not be comparable with the new ones, and resuming is
refused with the difference named. Then:

* a model whose job finished (``finished`` is set, whatever its stages' statuses: a crash or a timeout is a result)
  is kept as it is;
* a model whose job did not finish keeps its successful stages and runs the others again;
* a run-scoped stage with a final status is kept; an interrupted one runs again, given its partial result
  (``RunContext.previous``) so it can continue from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from rpx_core.errors import RpxError
from rpx_core.results.records import SUCCEEDED, ModelResult, RunResult, StageRecord
from rpx_core.results.serialise import load

FINAL = ("ok", "failed", "skipped")


class ResumeError(RpxError):
    """The results file cannot be resumed by this run; the message says what differs."""


@attrs.frozen
class Resumed:
    """What a previous results file contributes to this run."""

    run: RunResult
    models: dict[str, ModelResult]  # by model name, as found

    def finished_model(self, name: str) -> ModelResult | None:
        model = self.models.get(name)
        return model if model is not None and model.finished is not None else None

    def kept_stages(self, name: str) -> dict[str, StageRecord]:
        """Successful (or not applicable) stage records of an unfinished model's job (the rest run again)."""
        model = self.models.get(name)
        if model is None:
            return {}
        return {stage: record for stage, record in model.stages.items() if record.status in SUCCEEDED}

    def run_stage(self, name: str) -> StageRecord | None:
        return self.run.run_stages.get(name)


def resume_from(path: Path, spec_data: dict[str, Any], rpx_version: str, plugins: tuple[tuple[str, str, str], ...],
                result_types: Mapping[str, type | None]) -> Resumed | None:
    """The previous run at ``path`` if it can be resumed by this one; None if there is no file yet. The spec is
    compared key by key, except ``execution`` (isolation and time limits change how jobs run, not what they
    measure, so a run may be resumed with other limits)."""
    if not path.exists():
        return None
    previous = load(path, result_types)
    provenance = previous.provenance
    had = tuple(sorted((info.name, info.distribution, info.version) for info in provenance.plugins
                       if info.status == "loaded"))
    differences = []
    then, now = _comparable(provenance.spec), _comparable(spec_data)
    changed = _changed_keys(then, now)
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        differences.append(f"the spec changed ({shown})")
    if provenance.rpx_version != rpx_version:
        differences.append(f"rpx changed (version {provenance.rpx_version} then, {rpx_version} now)")
    if had != plugins:
        gone = sorted(set(had) - set(plugins))
        new = sorted(set(plugins) - set(had))
        differences.append("the plugins changed (" + "; ".join(filter(None, [
            f"then: {', '.join(' '.join(p) for p in gone)}" if gone else "",
            f"now: {', '.join(' '.join(p) for p in new)}" if new else ""])) + ")")
    if differences:
        raise ResumeError(f"{path}: cannot resume: {'; '.join(differences)}; run without --resume to start over "
                          "(the file is then replaced)")
    return Resumed(previous, {model.name: model for model in previous.models})


def _comparable(spec: dict[str, Any]) -> dict[str, Any]:
    """Spec data as TOML and JSON give it back (lists, no None), without ``execution``."""
    data = json.loads(json.dumps(spec, default=str))
    data.pop("execution", None)
    return data


def _changed_keys(then: Any, now: Any, path: str = "") -> list[str]:
    """The key paths (``models[0].kwargs.out_features``) at which two spec data trees differ."""
    if isinstance(then, dict) and isinstance(now, dict):
        return [changed for key in sorted({*then, *now})
                for changed in _changed_keys(then.get(key), now.get(key), f"{path}.{key}" if path else key)]
    if isinstance(then, list) and isinstance(now, list) and len(then) == len(now):
        return [changed for index, (a, b) in enumerate(zip(then, now, strict=True))
                for changed in _changed_keys(a, b, f"{path}[{index}]")]
    return [] if then == now else [path]
