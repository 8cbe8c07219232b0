"""batch_search: the declaration of the run-scoped stage that searches batch sizes for a pipeline of models under a
memory budget, with its checks, trial table and chart. The implementation: rpx_plugins.batch_search.

Chart: each stage's frames/s and the trial's memory against the stage's batch size (one point per trial), the budget
as a line, failed trials marked x, the chosen trial circled.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rpx_core.plugin import (
    BatchSearchOptions,
    BatchSearchResult,
    Cell,
    ChartView,
    Column,
    RpxError,
    Stage,
    Table,
    TableView,
    did_you_mean,
    field,
    pyplot,
    run_result,
    units,
)


def pipeline_names_models(spec: Any, options: BatchSearchOptions) -> Iterable[str]:
    """The pipeline must name models of the spec, each once."""
    names = [model.name for model in spec.models]
    for index, name in enumerate(options.pipeline):
        if name not in names:
            yield (f"options.batch_search.pipeline[{index}]: no model named {name!r} (the spec has "
                   f"{', '.join(map(repr, names))}){did_you_mean(name, names)}")
        elif options.pipeline.index(name) != index:
            yield f"options.batch_search.pipeline[{index}]: model {name!r} is already in the pipeline"



def trials_table(run: Any) -> Table | None:
    """Every trial of the batch search, the chosen one marked, with the budget and the reason of the choice."""
    result = run_result(run, "batch_search")
    if result is None:
        return None
    names = [stage.name for stage in result.stages]
    rows = []
    for trial in result.trials:
        chosen = trial.index == result.chosen_trial
        rows.append([
            Cell(trial.index, f"{trial.index}{' *' if chosen else ''}"),
            Cell(list(trial.batch_sizes), " x ".join(map(str, trial.batch_sizes))),
            *[Cell.of(stage.frames_per_second, lambda v: units.rate(v, " fps"), _noise(stage)) for stage in trial.stages],
            Cell.of(trial.frames_per_second, lambda v: units.rate(v, " fps")),
            Cell.of(trial.used_bytes, units.size),
            Cell(trial.failure or "ok", trial.failure or "ok"),
            Cell.of(trial.seconds, units.seconds),
        ])  # fmt: skip
    budget = (f"budget {units.size(result.budget_bytes)}, usable {units.size(result.usable_bytes)} "
              f"({'enforced' if result.budget_enforced else 'checked against readings'}; {result.memory_method})"
              + (f"; held to {result.budget_holds}" if field(result, "budget_holds") else ""))
    choice = (f"chosen: trial {result.chosen_trial}, batch sizes "
              + ", ".join(f"{n}={b}" for n, b in zip(names, result.chosen_batch_sizes))
              if result.chosen_batch_sizes else "no combination fits")
    return Table("batch_search", "Batch search: trials (* = chosen; ± = the trial's own noise)",
                 [Column("trial"), Column("batch sizes"), *[Column(f"{name} throughput", "frames/s") for name in names],
                  Column("pipeline throughput", "frames/s"), Column("used", "bytes"), Column("outcome"),
                  Column("elapsed", "s")], rows, [choice, result.reason, budget])


def _noise(stage: Any) -> str:
    """A trial stage's own noise ((max - min) / (2 x median) of its chunks' rates) as " ±3%"; none when not recorded."""
    noise = field(stage, "noise")
    return "" if noise is None else f" ±{units.percent(noise)}"



def batch_chart(run: Any) -> Any:
    """Throughput (top) and memory (bottom) against batch size, one line per pipeline stage."""
    plt = pyplot()
    result = run_result(run, "batch_search")
    if result is None:
        raise RpxError("the results file has no batch search (run the batch_search stage) to plot")
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7.2, 6.4), sharex=True)
    for index, stage in enumerate(result.stages):
        colour = f"C{index}"
        good = sorted((t.batch_sizes[index], t.stages[index].frames_per_second, t.used_bytes) for t in result.trials
                      if t.ok and t.stages[index].frames_per_second is not None)
        # points, not lines: a stage meets one batch size in several trials (the other stages' sizes differ)
        top.plot([g[0] for g in good], [g[1] for g in good], "o", color=colour, label=f"{stage.name} frames/s")
        measured = [g for g in good if g[2] is not None]
        bottom.plot([g[0] for g in measured], [g[2] / 1e6 for g in measured], "o", color=colour, label=f"{stage.name}")
        failed = [(t.batch_sizes[index], t.used_bytes) for t in result.trials if not t.ok]
        if failed:
            bottom.plot([f[0] for f in failed], [(f[1] or result.usable_bytes) / 1e6 for f in failed], "x",
                        color=colour, markersize=8, label=f"{stage.name} failed (oom / over budget)")
        if result.chosen_trial is not None:
            chosen = result.trials[result.chosen_trial]
            for ax, y in ((top, chosen.stages[index].frames_per_second), (bottom, (chosen.used_bytes or 0) / 1e6)):
                ax.plot([chosen.batch_sizes[index]], [y], "o", markersize=14, markerfacecolor="none",
                        markeredgecolor="black", markeredgewidth=2)
    bottom.axhline(result.usable_bytes / 1e6, color="red", linestyle="--", label="usable budget")
    if result.chosen_trial is not None:
        top.plot([], [], "o", markerfacecolor="none", markeredgecolor="black", markersize=10,
                 label=f"chosen (trial {result.chosen_trial})")
    top.set_ylabel("frames/s")
    bottom.set_ylabel("memory used (MB)")
    bottom.set_xlabel("batch size of the stage")
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=7)
    top.set_title("batch search")
    figure.tight_layout()
    return figure



BATCH_SEARCH = Stage(
    "batch_search",
    "best batch sizes for a pipeline of models under a memory budget",
    result=BatchSearchResult,
    options=BatchSearchOptions,
    scope="run",
    executes=True,
    measures=True,
    check=pipeline_names_models,
    tables=(TableView("batch_search", trials_table),),
    charts=(ChartView("batch", "Batch search", batch_chart),),
    doc="Search batch sizes for a pipeline of models under a memory budget. Receives a RunContext (one "
    "StageContext per model, the options, the backend).",
)

