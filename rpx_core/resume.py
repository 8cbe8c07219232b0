"""``rpx run --resume``: continue an interrupted run from its results file without redoing anything finished.

A previous file is resumed only if it was made by the same spec (hash), the same rpx version and the same plugin set
(names, distributions, versions): otherwise its figures would not be comparable with the new ones, and resuming is
refused with the difference named. Then:

* a model whose job finished (``finished`` is set, whatever its stages' statuses: a crash or a timeout is a result)
  is kept as it is;
* a model whose job did not finish keeps its successful stages and runs the others again;
* a run-scoped stage with a final status is kept; an interrupted one runs again, given its partial result
  (``RunContext.previous``) so it can continue from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from rpx_core.errors import RpxError
from rpx_core.results import ModelResult, RunResult, StageRecord, load

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
        """Successful stage records of an unfinished model's job (the rest run again)."""
        model = self.models.get(name)
        if model is None:
            return {}
        return {stage: record for stage, record in model.stages.items() if record.status == "ok"}

    def run_stage(self, name: str) -> StageRecord | None:
        return self.run.run_stages.get(name)


def resume_from(path: Path, spec_hash: str, rpx_version: str, plugins: tuple[tuple[str, str, str], ...],
                result_types: Mapping[str, type | None]) -> Resumed | None:
    """The previous run at ``path`` if it can be resumed by this one; None if there is no file yet."""
    if not path.exists():
        return None
    previous = load(path, result_types)
    provenance = previous.provenance
    had = tuple(sorted((info.name, info.distribution, info.version) for info in provenance.plugins
                       if info.status == "loaded"))
    differences = []
    if provenance.spec_hash != spec_hash:
        differences.append(f"the spec changed (hash {provenance.spec_hash} then, {spec_hash} now)")
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
