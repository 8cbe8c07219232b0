"""train_step and train_batch_search: the declarations of the training stages, their checks, summary fields, tables
(work by phase, bounds by phase, the memory prediction item by item beside the measurement, measured steps, the
batch search's trials) and compare figures. The implementations: rpx_plugins.training (torch and JAX).

Summary fields (flat, table-friendly):

* ``train_step_gflop``: FLOPs of one whole step / 1e9 (FLOPs = 2 x MACs for matrix work), and
  ``train_<phase>_gflop`` for forward, backward and optimizer.
* ``train_predicted_peak_mb``: predicted resident + transient peak / 1e6; ``train_predicted_transient_mb`` the
  transient peak alone; ``train_peak_phase`` the phase it falls in.
* ``train_step_p50_ms`` (with ``train_step_p50_low_ms``/``_high_ms``, the median's interval),
  ``train_samples_per_s``: measured whole steps; ``train_measured_increment_mb`` the measured step's increment;
  ``train_transient_ratio``: predicted transient / measured increment.
* ``train_bound_<gpu>_ms``: the roofline bound (fused) of one whole step on each GPU asked for.
* ``train_largest_batch``, ``train_best_batch``, ``train_best_samples_per_s``, ``train_search_trials``: the
  training batch search.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rpx_core.plugin import (
    PRECISION,
    SHAPES,
    Cell,
    Column,
    Figure,
    Noise,
    Stage,
    Table,
    TableView,
    field,
    ok_result,
    units,
)
from rpx_core.types.training import (
    TrainBatchSearchOptions,
    TrainBatchSearchResult,
    TrainStepOptions,
    TrainStepResult,
)

#: Precisions a training step runs at.
TRAINING_PRECISIONS = ("fp32", "bf16", "fp16")
STEP = "step"
Fields = dict[str, float | str]


def gpu_key(name: str) -> str:
    """A GPU name as a field-name part: "H100-SXM" -> "h100_sxm"."""
    return name.lower().replace(" ", "_").replace("-", "_")


# -- summary fields -----------------------------------------------------------------------------------------------------


def train_step_fields(result: TrainStepResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {"train_step_gflop": result.step.flops / 1e9}
    for phase, counts in result.phases.items():
        fields[f"train_{phase}_gflop"] = counts.flops / 1e9
    memory = result.memory
    fields["train_predicted_peak_mb"] = memory.peak_bytes / 1e6
    fields["train_predicted_transient_mb"] = memory.transient_peak_bytes / 1e6
    fields["train_peak_phase"] = memory.peak_phase
    for gpu, by_phase in result.bounds.items():
        fields[f"train_bound_{gpu_key(gpu)}_ms"] = by_phase[STEP].bound_ms_fused
    measured = result.measured
    if measured is not None:
        fields["train_step_p50_ms"] = measured.p50_ms
        if measured.p50_interval_ms is not None:
            fields["train_step_p50_low_ms"], fields["train_step_p50_high_ms"] = measured.p50_interval_ms
        fields["train_samples_per_s"] = measured.samples_per_s
        if measured.peak_memory.increment_bytes is not None:
            fields["train_measured_increment_mb"] = measured.peak_memory.increment_bytes / 1e6
    if result.comparison is not None and result.comparison.transient_ratio is not None:
        fields["train_transient_ratio"] = result.comparison.transient_ratio
    return fields


def train_search_fields(result: TrainBatchSearchResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {"train_search_trials": len(result.trials)}
    if result.largest_batch is not None:
        fields["train_largest_batch"] = result.largest_batch
    if result.best_batch is not None and result.best_samples_per_s is not None:
        fields["train_best_batch"] = result.best_batch
        fields["train_best_samples_per_s"] = result.best_samples_per_s
    return fields


# -- checks ------------------------------------------------------------------------------------------------------------


def trainable_precision(spec: Any, options: Any) -> Iterable[str]:
    """A step runs at fp32, bf16 or fp16 (tf32, fp8 and int8 are counted for inference only)."""
    precisions = (spec.precision, *(spec.sweep.precision if spec.sweep is not None else ()))
    for precision in dict.fromkeys(precisions):
        if precision not in TRAINING_PRECISIONS:
            yield (f"precision: {precision!r} cannot train; the training stages run at "
                   f"{', '.join(TRAINING_PRECISIONS)}")


def step_executes(options: TrainStepOptions | None) -> bool:
    options = options or TrainStepOptions()
    return options.measure or options.count_on == "device"


# -- tables ------------------------------------------------------------------------------------------------------------


def step_results(run: Any) -> list[tuple[str, Any]]:
    return [(model.name, result) for model in run.models if (result := ok_result(model, "train_step")) is not None]


def setup_note(name: str, result: Any) -> str:
    accumulation = f" x {result.accumulation_steps} micro-batches" if result.accumulation_steps > 1 else ""
    return (f"{name}: {result.framework}, {result.optimizer}, loss {result.loss}, {result.precision} "
            f"({result.precision_policy}: parameters {result.parameter_dtype}, compute {result.compute_dtype}), "
            f"batch {result.batch_size}{accumulation}, counted on {result.counted_on}")


def phases_table(run: Any) -> Table | None:
    """FLOPs, MACs and bytes of each phase of the step, and of the whole step."""
    rows, notes = [], []
    for name, result in step_results(run):
        for phase, counts in [*result.phases.items(), (STEP, result.step)]:
            rows.append([
                Cell.text_of(name), Cell.text_of(phase), Cell.of(counts.flops, units.flops),
                Cell.of(counts.macs, units.macs), Cell.of(counts.bytes_unfused, units.size),
                Cell.of(counts.bytes_fused, units.size),
            ])  # fmt: skip
        notes.append(setup_note(name, result))
        if result.uncounted_ops:
            notes.append(f"{name}: ran without a FLOP formula (not in the FLOPs): "
                         + ", ".join(f"{op} x{calls}" for op, calls in result.uncounted_ops.items()))
    if not rows:
        return None
    notes.append("FLOPs = 2 x MACs for matrix work plus the per-element table; fused bytes: what each phase must move "
                 "at least (forward: parameters and batch; backward: parameters and gradients; optimizer: parameters, "
                 "gradients and its state)")
    return Table("train_step", "Training step: work by phase",
                 [Column("model"), Column("phase"), Column("FLOPs", "FLOP"), Column("MACs", "MAC"),
                  Column("unfused bytes", "bytes"), Column("fused bytes", "bytes")], rows, notes)


def bounds_table(run: Any) -> Table | None:
    """The roofline bounds of each phase and of the whole step on every GPU asked for."""
    rows = []
    for name, result in step_results(run):
        for gpu, by_phase in result.bounds.items():
            for phase, bound in by_phase.items():
                rows.append([
                    Cell.text_of(name), Cell.text_of(gpu), Cell.text_of(phase),
                    Cell.of(bound.bound_ms_fused, units.milliseconds),
                    Cell.of(bound.bound_ms_unfused, units.milliseconds),
                    Cell.of(bound.per_operator_ms, units.milliseconds), Cell.text_of(bound.bottleneck_fused),
                    Cell(bound.fits_in_memory, f"{'yes' if bound.fits_in_memory else 'no'} "
                                               f"({units.size(bound.required_bytes)} of {units.size(bound.capacity_bytes)})"),
                ])  # fmt: skip
    if not rows:
        return None
    return Table("train_bounds", "Training step: roofline bounds by phase",
                 [Column("model"), Column("GPU"), Column("phase"), Column("bound fused", "ms"),
                  Column("bound unfused", "ms"), Column("per operator", "ms"), Column("bottleneck"), Column("fits")],
                 rows, ["bound = max(FLOPs / peak at the spec's precision, bytes / bandwidth); fits: the predicted "
                        "step peak against the GPU's memory"])


def memory_table(run: Any) -> Table | None:
    """The predicted memory item by item, then the totals beside the measured ones."""
    rows, notes = [], []
    for name, result in step_results(run):
        memory = result.memory
        peak = result.measured.peak_memory if result.measured is not None else None
        for where, items in (("resident", memory.resident), ("at the peak", memory.at_peak)):
            for item in items:
                rows.append(memory_row(name, f"{where}: {item.name}", item.bytes, None, None, item.note))
        compared = result.comparison
        totals = (("resident", memory.resident_bytes, "start_bytes", "resident_ratio", "measured: the step's start"),
                  ("transient peak", memory.transient_peak_bytes, "increment_bytes", "transient_ratio",
                   "measured: the step's increment"),
                  ("peak", memory.peak_bytes, "peak_bytes", "peak_ratio", "measured: the step's peak"))
        for label, predicted, reading, ratio, note in totals:
            rows.append(memory_row(name, label, predicted, field(peak, reading), field(compared, ratio),
                                   note if peak is not None else ""))
        if compared is not None:
            notes.append(f"{name}: {compared.note}")
        notes.append(f"{name}: peak in the {memory.peak_phase} phase at {memory.peak_operator} "
                     f"({units.percent(memory.peak_position)} of the way through the step's operators); "
                     + "; ".join(f"{phase.phase} allocates {units.size(phase.allocated_bytes)}, frees "
                                 f"{units.size(phase.freed_bytes)}, leaves {units.size(phase.live_at_end_bytes)}"
                                 for phase in memory.phases))
        if memory.compiler is not None:
            xla = memory.compiler
            notes.append(f"{name}: {xla.source}: {units.size(xla.peak_bytes)} (arguments {units.size(xla.argument_bytes)}"
                         f" + outputs {units.size(xla.output_bytes)} - aliased {units.size(xla.alias_bytes)} + "
                         f"temporaries {units.size(xla.temp_bytes)}); rpx's prediction / XLA's = "
                         f"{units.ratio(memory.peak_bytes / xla.peak_bytes)}")
        if peak is not None:
            notes.append(f"{name}: measured by {peak.method}"
                         + (f"; {result.measured.memory_method}" if result.measured.memory_method else ""))
    if not rows:
        return None
    notes.append("predicted / measured: 1.0 is exact")
    return Table("train_memory", "Training step: memory, predicted item by item and measured",
                 [Column("model"), Column("item"), Column("predicted", "bytes"), Column("measured", "bytes"),
                  Column("predicted / measured", "ratio"), Column("note")], rows, notes)


def memory_row(name: str, item: str, predicted: int, measured: int | None, ratio: float | None,
               note: str) -> list[Cell]:
    return [Cell.text_of(name), Cell.text_of(item), Cell.of(predicted, units.size), Cell.of(measured, units.size),
            Cell.of(ratio, units.ratio), Cell.text_of(note)]


def interval_text(measured: Any) -> str:
    interval = measured.p50_interval_ms
    if not interval:
        return units.MISSING
    return (f"{units.milliseconds(interval[0])} – {units.milliseconds(interval[1])} "
            f"({units.percent(measured.interval_confidence)})")


def measured_table(run: Any) -> Table | None:
    """Whole steps measured on the device: p50 with its interval, samples/s, the step's memory increment."""
    rows, notes = [], []
    for name, result in step_results(run):
        measured = result.measured
        if measured is None:
            if result.not_measured:
                notes.append(f"{name}: not measured: {result.not_measured}")
            continue
        rows.append([
            Cell.text_of(name), Cell(measured.samples_per_step, str(measured.samples_per_step)),
            Cell.of(measured.p50_ms, units.milliseconds),
            Cell(measured.p50_interval_ms, interval_text(measured)),
            Cell.of(measured.samples_per_s, lambda v: units.rate(v, " samples/s")),
            Cell(measured.steps, str(measured.steps)), Cell.text_of(measured.verdict),
            Cell.of(measured.peak_memory.increment_bytes, units.size),
            Cell.of(result.comparison.transient_ratio if result.comparison else None, units.ratio),
        ])  # fmt: skip
        notes.append(f"{name}: clock {measured.clock}; stopped by {measured.stopped_by}")
    if not rows and not notes:
        return None
    notes.append("one sample = one whole step (every micro-batch and the update), synchronised; percentiles by linear "
                 "interpolation; samples/s = samples per step / p50; increment: one step's peak less its start")
    return Table("train_measured", "Training step: measured",
                 [Column("model"), Column("samples per step"), Column("p50", "ms"), Column("p50 interval", "ms"),
                  Column("throughput", "samples/s"), Column("steps"), Column("verdict"),
                  Column("increment", "bytes"), Column("predicted / measured", "ratio")], rows, notes)


def search_table(run: Any) -> Table | None:
    """Every trial of the training batch search, with the prediction that placed it."""
    rows, notes = [], []
    for model in run.models:
        result = ok_result(model, "train_batch_search")
        if result is None:
            continue
        for index, trial in enumerate(result.trials):
            mark = " *" if trial.batch_size == result.best_batch and trial.fits else ""
            rows.append([
                Cell.text_of(model.name), Cell(index, str(index)), Cell(trial.batch_size, f"{trial.batch_size}{mark}"),
                Cell.of(trial.predicted_bytes, units.size), Cell.of(trial.used_bytes, units.size),
                Cell(trial.fits, "fits" if trial.fits else "no"),
                Cell.of(trial.samples_per_s, lambda v: units.rate(v, " samples/s")), Cell.text_of(trial.error),
            ])  # fmt: skip
        notes.append(f"{model.name}: largest batch {result.largest_batch}, best {result.best_batch} "
                     f"({units.rate(result.best_samples_per_s, ' samples/s')}); budget {units.size(result.budget_bytes)}"
                     f", usable {units.size(result.usable_bytes)}; stopped: {result.stopped_by}; "
                     f"{result.memory_method}; the budget holds {result.budget_holds}")
    if not rows:
        return None
    return Table("train_batch_search", "Training batch search: trials (* = best samples/s)",
                 [Column("model"), Column("trial"), Column("batch"), Column("predicted", "bytes"),
                  Column("used", "bytes"), Column("outcome"), Column("throughput", "samples/s"), Column("note")],
                 rows, notes)


# -- what rpx compare puts side by side --------------------------------------------------------------------------------


def step_figures(models: Sequence[Any]) -> Iterable[Figure]:
    def read(getter: Any) -> Any:
        def value(model: Any) -> Any:
            result = ok_result(model, "train_step")
            return None if result is None else getter(result)

        return value

    def measured(getter: Any) -> Any:
        return read(lambda result: None if result.measured is None else getter(result.measured))

    def step_noise(model: Any) -> Noise | None:
        result = ok_result(model, "train_step")
        if result is None or result.measured is None:
            return None
        interval = result.measured.p50_interval_ms
        return Noise(interval=tuple(interval) if interval else None, spread=result.measured.spread)

    def rate_noise(model: Any) -> Noise | None:
        result = ok_result(model, "train_step")
        return None if result is None or result.measured is None else Noise(spread=result.measured.spread)

    return [
        Figure("training step FLOPs", read(lambda r: r.step.flops), units.flops, (SHAPES, PRECISION), unit="FLOP"),
        Figure("training step predicted peak", read(lambda r: r.memory.peak_bytes), units.size, (SHAPES, PRECISION),
               unit="bytes"),
        Figure("training step p50", measured(lambda m: m.p50_ms), units.milliseconds, (SHAPES, PRECISION),
               measured=True, noise=step_noise, unit="ms"),
        Figure("training samples/s", measured(lambda m: m.samples_per_s), lambda v: units.rate(v, " samples/s"),
               (SHAPES, PRECISION), measured=True, higher_is_better=True, noise=rate_noise, unit="samples/s"),
    ]


TRAIN_STEP = Stage(
    "train_step",
    "one optimiser step: FLOPs and bounds by phase, itemised predicted memory, measured step time and peak",
    result=TrainStepResult,
    options=TrainStepOptions,
    executes=step_executes,
    measures=True,
    check=trainable_precision,
    summary=train_step_fields,
    tables=(TableView("train_step", phases_table), TableView("train_bounds", bounds_table),
            TableView("train_memory", memory_table), TableView("train_measured", measured_table)),
    figures=step_figures,
    doc="Count one training step (``ctx.options('train_step')``: optimiser, loss, precision policy, gradient "
    "accumulation) by phase, bound it on the spec's GPUs, predict its memory item by item, and measure real steps.",
)
TRAIN_BATCH_SEARCH = Stage(
    "train_batch_search",
    "the largest and the fastest training micro-batch under a memory budget, placed by predicted memory",
    result=TrainBatchSearchResult,
    options=TrainBatchSearchOptions,
    executes=True,
    measures=True,
    check=trainable_precision,
    summary=train_search_fields,
    tables=(TableView("train_batch_search", search_table),),
    doc="Search the micro-batch of ``[options.train_step]``'s step under ``[options.train_batch_search]``'s budget: "
    "trials placed by the predicted step memory, confirmed by real steps.",
)
