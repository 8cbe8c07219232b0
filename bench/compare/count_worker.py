"""One tool's counts of every model, with wall time and peak RSS, in a process of its own (one JSON line per model,
appended to the file named on the command line: tools print to stdout themselves).

A process per tool so peak RSS is that tool's alone and one tool's patches (thop and ptflops hook modules, calflops
and DeepSpeed patch torch functions) cannot touch another's count. Per model: the peak resident set is reset after
the imports (VmHWM via /proc/self/clear_refs), the model is built on the tool's device (meta for rpx, real CPU
tensors for the others) and counted; ``peak_rss_mb`` is the high-water mark above the resident set at the reset, so
it includes the weights a tool needs allocated. ``seconds`` is the median of ``REPEATS`` counts, each on a freshly
built model (building excluded), ``build_seconds`` the first build. One untimed count of the first model comes first,
and every model is built once on meta, so no model pays for lazy imports.

Run: python -m compare.count_worker TOOL OUT.jsonl   (from bench/, inside the comparison environment)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback

from compare.models import CASES, LLAMA70B
from compare.tools import Reading, tool
from rpx_plugins.host_memory import read_status_bytes, reset_peak_rss

REPEATS = 3
MB = 1e6


def one_count(counter, case) -> tuple[Reading, float, float, float]:
    """(reading, build seconds, count seconds, peak RSS bytes above the start) of one fresh build and count."""
    reset_peak_rss()
    start_rss = read_status_bytes("VmRSS") or 0
    began = time.perf_counter()
    model = case.build(counter.device)
    inputs = case.inputs(counter.device)
    built = time.perf_counter()
    try:
        reading = counter.count(model, inputs, case)
    except Exception as error:  # a tool failing on a model is a finding, recorded with its message
        message = str(error).strip().splitlines()
        reading = Reading(error=f"{type(error).__name__}: {message[0][:300] if message else ''}")
        traceback.print_exc(file=sys.stderr)
    counted = time.perf_counter()
    peak = max((read_status_bytes("VmHWM") or 0) - start_rss, 0)  # the RSS read just after the reset may be higher
    return reading, built - began, counted - built, peak


def main(name: str, out: str) -> None:
    counter = tool(name)
    if counter.distribution:  # import once before measuring, so no model pays for the tool's import
        __import__({"deepspeed": "deepspeed.profiling.flops_profiler"}.get(counter.distribution, counter.distribution))
    import transformers  # noqa: F401

    import rpx_core  # noqa: F401  (rpx imports torch and its own plugins lazily; every tool gets the same start)

    for case in CASES:  # transformers imports each model's modules on first use: paid here, outside the figures
        case.build("meta")
    one_count(counter, CASES[0])  # untimed: the tool's and rpx's lazy imports and first-call setup, paid once
    with open(out, "a") as lines:
        for case in (*CASES, LLAMA70B):
            if case is LLAMA70B and counter.device != "meta":
                row = {"model": case.name, "not_runnable": "real tensors"}
            else:
                reading, build_s, first_s, peak = one_count(counter, case)
                times = [first_s]
                if not reading.error:
                    times += [one_count(counter, case)[2] for _ in range(REPEATS - 1)]
                row = {"model": case.name, "params": reading.params, "macs": reading.macs, "notes": reading.notes,
                       "error": reading.error, "seconds": statistics.median(times), "build_seconds": build_s,
                       "peak_rss_mb": peak / MB}
            lines.write(json.dumps(row) + "\n")
            lines.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
