"""The built-in ``batch_search`` stage: runs the planner's trials through the backend contract only (inputs, calls,
timer, peak memory, out-of-memory recognition and recovery, memory budget), so it works on every backend that
reads peak memory or enforces a budget.

Whose memory: the budget holds this process's footprint (the allocator's reserved bytes, else allocated, plus the
process's own memory outside it: CUDA context, library handles; RSS on CPU). Other processes' use of the device
is recorded beside it and not counted; where the backend cannot tell the two apart, the result says so.

Every model of the pipeline is placed on the device before the first trial and stays there (a pipeline's models
are resident together), and each stage is called once at batch 1 (kernels loaded, library handles made). Then the
start is read (:class:`Start`): where the backend enforces a budget, its allocator is capped at the usable budget
less the process's memory outside the allocator, so the process as a whole fits it, and an allocator at the cap
gives back its cached blocks before it fails, as it would in deployment. A device whose free memory cannot hold the
usable budget is a note in the result. Before each measured region (each stage of a sequential trial, each
concurrent trial) the backend gives back what its allocator caches (``release_cached_memory``; the C heap's free
memory on CPU): a reserved peak otherwise starts from what the previous stage or trial left cached, and one trial's
cache would count against every later, smaller one. Concurrent stages run in one thread each, each inside the
backend's ``concurrent_worker`` (its own CUDA stream), so they overlap on the device. Inputs are made fresh for each
trial and dropped after it (``ctx.inputs`` would cache every size tried and inflate later trials). A trial that
raises the backend's out-of-memory error is recorded as "oom", every reference to its inputs and outputs is
dropped, and the backend recovers before the next trial; any other exception is a real failure and ends the stage.
"""

from __future__ import annotations

import statistics
import threading
import time
import traceback
from typing import Any, Callable, Sequence

import attrs

from rpx_core.plugin import (
    Backend,
    MemoryPeak,
    RpxError,
    RunContext,
    StageContext,
    Timer,
    UnsupportedError,
    hookimpl,
    with_partial,
)
from rpx_core.types.batch_search import (
    BatchSearchOptions,
    BatchSearchResult,
    BatchTracker,
    parse_memory_amount,
    used_bytes,
)
from rpx_plugins.batch_search.planner import BatchPlanner
from rpx_plugins.measurement import gc_paused

NO_READING = "no memory reading (out-of-memory errors at the enforced budget only)"


@hookimpl(trylast=True)
def rpx_batch_search(ctx: RunContext) -> BatchSearchResult:
    return run_search(ctx)


def run_search(ctx: RunContext, policy: type[BatchPlanner] = BatchPlanner) -> BatchSearchResult:
    """The search with the trials ``policy`` asks for (rpx_plugins.batch_search.direct_scan passes a plain
    bisection, so that it differs from the search in nothing else)."""
    options: BatchSearchOptions = ctx.options or BatchSearchOptions()
    stages = pipeline_stages(ctx.models, options.pipeline)
    backend, device = ctx.backend, stages[0].job.device
    budget = parse_memory_amount(options.memory_budget).resolve(lambda: device_memory_bytes(backend, device))
    margin = parse_memory_amount(options.safety_margin, allow_zero=True).resolve(lambda: budget)
    if margin >= budget:
        raise RpxError(f"options.batch_search.safety_margin: {margin} bytes leaves nothing of the {budget}-byte budget")
    planner = policy(
        names=tuple(stage.job.model.name for stage in stages),
        fan_outs=tuple(stage.job.model.fan_out for stage in stages),
        usable_bytes=budget - margin,
        max_batch=options.max_batch,
        concurrent=options.concurrent,
        gain_threshold=options.gain_threshold,
        resolution=options.resolution,
    )
    tracker = BatchTracker(planner.fan_outs, budget - margin)
    if ctx.previous is not None:  # resumed after an interruption: its finished trials count, the search goes on
        tracker.resume(ctx.previous.trials)
    start = Start()

    def outcome() -> BatchSearchResult:
        method = tracker.memory_method or start.method or NO_READING
        return planner.result(tracker.trials, budget_bytes=budget, safety_margin_bytes=margin,
                              budget_enforced=start.cap is not None, memory_method=method, **start.facts(budget - margin))

    try:
        runner = TrialRunner(backend, device, stages, [stage.model() for stage in stages], tracker, options.trial_seconds)
        start.read(runner, budget - margin)
        while (sizes := planner.next_combination(tracker.trials)) is not None:
            ctx.progress("batch-search trials", len(tracker.trials))
            runner.run(sizes, concurrent=options.concurrent)
    except KeyboardInterrupt as interrupt:  # keep the finished trials: recorded as the interrupted stage's result
        raise with_partial(interrupt, outcome()) from None
    finally:
        if start.cap is not None:
            backend.set_memory_budget(device, None)
        for stage in stages:
            stage.release()
        backend.release_cached_memory(device)  # what the last trial left cached is no one's
    return outcome()


def pipeline_stages(contexts: Sequence[StageContext], names: Sequence[str]) -> list[StageContext]:
    """The models named in ``pipeline`` in that order (default: all, in spec order); fan-outs must be positive."""
    by_name = {context.job.model.name: context for context in contexts}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise RpxError(
            f"options.batch_search.pipeline: no model named {', '.join(map(repr, unknown))}; "
            f"the spec has {', '.join(by_name)}"
        )
    if len(set(names)) != len(names):
        raise RpxError(f"options.batch_search.pipeline: a model appears twice in {list(names)}")
    stages = [by_name[name] for name in names] if names else list(contexts)
    for stage in stages:
        if not stage.job.model.fan_out > 0:
            raise RpxError(f"model {stage.job.model.name!r}: fan_out must be > 0, got {stage.job.model.fan_out}")
    return stages


def device_memory_bytes(backend: Backend, device: str) -> int:
    """The whole memory a fractional budget is taken of, as the backend reports it."""
    total = backend.device_memory_bytes(device)
    if total is None:
        raise UnsupportedError(
            f"a fractional memory_budget needs device {device!r}'s memory size, which backend {backend.name!r} cannot "
            "report; give bytes or a size with a unit"
        )
    return total


@attrs.define
class Start:
    """Where the search starts: this process's footprint with every model resident and each stage called once at
    batch 1 (the CUDA context has loaded those kernels, the libraries their handles), other processes' use of the
    device and its free memory then; the cap put on the framework allocator from it."""

    reading: MemoryPeak | None = None
    cap: int | None = None  # None: the backend does not enforce a budget

    @property
    def method(self) -> str | None:
        return None if self.reading is None else self.reading.method

    def read(self, runner: TrialRunner, usable: int) -> None:
        """Warm up, read, and cap the allocator at the usable budget less this process's memory outside it."""
        backend, device = runner.backend, runner.device
        runner.warm_up()
        backend.release_cached_memory(device)
        backend.reset_peak_memory(device)
        self.reading = backend.read_peak_memory(device)
        cap = usable - (self.reading.outside_allocator_bytes or 0)
        if cap <= 0:
            raise RpxError(
                f"options.batch_search: the usable budget ({usable / 1e6:.0f} MB) is less than this process's memory "
                f"outside the framework allocator ({self.reading.outside_allocator_bytes / 1e6:.0f} MB: "
                f"{self.reading.method})"
            )
        if backend.set_memory_budget(device, cap):
            self.cap = cap
        elif self.reading.peak_bytes is None and self.reading.reserved_bytes is None:
            raise UnsupportedError(
                f"batch_search needs peak-memory readings or an enforced memory budget; backend {backend.name!r} has "
                f"neither ({self.reading.method})"
            )

    def facts(self, usable: int) -> dict[str, Any]:
        """The result's fields about the start, with the notes a reader needs to act on the figures."""
        if self.reading is None:
            return {}
        own, others, free = used_bytes(self.reading), self.reading.other_processes_bytes, self.reading.device_free_bytes
        notes = []
        if self.reading.outside_allocator_bytes is not None and others is None:
            notes.append(
                "other processes' use of the device could not be told apart from this process's (see memory_method): "
                "all memory outside this process's allocator counts against the budget"
            )
        if own is not None and free is not None and free < usable - own:
            busy = "" if others is None else f"; other processes use {others / 1e6:.0f} MB"
            notes.append(
                f"only {free / 1e6:.0f} MB of the device is free beside this process's {own / 1e6:.0f} MB, less than "
                f"the usable budget of {usable / 1e6:.0f} MB{busy}: trials near the limit fail for the device's "
                "memory, not the budget's"
            )
        return dict(allocator_cap_bytes=self.cap, start_bytes=own, others_at_start_bytes=others,
                    free_at_start_bytes=free, notes=tuple(notes))


#: A trial's timed calls are split into this many chunks, each timed on its own, so the trial knows its noise.
NOISE_CHUNKS = 5


@attrs.frozen
class Timed:
    calls: int
    seconds: float  # backend timer, summed over the chunks
    noise: float | None  # (max - min) / (2 x median) of the chunks' calls per second; None with one chunk


def timed_until(call: Callable[[], Any], timer: Timer, seconds: float, chunks: int = NOISE_CHUNKS) -> Timed:
    """Back-to-back calls until ``seconds`` of host time passed (at least one call per chunk), in ``chunks`` chunks
    of equal host time, each timed by the backend timer (which synchronises on both ends, so queued device work is
    inside it). A chunk makes at least one call; no chunk starts once ``seconds`` passed, so a call slower than the
    whole trial makes one chunk (and no noise figure) as before, not ``chunks`` calls."""
    per_chunk = seconds / chunks
    rates: list[float] = []
    calls = 0
    elapsed = 0.0
    ends = time.perf_counter() + seconds
    for _ in range(chunks):
        if calls and time.perf_counter() >= ends:
            break
        timer.start()
        deadline = time.perf_counter() + per_chunk
        made = 0
        while True:
            call()
            made += 1
            if time.perf_counter() >= deadline:
                break
        chunk = timer.stop()
        calls, elapsed = calls + made, elapsed + chunk
        if chunk > 0:
            rates.append(made / chunk)
    return Timed(calls, elapsed, chunk_noise(rates))


def chunk_noise(rates: Sequence[float]) -> float | None:
    """Half the range of the chunks' rates relative to their median: ±noise around the trial's rate."""
    if len(rates) < 2:
        return None
    return (max(rates) - min(rates)) / (2 * statistics.median(rates))


def drop_frames(exc: BaseException) -> None:
    """Clear the local variables of the frames in ``exc``'s traceback and in those of the exceptions it chains: the
    failed call's inputs and activations would otherwise live as long as the exception object (a model or library
    may keep the exception it raised)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


@attrs.define
class TrialRunner:
    """Runs one combination of batch sizes and reports it to the tracker."""

    backend: Backend
    device: str
    stages: list[StageContext]
    models: list[Any]
    tracker: BatchTracker
    trial_seconds: float

    def run(self, sizes: tuple[int, ...], concurrent: bool) -> None:
        started = time.perf_counter()
        self.tracker.begin_trial(sizes)
        with gc_paused():
            peak = self._run_together(sizes) if concurrent else self._run_each(sizes)
        self.tracker.end_trial(seconds=time.perf_counter() - started, peak=peak)

    def _run_each(self, sizes: tuple[int, ...]) -> None:
        """Stages one after another, each with its own peak; a stage out of memory does not stop the others."""
        for stage, size in enumerate(sizes):
            self._start_region()
            error = None
            try:
                timed = self._measure(stage, size)
            except Exception as exc:
                if not self.backend.is_out_of_memory(exc):
                    raise
                error = f"{type(exc).__name__}: {exc}"
                drop_frames(exc)
            if error is None:
                peak = self.backend.read_peak_memory(self.device)
                self.tracker.record_stage(stage, calls=timed.calls, seconds=timed.seconds, peak=peak, noise=timed.noise)
            else:  # the exception and the frames holding the inputs are gone here
                self.backend.recover_from_oom(self.device)
                self.tracker.record_stage(stage, failure="oom", error=error)

    def _run_together(self, sizes: tuple[int, ...]) -> MemoryPeak | None:
        """Stages at the same time, one thread each, timed from a common start; one peak for the trial."""
        barrier = threading.Barrier(len(sizes))
        errors: list[str | None] = [None] * len(sizes)
        unexpected: list[BaseException] = []

        def work(stage: int) -> None:
            try:
                with self.backend.concurrent_worker(self.device):
                    timed = self._measure(stage, sizes[stage], before_timing=barrier.wait)
            except threading.BrokenBarrierError:
                return  # another stage failed before timing started
            except Exception as exc:
                barrier.abort()
                if self.backend.is_out_of_memory(exc):
                    errors[stage] = f"{type(exc).__name__}: {exc}"
                    drop_frames(exc)
                else:
                    unexpected.append(exc)
                return
            self.tracker.record_stage(stage, calls=timed.calls, seconds=timed.seconds, noise=timed.noise)

        self._start_region()
        threads = [threading.Thread(target=work, args=(stage,), name=f"rpx-batch-{stage}") for stage in range(len(sizes))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        peak = self.backend.read_peak_memory(self.device)
        if unexpected:
            raise unexpected[0]
        if not any(errors):
            return peak
        for stage, error in enumerate(errors):
            if error:
                self.tracker.record_stage(stage, failure="oom", error=error)
        self.backend.recover_from_oom(self.device)
        return None

    def warm_up(self) -> None:
        """Each stage called once at batch 1, untimed; an out-of-memory error is left for the first trial to meet."""
        for stage in range(len(self.stages)):
            try:
                self._call_once(stage)
            except Exception as exc:
                if not self.backend.is_out_of_memory(exc):
                    raise
                drop_frames(exc)
                self.backend.recover_from_oom(self.device)

    def _call_once(self, stage: int) -> None:
        job = self.stages[stage].job
        args, kwargs = self.backend.make_inputs(job.model, 1, job.precision, job.device)
        with self.backend.inference_context():
            self.backend.call_model(self.models[stage], args, kwargs)

    def _start_region(self) -> None:
        """A clean start for a measured region: nothing cached by earlier regions, peaks reset."""
        self.backend.release_cached_memory(self.device)
        self.backend.reset_peak_memory(self.device)

    def _measure(self, stage: int, size: int, before_timing: Callable[[], Any] = lambda: None) -> Timed:
        """Fresh inputs, one untimed warm-up call, then timed calls; inputs and outputs die with this frame."""
        job = self.stages[stage].job
        args, kwargs = self.backend.make_inputs(job.model, size, job.precision, job.device)
        model, call_model = self.models[stage], self.backend.call_model
        timer = self.backend.timer(self.device)
        with self.backend.inference_context():  # thread-local in torch: entered in the thread that calls
            call_model(model, args, kwargs)
            before_timing()
            return timed_until(lambda: call_model(model, args, kwargs), timer, self.trial_seconds)
