"""serve and measure_serving: the declarations of the serving stages, their summary fields and checks, their tables
(each step bounded per GPU, what fits at each context, the steps measured), compare figures and charts. The
implementations: rpx_plugins.serving (torch models taking a Hugging Face KV cache).

Charts: ``serving``, per model, decode tokens/s against batch (one line per GPU and context) beside the memory a
decode step needs against context (one line per batch) with each GPU's usable memory as a line; ``serving_measured``,
per model, each step's measured p50 (with its interval) and its bound against batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rpx_core.plugin import (
    PRECISION,
    SHAPES,
    Cell,
    ChartView,
    Column,
    Figure,
    Noise,
    RpxError,
    Stage,
    Table,
    TableView,
    colour,
    ok_result,
    plain,
    pyplot,
    units,
)
from rpx_core.types.serving import (
    KV_CACHE_FORMATS,
    WEIGHT_FORMATS,
    MeasureServingOptions,
    MeasureServingResult,
    ServeOptions,
    ServeResult,
)
from rpx_plugins.stages.roofline import gpu_key

Fields = dict[str, float | str]
#: Traits the serving figures depend on: the prompt of the prefill, and the formats weights and KV cache are stored in.
PROMPT, FORMATS = "served prompt", "served formats"
STYLES = ("-", "--", ":", "-.")


# -- summary fields and checks -----------------------------------------------------------------------------------------


def serve_fields(result: ServeResult, results: Mapping[str, Any]) -> Fields:
    """KV bytes per token, served weights, and per GPU the bounds and the largest batch per context."""
    fields: Fields = {"kv_bytes_per_token": result.kv_bytes_per_token, "served_weights_gb": result.weight_bytes / 1e9}
    for gpu in result.gpus.values():
        key = f"{gpu_key(gpu.gpu)}_{gpu.precision}"
        for step in gpu.prefill:
            fields[f"ttft_{key}_b{step.batch_size}_ms"] = step.bound_ms
        for step in gpu.decode:
            fields[f"tpot_{key}_c{step.context}_b{step.batch_size}_ms"] = step.bound_ms
        for context in gpu.capacities:
            fields[f"max_batch_{key}_c{context.context}"] = context.max_batch
    return fields


def measured_fields(result: MeasureServingResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {}
    for step in result.steps:
        key = f"{step.phase}_c{step.context}_b{step.batch_size}"
        fields[f"measured_{key}_ms"] = step.p50_ms
        if step.efficiency is not None:
            fields[f"efficiency_{key}"] = step.efficiency
    return fields


def measured_unquantised(spec: Any, options: MeasureServingOptions) -> Iterable[str]:
    """The measured model runs as the backend executes it: weights and KV cache at the run's precision."""
    serve = spec.options.get("serve") or {}
    for key, formats in (("weights", WEIGHT_FORMATS), ("kv_cache", KV_CACHE_FORMATS)):
        if serve.get(key) in formats:  # another value is the serve options' own error
            yield (f"options.serve.{key}: measure_serving times the model as the backend runs it, with weights and "
                   f"KV cache at the run's precision; {key} = {serve[key]!r} is counted and bounded by serve only "
                   "(measure in a spec without it)")


# -- tables ------------------------------------------------------------------------------------------------------------


def steps_table(run: Any) -> Table | None:
    """One row per model, GPU and step: what the step counts, its bound, tokens/s and whether it fits."""
    rows, notes = [], []
    for model in run.models:
        result = ok_result(model, "serve")
        if result is None:
            continue
        counted = {(s.phase, s.batch_size, s.context): s for s in (*result.prefill, *result.decode)}
        for gpu in result.gpus.values() or [None]:
            bounds = (*gpu.prefill, *gpu.decode) if gpu else (None,) * len(counted)
            for step, bound in zip(counted.values(), bounds):
                rows.append(step_row(model.name, gpu.gpu if gpu else None, step, bound))
        notes.append(f"{model.name}: weights {result.weight_format} ({units.size(result.weight_bytes)}), KV cache "
                     f"{result.kv_cache_format} ({units.size(result.kv_bytes_per_token)} per token), prompt "
                     f"{result.prompt:,}, peaks at {result.precision}")
        notes += [f"{model.name}: not bounded on {s.gpu}: {s.reason}" for s in result.skipped]
        notes += [f"{model.name}: {note}" for note in result.notes]
        if not result.gpus:
            notes.append(f"{model.name}: counted only: the spec names no GPUs to bound on")
    if not rows:
        return None
    notes += ["bound = max(FLOPs / peak, bytes / bandwidth): prefill, the time to first token of the batch; decode, "
              "the time per output token; bytes: weights, KV cache read and written, token ids and logits, each once",
              "fits: weights + the step's KV cache + its activation peak within memory_fraction of the GPU's memory; "
              "else the GPUs it needs (a power of two, an even tensor-parallel split)"]
    return Table("serving", "Serving: prefill and decode steps, bounded per GPU",
                 [Column("model"), Column("GPU"), Column("step"), Column("batch"), Column("context"),
                  Column("FLOPs", "FLOP"), Column("traffic", "bytes"), Column("KV cache", "bytes"),
                  Column("bound", "ms"), Column("bottleneck"), Column("throughput", "tokens/s"),
                  Column("per sequence", "tokens/s"), Column("fits")], rows, notes)


def step_row(model: str, gpu: str | None, step: Any, bound: Any) -> list[Cell]:
    tokens = (lambda v: units.rate(v, " tokens/s"))
    fits = None if bound is None else ("yes" if bound.fits else f"no: {bound.gpus_needed} GPUs")
    return [
        Cell.text_of(model), Cell.text_of(gpu), Cell.text_of(step.phase), Cell(step.batch_size, str(step.batch_size)),
        Cell(step.context, f"{step.context:,}"), Cell.of(step.flops, units.flops), Cell.of(step.bytes, units.size),
        Cell.of(step.kv_cache_bytes, units.size), Cell.of(bound and bound.bound_ms, units.milliseconds),
        Cell.text_of(bound and bound.bottleneck), Cell.of(bound and bound.tokens_per_s, tokens),
        Cell.of(bound and bound.tokens_per_s_per_sequence, tokens), Cell.text_of(fits),
    ]  # fmt: skip


def capacity_table(run: Any) -> Table | None:
    """One row per model, GPU and decode context: the largest batch that fits and where decode turns compute-bound."""
    rows, notes = [], []
    for model in run.models:
        result = ok_result(model, "serve")
        for gpu in (result.gpus.values() if result else ()):
            for capacity in gpu.capacities:
                crossover = capacity.compute_bound_from_batch
                rows.append([
                    Cell.text_of(model.name), Cell.text_of(gpu.gpu), Cell(capacity.context, f"{capacity.context:,}"),
                    Cell.of(capacity.kv_bytes_per_sequence, units.size), Cell.of(gpu.usable_bytes, units.size),
                    Cell(capacity.max_batch, f"{capacity.max_batch:,}"),
                    Cell(crossover, f"{crossover:,}" if crossover is not None else "never"),
                ])  # fmt: skip
                if capacity.note:
                    notes.append(f"{model.name} on {gpu.gpu} at {capacity.context:,}: {capacity.note}")
    if not rows:
        return None
    notes.append("largest batch: weights + batch x (KV cache + activations per sequence) within the usable memory "
                 "of one GPU; compute-bound from: the smallest batch whose decode step's FLOPs / peak reach its "
                 "bytes / bandwidth (both affine in batch through two counted batch sizes)")
    return Table("serving_capacity", "Serving: what fits at each context",
                 [Column("model"), Column("GPU"), Column("context"), Column("KV cache per sequence", "bytes"),
                  Column("usable memory", "bytes"), Column("largest batch"), Column("compute-bound from batch")],
                 rows, notes)


def measured_table(run: Any) -> Table | None:
    """Every measured step beside its bound on the GPU it ran on."""
    rows, notes = [], []
    for model in run.models:
        result = ok_result(model, "measure_serving")
        if result is None:
            continue
        for step in result.steps:
            interval = step.p50_interval_ms
            rows.append([
                Cell.text_of(model.name), Cell.text_of(step.phase), Cell(step.batch_size, str(step.batch_size)),
                Cell(step.context, f"{step.context:,}"), Cell.of(step.p50_ms, units.milliseconds),
                Cell(list(interval) if interval else None, units.MISSING if not interval else
                     f"{units.milliseconds(interval[0])} – {units.milliseconds(interval[1])}"),
                Cell(step.samples, str(step.samples)), Cell.of(step.tokens_per_s, lambda v: units.rate(v, " tokens/s")),
                Cell.of(step.bound_ms, units.milliseconds), Cell.of(step.efficiency, units.percent),
            ])  # fmt: skip
        where = f"bounds on {result.gpu}" if result.gpu else "no bound: not run on a GPU rpx's packs know"
        notes.append(f"{model.name}: {where}; clock: {result.clock}")
    if not rows:
        return None
    notes.append("each sample one synchronised call of the step against a KV cache of its length on the device; "
                 "p50 interval: the median's distribution-free confidence interval; efficiency = bound / p50")
    return Table("serving_measured", "Serving: steps measured against their bounds",
                 [Column("model"), Column("step"), Column("batch"), Column("context"), Column("p50", "ms"),
                  Column("p50 interval", "ms"), Column("samples"), Column("throughput", "tokens/s"),
                  Column("bound", "ms"), Column("efficiency", "fraction")], rows, notes)


# -- what rpx compare puts side by side and sweep charts draw ----------------------------------------------------------


def serve_figures(models: Sequence[Any]) -> Iterable[Figure]:
    """Per GPU: time to first token per batch, time per output token per context and batch, the largest batch per
    context; then the KV cache per token."""
    results = [result for model in models if (result := ok_result(model, "serve"))]
    found = []
    for gpu in dict.fromkeys(name for result in results for name in result.gpus):
        bounds = [bound for result in results if gpu in result.gpus for bound in
                  (*result.gpus[gpu].prefill, *result.gpus[gpu].decode)]
        for phase, batch, context in dict.fromkeys((b.phase, b.batch_size, b.context) for b in bounds):
            if phase == "prefill":
                found.append(Figure(f"TTFT {gpu} b{batch}", _bound(gpu, phase, batch, None), units.milliseconds,
                                    (SHAPES, PRECISION, PROMPT, FORMATS), unit="ms", panel=f"TTFT b{batch}", gpu=gpu))
            else:
                found.append(Figure(f"TPOT {gpu} c{context} b{batch}", _bound(gpu, phase, batch, context),
                                    units.milliseconds, (PRECISION, FORMATS), unit="ms",
                                    panel=f"TPOT c{context} b{batch}", gpu=gpu))
        for context in dict.fromkeys(c.context for result in results if gpu in result.gpus
                                     for c in result.gpus[gpu].capacities):
            found.append(Figure(f"largest batch {gpu} c{context}", _largest(gpu, context), units.count,
                                (PRECISION, FORMATS), higher_is_better=True, unit="sequences",
                                panel=f"largest batch c{context}", gpu=gpu))
    found.append(Figure("KV cache per token", _read_serve("kv_bytes_per_token"), units.size, (PRECISION, FORMATS),
                        unit="bytes"))
    return found


def _read_serve(name: str) -> Any:
    def read(model: Any) -> Any:
        result = ok_result(model, "serve")
        return None if result is None else getattr(result, name)

    return read


def _bound(gpu: str, phase: str, batch: int, context: int | None) -> Any:
    """The bound of one step on ``gpu`` (a prefill matches any context: it is the prompt, a trait)."""
    def read(model: Any) -> Any:
        result = ok_result(model, "serve")
        on = result.gpus.get(gpu) if result else None
        steps = (on.prefill if phase == "prefill" else on.decode) if on else ()
        return next((s.bound_ms for s in steps if s.batch_size == batch and context in (None, s.context)), None)

    return read


def _largest(gpu: str, context: int) -> Any:
    def read(model: Any) -> Any:
        result = ok_result(model, "serve")
        on = result.gpus.get(gpu) if result else None
        return next((c.max_batch for c in on.capacities if c.context == context), None) if on else None

    return read


def serve_traits(run: Any, model: Any) -> dict[str, Any]:
    """The prompt and the formats the figures were counted with."""
    result = ok_result(model, "serve")
    if result is None:
        return {}
    return {PROMPT: result.prompt, FORMATS: (result.weight_format, result.kv_cache_format)}


def measured_figures(models: Sequence[Any]) -> Iterable[Figure]:
    """Every measured step's p50, with its interval as its noise."""
    steps = dict.fromkeys((s.phase, s.batch_size, s.context) for model in models
                          if (result := ok_result(model, "measure_serving")) for s in result.steps)
    return [Figure(f"measured {phase} c{context} b{batch}", _measured(phase, batch, context, "p50_ms"),
                   units.milliseconds, (SHAPES, PRECISION), measured=True, unit="ms",
                   noise=_measured_noise(phase, batch, context), panel=f"measured {phase}")
            for phase, batch, context in steps]


def _measured_step(model: Any, phase: str, batch: int, context: int) -> Any:
    result = ok_result(model, "measure_serving")
    steps = result.steps if result else ()
    return next((s for s in steps if (s.phase, s.batch_size, s.context) == (phase, batch, context)), None)


def _measured(phase: str, batch: int, context: int, name: str) -> Any:
    def read(model: Any) -> Any:
        step = _measured_step(model, phase, batch, context)
        return None if step is None else getattr(step, name)

    return read


def _measured_noise(phase: str, batch: int, context: int) -> Any:
    def noise(model: Any) -> Noise | None:
        step = _measured_step(model, phase, batch, context)
        if step is None:
            return None
        interval = step.p50_interval_ms
        return Noise(interval=tuple(interval) if interval else None,
                     unsound=None if interval else "too few samples")

    return noise


# -- charts ------------------------------------------------------------------------------------------------------------


def serving_chart(run: Any) -> Any:
    """Per model: decode tokens/s against batch (a line per GPU and context), and the memory a decode step needs
    against context (a line per batch) with each GPU's usable memory."""
    served = [(model, result) for model in run.models if (result := ok_result(model, "serve")) and result.gpus]
    if not served:
        raise RpxError("the results file has no serve result bounded on a GPU (run the serve stage with gpus) to plot")
    plt = pyplot()
    figure, grid = plt.subplots(len(served), 2, figsize=(10.8, 3.6 * len(served)), squeeze=False)
    for (model, result), (rate, memory) in zip(served, grid):
        _throughput_panel(rate, model.name, result)
        _memory_panel(memory, model.name, result)
    figure.tight_layout()
    return figure


def _throughput_panel(ax: Any, name: str, result: ServeResult) -> None:
    """A line per GPU and context; a step that does not fit on one GPU is drawn open."""
    for gpu in result.gpus.values():
        tint = colour("gpu", gpu.gpu)
        for index, context in enumerate(result.contexts):
            steps = sorted((b for b in gpu.decode if b.context == context), key=lambda b: b.batch_size)
            ax.plot([b.batch_size for b in steps], [b.tokens_per_s for b in steps], STYLES[index % len(STYLES)],
                    color=tint, label=plain(f"{gpu.gpu}, context {context:,}"))
            for fits in (True, False):
                chosen = [b for b in steps if b.fits == fits]
                ax.plot([b.batch_size for b in chosen], [b.tokens_per_s for b in chosen], "o", markersize=4,
                        color=tint, markerfacecolor=tint if fits else "white", linestyle="none")
    ax.plot([], [], "o", color="gray", markerfacecolor="white", linestyle="none",
            label="open: needs more than one GPU")
    _finish(ax, result.batch_sizes, "batch (sequences decoded together)", "decode tokens/s (bound)",
            f"{name}: decode throughput against batch", lambda v: units.rate(v, ""))


def _memory_panel(ax: Any, name: str, result: ServeResult) -> None:
    batches = sorted({step.batch_size for step in result.decode})
    for index, batch in enumerate(batches):
        steps = sorted((s for s in result.decode if s.batch_size == batch), key=lambda s: s.context)
        needed = [result.weight_bytes + s.kv_cache_bytes + s.activation_peak_bytes for s in steps]
        ax.plot([s.context for s in steps], [value / 1e9 for value in needed], STYLES[index % len(STYLES)],
                marker="o", markersize=3, color="black", label=plain(f"batch {batch}"))
    for gpu in result.gpus.values():
        ax.axhline(gpu.usable_bytes / 1e9, color=colour("gpu", gpu.gpu), linestyle="--", linewidth=1,
                   label=plain(f"{gpu.gpu} usable"))
    ax.axhline(result.weight_bytes / 1e9, color="gray", linestyle=":", linewidth=1, label="weights")
    _finish(ax, result.contexts, "context (positions in the KV cache)", "memory of a decode step",
            f"{name}: weights + KV cache + activations against context", lambda v: units.size(v * 1e9), log_x=False, log_y=False)


def measured_chart(run: Any) -> Any:
    """Per model: each step's measured p50 (interval as error bars) and its bound against batch, per phase."""
    measured = [(model, result) for model in run.models if (result := ok_result(model, "measure_serving"))]
    if not measured:
        raise RpxError("the results file has no measure_serving result to plot")
    plt = pyplot()
    figure, grid = plt.subplots(len(measured), 2, figsize=(10.8, 3.6 * len(measured)), squeeze=False)
    for (model, result), axes in zip(measured, grid):
        for ax, phase in zip(axes, ("prefill", "decode")):
            _measured_panel(ax, model.name, result, phase)
    figure.tight_layout()
    return figure


def _measured_panel(ax: Any, name: str, result: MeasureServingResult, phase: str) -> None:
    contexts = sorted({s.context for s in result.steps if s.phase == phase})
    for index, context in enumerate(contexts):
        steps = sorted((s for s in result.steps if s.phase == phase and s.context == context),
                       key=lambda s: s.batch_size)
        tint, style = colour("model", f"{name} {phase} {context}"), STYLES[index % len(STYLES)]
        xs, ys = [s.batch_size for s in steps], [s.p50_ms for s in steps]
        errors = [[y - (s.p50_interval_ms or (y, y))[0] for s, y in zip(steps, ys)],
                  [(s.p50_interval_ms or (y, y))[1] - y for s, y in zip(steps, ys)]]
        ax.errorbar(xs, ys, yerr=errors, fmt=style, marker="o", markersize=3, color=tint, capsize=2,
                    label=plain(f"measured p50, context {context:,}"))
        bounded = [s for s in steps if s.bound_ms is not None]
        if bounded:
            ax.plot([s.batch_size for s in bounded], [s.bound_ms for s in bounded], style, color=tint, alpha=0.5,
                    marker="_", markersize=8, label=plain(f"bound on {result.gpu}, context {context:,}"))
    _finish(ax, sorted({s.batch_size for s in result.steps}), "batch", f"{phase} step",
            f"{name}: {phase} measured against its bound", units.milliseconds, log_y=False)


def _finish(ax: Any, ticks: Sequence[int], xlabel: str, ylabel: str, title: str, show: Any, log_x: bool = True,
            log_y: bool = True) -> None:
    """x ticked at ``ticks`` (a log axis: base 2), y labelled in human units (a log axis: at 1, 2 and 5 of each
    decade; else from 0), title, grid, legend."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if log_x:
        ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    else:
        ax.set_ylim(bottom=0)
    ax.set_xticks(list(ticks), [f"{tick:,}" for tick in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: show(value)))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(plain(title), fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="best")


SERVE = Stage(
    "serve",
    "a decoder as served: prefill and decode steps with a real KV cache, bounded per GPU",
    result=ServeResult,
    options=ServeOptions,
    summary=serve_fields,
    tables=(TableView("serving", steps_table), TableView("serving_capacity", capacity_table)),
    figures=serve_figures,
    traits=serve_traits,
    charts=(ChartView("serving", "Serving: throughput against batch, memory against context", serving_chart),),
    doc="Count a prefill (``prompt`` tokens) and decode steps (one token against a KV cache of each ``context``) "
    "at each batch size on the meta device, store weights and KV cache in the formats asked for, and bound each "
    "step on every GPU of the spec: time to first token, time per output token, tokens/s, what fits, where decode "
    "turns compute-bound.",
)
MEASURE_SERVING = Stage(
    "measure_serving",
    "serve's prefill and decode steps timed on the backend, beside their bounds",
    result=MeasureServingResult,
    needs=("serve", "system_card"),
    options=MeasureServingOptions,
    executes=True,
    measures=True,
    check=measured_unquantised,
    summary=measured_fields,
    tables=(TableView("serving_measured", measured_table),),
    figures=measured_figures,
    charts=(ChartView("serving_measured", "Serving: steps measured against their bounds", measured_chart),),
    doc="Time ``ctx.results['serve']``'s steps on the backend: single synchronised calls against a KV cache filled "
    "to each step's length, with the median's interval and the bound of the GPU they ran on.",
)
