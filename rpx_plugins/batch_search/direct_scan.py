"""The reference batch search is checked against: each stage's memory limit found by plain bisection of real
trials, run by the batch_search stage's own code, so under the same conditions (every model resident, each stage
warmed up, the same cap on the allocator, caches given back before each trial, the same timed calls). A limit the
search reports that differs from this one by more than its resolution is the search's defect, not a measurement's.

It needs about log2(max_batch) trials (all stages at once), where the search needs 5 to 8: the GPU check, the
tests and ``bench/bench_batch_search.py`` run it; ``rpx run`` never does. Sequential stages only (concurrent stages
share one limit, which has no single bisection).
"""

from __future__ import annotations

from typing import Sequence

import attrs

from rpx_core.plugin import RpxError, RunContext
from rpx_core.types.batch_search import BatchSearchOptions, BatchSearchResult, Trial
from rpx_plugins.batch_search.planner import BatchPlanner
from rpx_plugins.batch_search.stage import run_search


@attrs.frozen
class Bisection(BatchPlanner):
    """Each stage's size halves the gap between the largest size that fit and the smallest that failed (none yet:
    0 and max_batch + 1) until they are adjacent; a stage already bracketed runs its largest fitting size."""

    def next_combination(self, trials: Sequence[Trial]) -> tuple[int, ...] | None:
        views = [self._sequential_view(trials, stage) for stage in range(len(self.names))]
        if any(view.hi == 1 for view in views):
            return None  # a stage does not fit even at batch 1
        gaps = [(view.lo or 0, view.hi) for view in views]
        if all(hi - lo <= 1 for lo, hi in gaps):
            return None
        return tuple((lo + hi) // 2 if hi - lo > 1 else lo for lo, hi in gaps)


def direct_scan(ctx: RunContext) -> BatchSearchResult:
    """Every stage's exact limit under ``ctx``'s options (their resolution and throughput rules do not apply)."""
    options: BatchSearchOptions = ctx.options or BatchSearchOptions()
    if options.concurrent:
        raise RpxError("a direct scan bisects each stage on its own; it cannot check concurrent stages")
    return run_search(ctx, Bisection)
