"""The comparison's tables in Markdown, and the reason each tool's count is off the hand-derived value.

A count is "exact" within ``EXACT`` (relative); otherwise the reason is worked out from the model's analytic parts:
twice the MACs is the FLOP/MAC convention, the MACs less the attention part is a missed fused attention kernel, a
parameter count over by the shared elements counts a tied weight twice; anything else is said as the relative
difference with the tool's own notes (unsupported operators).
"""

from __future__ import annotations

import statistics

from compare.models import CASES, Analytic, case
from compare.tools import TOOLS

EXACT = 1e-4
#: A count between the MACs less attention and this multiple of that is read as "attention missed, other work added".
ADDED_WORK = 1.05


def close(value: float, target: float) -> bool:
    return abs(value - target) <= EXACT * max(abs(target), 1)


def macs_reason(macs: float, analytic: Analytic) -> str | None:
    """None when exact; else why, in a few words."""
    if close(macs, analytic.macs):
        return None
    if close(macs, 2 * analytic.macs):
        return "reports FLOPs (2 x MACs) as MACs"
    if analytic.attention_macs and close(macs, analytic.macs - analytic.attention_macs):
        return "attention kernel (SDPA) not counted"
    difference = macs / analytic.macs - 1
    if difference > 0:
        return f"{difference:+.1%}: counts element-wise, norm or pooling work as MACs"
    without_attention = analytic.macs - analytic.attention_macs
    if analytic.attention_macs and without_attention < macs < ADDED_WORK * without_attention:
        return (f"attention kernel (SDPA) not counted, and {macs / without_attention - 1:+.1%} element-wise, norm or "
                "pooling work counted as MACs")
    if analytic.attention_macs and macs < without_attention:
        return f"{difference:+.1%}: attention (SDPA) and more not counted"
    return f"{difference:+.1%} net"


def params_reason(params: int, analytic: Analytic) -> str | None:
    if params == analytic.params:
        return None
    if analytic.shared_params and params == analytic.params + analytic.shared_params:
        return "tied weight counted twice"
    if params < analytic.params:
        return f"params {params / analytic.params - 1:+.1%}: parameters outside the layers it has rules for missed"
    return f"params {params / analytic.params - 1:+.1%}"


def human(value: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value:.4g}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def accuracy_tables(counts: dict[str, dict[str, dict]], unavailable: dict[str, str]) -> str:
    """MACs per tool as the relative difference to the analytic value; parameters likewise; the reasons."""
    tools = [t.name for t in TOOLS if t.name in counts]
    mac_rows, param_rows, reason_rows = [], [], []
    for model in CASES:
        analytic = model.analytic
        mac_cells, param_cells, reasons = [], [], []
        for name in tools:
            reading = counts[name].get(model.name, {})
            if reading.get("error") or reading.get("macs") is None:
                mac_cells.append("failed")
                param_cells.append("failed")
                reasons.append(f"**{name}**: failed ({reading.get('error', 'no result')})")
                continue
            why = macs_reason(reading["macs"], analytic)
            mac_cells.append("exact" if why is None else f"{reading['macs'] / analytic.macs - 1:+.1%}")
            params = reading.get("params")
            param_why = None if params is None else params_reason(params, analytic)
            param_cells.append("n/a" if params is None else "exact" if param_why is None else
                               f"{params / analytic.params - 1:+.1%}")
            said = [text for text in (why, param_why) if text]
            notes = [note for note in reading.get("notes", []) if why or name == "rpx"]
            if said or (notes and name == "rpx"):
                reasons.append(f"**{name}**: " + "; ".join(said + notes))
        mac_rows.append([model.name, human(analytic.macs), *mac_cells])
        param_rows.append([model.name, human(analytic.params), *param_cells])
        reason_rows.append([model.name, "<br>".join(reasons) or "all exact"])
    parts = ["MACs, relative to the hand-derived value (\"exact\": within 0.01%):", "",
             table(["model", "analytic MACs", *tools], mac_rows), "",
             "Parameters, relative to the hand-derived value (a tied weight counted once; n/a: the tool counts none):",
             "", table(["model", "analytic params", *tools], param_rows), "",
             "Which tools are off, and why:", "", table(["model", "off and why"], reason_rows)]
    if unavailable:
        parts += ["", "Not run: " + "; ".join(f"{name}: {why}" for name, why in unavailable.items())]
    return "\n".join(parts)


def speed_table(counts: dict[str, dict[str, dict]], memory_gb: float) -> tuple[str, dict[str, float]]:
    """Seconds and peak RSS per tool and model as ratios to rpx's; the median ratios per tool."""
    tools = [t.name for t in TOOLS if t.name in counts and t.name != "rpx"]
    rpx = counts["rpx"]
    rows, ratios = [], {name: [] for name in tools}
    for model in (*CASES, case("llama2-70b")):
        mine = rpx.get(model.name, {})
        if mine.get("seconds") is None:
            continue
        cells = [model.name, f"{mine['seconds']:.3f} s / {mine['peak_rss_mb']:.0f} MB"]
        for name in tools:
            theirs = counts[name].get(model.name, {})
            if theirs.get("not_runnable"):
                weights_gb = (mine["params"] or 0) * 4 / 1e9
                cells.append(f"not runnable: {weights_gb:.0f} GB of fp32 weights, {memory_gb:.0f} GB RAM")
            elif theirs.get("error") or theirs.get("seconds") is None:
                cells.append("failed")
            else:
                ratio = theirs["seconds"] / mine["seconds"]
                ratios[name].append(ratio)
                cells.append(f"{ratio:.2f}x / {theirs['peak_rss_mb'] / max(mine['peak_rss_mb'], 1):.1f}x "
                             f"({theirs['seconds']:.3f} s, {theirs['peak_rss_mb']:.0f} MB)")
        rows.append(cells)
    medians = {name: statistics.median(values) for name, values in ratios.items() if values}
    rows.append(["**median time ratio**", "1", *[f"{medians[n]:.2f}x" if n in medians else "-" for n in tools]])
    return table(["model", "rpx (meta): time / peak RSS", *tools], rows), medians


def latency_table(rows: list[dict]) -> str:
    body = [[r["workload"], r["condition"], f"{r['load_average']:.1f}",
             f"{r['rpx_p50_ms']:.3f} [{r['rpx_low_ms']:.3f}, {r['rpx_high_ms']:.3f}]" + (
                 f" {r['rpx_verdict']}" if r["rpx_verdict"] else ""),
             f"{r['timer_median_ms']:.3f}", f"{r['pyperf_mean_ms']:.3f} +- {r['pyperf_std_ms']:.3f}",
             f"{r['rpx_p50_ms'] / r['timer_median_ms']:.3f}"]
            for r in rows]
    intervals = sorted({r["rpx_interval"] for r in rows})
    return (table(["workload", "condition", "load avg", "rpx p50 [interval] ms", "torch.utils.benchmark median ms",
                   "pyperf mean +- std ms", "rpx / timer"], body)
            + f"\n\nrpx interval: {'; '.join(intervals)}.")


def batch_table(result: dict) -> str:
    rows = [[str(r["limit"]), f"{r['rpx_found']}", str(r["rpx_trials"]), f"{r['rpx_seconds']:.1f}",
             f"{r['base_found']}", str(r["base_trials"]), f"{r['base_seconds']:.1f}",
             f"{r['rpx_trials'] / r['base_trials']:.2f}"] for r in result["real"]]
    oracle = result["oracle"]
    return (f"Workload: {result['workload']} (direct scan of batch 1..{result['scan_up_to']} for the true limit: "
            f"{result['scan_seconds']:.1f} s).\n\n"
            + table(["true limit", "rpx found", "rpx trials", "rpx s", "doubling+bisection found", "its trials",
                     "its s", "trials ratio"], rows)
            + f"\n\nOn the scan's memory curve (its line beyond {result['scan_up_to']}), {oracle['budgets']} budgets with limits 3..250: "
              f"rpx {oracle['rpx_mean']:.2f} trials on average (max {oracle['rpx_max']}), doubling+bisection "
              f"{oracle['base_mean']:.2f} (max {oracle['base_max']}), ratio {oracle['rpx_mean'] / oracle['base_mean']:.2f}; "
              f"results not within 5% at or below the true limit: {oracle['misses'] or 'none'}.")
