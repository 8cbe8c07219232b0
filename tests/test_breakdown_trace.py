"""The breakdown's arithmetic over profiler events, with no GPU: which operator launched each kernel, how device time
is shared out, how profiled operators are matched to counted calls, and how the tables add up. Synthetic traces with
hand-computed answers here; the traces recorded on an H200 in tests/test_breakdown_h200.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rpx_core.types.breakdown import IDLE_ROW, NO_OPERATOR_ROW, BreakdownOptions, StageCost
from rpx_core.types.counts import OpRecord
from rpx_plugins.breakdown.attribution import Measured, attribute, breakdown, median_call
from rpx_plugins.breakdown.matching import align, common_pairs, fill_modules, key, shapes_of
from rpx_plugins.breakdown.rows import Roof, device_time, tables
from rpx_plugins.breakdown.trace import MARKER, read_calls, tensor_shapes

#: The operators that decompose into others in these traces (torch's CompositeImplicitAutograd ones).
COMPOSITE = {"aten::linear", "aten::matmul", "aten::to"}


def decomposes(name: str) -> bool:
    return name in COMPOSITE


def not_free(name: str) -> bool:
    return False


def op(name: str, ts: float, dur: float, external: int, dims: list | None = None, types: list | None = None,
       tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": external, "Input Dims": dims or [], "Input type": types or []}}


def kernel(name: str, ts: float, dur: float, correlation: int, external: int | None) -> dict[str, Any]:
    args = {"correlation": correlation, "stream": 7}
    if external is not None:
        args["External id"] = external
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


def launch(ts: float, correlation: int, external: int, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2,
            "args": {"correlation": correlation, "External id": external}}


def linear_then_copy() -> list[dict[str, Any]]:
    """A GPU call: linear (t, then matmul -> mm, whose cuBLAS kernel goes through the driver API), then to ->
    _to_copy -> copy_ (an elementwise kernel), then a kernel no operator launched.

    Host:   linear [0, 40]: t [2, 6], matmul [8, 38] > mm [10, 36] launches at 20 (cuLaunchKernelEx);
            to [50, 80] > _to_copy [52, 78] > copy_ [60, 76] launches at 70, without an External id on the kernel.
    Device: nvjet [30, 130], elementwise [140, 150], orphan [160, 170].
    """
    return [
        op("aten::linear", 0, 40, 1, [[4, 8], [16, 8], []], ["float", "float", ""]),
        op("aten::t", 2, 4, 2, [[16, 8]], ["float"]),
        op("aten::matmul", 8, 30, 3, [[4, 8], [8, 16]], ["float", "float"]),
        op("aten::mm", 10, 26, 4, [[4, 8], [8, 16]], ["float", "float"]),
        launch(20, 100, 4, "cuLaunchKernelEx"),
        kernel("nvjet_sm90_tst_64x16_TNT", 30, 100, 100, 4),
        op("aten::to", 50, 30, 5, [[4, 16], [], [], [], []], ["float", "Scalar", "", "", ""]),
        op("aten::_to_copy", 52, 26, 6, [[4, 16], []], ["float", "Scalar"]),
        op("aten::copy_", 60, 16, 7, [[4, 16], [4, 16], []], ["c10::BFloat16", "float", "Scalar"]),
        launch(70, 101, 7),
        kernel("void at::native::unrolled_elementwise_kernel<direct_copy>", 140, 10, 101, None),
        kernel("orphan_kernel", 160, 10, 102, None),
    ]


def test_kernels_go_to_the_outermost_operator_of_their_nest_that_does_not_decompose() -> None:
    (trace,) = read_calls(linear_then_copy(), decomposes)
    assert [(o.name, o.shapes) for o in trace.ops] == [
        ("aten.t", ("[16,8]",)), ("aten.mm", ("[4,8]", "[8,16]")), ("aten._to_copy", ("[4,16]",))]
    owners = [(a.name, None if a.op is None else trace.ops[a.op].name, a.launched) for a in trace.activities]
    assert owners == [("nvjet_sm90_tst_64x16_TNT", "aten.mm", 20),  # by External id, launched through the driver
                      ("void at::native::unrolled_elementwise_kernel<direct_copy>", "aten._to_copy", 70),  # by time
                      ("orphan_kernel", None, None)]
    assert (trace.start, trace.end, trace.on_device) == (0, 170, True)


def test_a_cpu_trace_times_each_kept_operator_itself() -> None:
    events = [event for event in linear_then_copy() if event["cat"] == "cpu_op"]
    (trace,) = read_calls(events, decomposes)
    assert not trace.on_device
    assert [(a.name, a.start, a.end, a.op) for a in trace.activities] == [
        ("aten.t", 2, 6, 0), ("aten.mm", 10, 36, 1), ("aten._to_copy", 52, 78, 2)]


def test_markers_split_the_trace_into_calls_and_other_threads_are_left_out() -> None:
    marker = {"ph": "X", "cat": "user_annotation", "name": MARKER, "pid": 1, "tid": 1}
    first = [op("aten::mm", 10, 10, 1), op("aten::add", 30, 5, 2)]
    second = [op("aten::mm", 110, 30, 3), op("aten::add", 150, 5, 4), op("aten::mul", 120, 5, 9, tid=2)]
    on_gpu = {**marker, "cat": "gpu_user_annotation", "pid": 0, "tid": 7, "ts": 50, "dur": 30}  # Kineto's copy
    calls = read_calls([{**marker, "ts": 0, "dur": 40}, *first, on_gpu, {**marker, "ts": 100, "dur": 60}, *second],
                       decomposes)
    assert [[(o.name, o.start) for o in call.ops] for call in calls] == [
        [("aten.mm", 10), ("aten.add", 30)], [("aten.mm", 110), ("aten.add", 150)]]
    assert [(call.start, call.end) for call in calls] == [(0, 40), (100, 160)]
    assert median_call(calls) is calls[0]  # busy 15 us and 35 us: the lower of two is the median


@pytest.mark.parametrize(("dims", "types", "shapes"), [
    ([[2, 3], [], []], ["float", "Scalar", ""], ("[2,3]",)),
    ([[[1, 2], [1, 3]], []], ["TensorList", "Scalar"], ("[1,2]", "[1,3]")),  # torch.cat's list
    ([[2048], []], ["long int", "long int"], ("[2048]", "[]")),  # a 0-dim tensor is a tensor
    ([[], []], ["TensorList", "ScalarList"], ()),  # an empty list
])
def test_tensor_shapes_of_an_operator_event(dims: list, types: list, shapes: tuple) -> None:
    assert tensor_shapes({"Input Dims": dims, "Input type": types}) == shapes


def test_device_time_splits_overlaps_evenly_and_charges_gaps_to_the_next_activity() -> None:
    # [0, 10] and [5, 15] overlap on [5, 10]: 5 + 2.5 each; [20, 24] after a 5 us gap; the call starts at -3
    events = [op("aten::a", -3, 1, 1), op("aten::b", -2, 1, 2), op("aten::c", -1, 1, 3),
              kernel("k1", 0, 10, 11, 1), kernel("k2", 5, 10, 12, 2), kernel("k3", 20, 4, 13, 3)]
    (trace,) = read_calls(events, decomposes)
    shares, idle = device_time(trace)
    assert shares == [7.5, 7.5, 4.0] and sum(shares) == 19.0  # the union: [0, 15] and [20, 24]
    assert idle == [3.0, 0.0, 5.0]


def calls_of(*specs: tuple[str, str, str, int, int]) -> list[OpRecord]:
    """(op, inputs, module, flops, bytes) -> counted calls (count 1; the bytes all read)."""
    return [OpRecord(op=name, module=module, count=1, flops=flops, macs=0, bytes_read=nbytes, bytes_written=0,
                     inputs=inputs) for name, inputs, module, flops, nbytes in specs]


def test_alignment_matches_name_and_shapes_first_then_names_between_matches() -> None:
    profiled = [("aten.mm", ("[4,8]", "[8,16]")), ("aten.cat", ()), ("aten.add", ("[4,16]", "[4,16]")),
                ("aten.bmm", ("[1,2,3]", "[1,3,4]")), ("aten.gelu", ("[4,16]",))]
    counted = [("aten.mm", ("[4,8]", "[8,16]")), ("aten.cat", ("[2,16]", "[2,16]")), ("aten.add", ("[4,16]", "[4,16]")),
               ("aten.mul", ("[1,2,3]",)), ("aten.gelu", ("[4,16]",))]
    # cat: recorded without its list's shapes, matched by name between two matches; bmm and mul: no match
    assert align(profiled, counted) == [0, 1, 2, None, 4]


def test_alignment_keeps_each_call_in_its_own_layer_where_a_few_calls_differ() -> None:
    """A model repeats its layers: an alignment that only looks for long common blocks pairs calls with the same
    call of another layer (difflib's blocks pair the first 96 calls here with layer 28's and leave 2,923 of the
    4,160 unmatched); the fewest edits pair each with its own and leave only the calls that differ."""
    layer = [("aten.view", ("[1,64]",)), ("aten.mm", ("[64,64]", "[64,64]"))] * 10 + [
        ("aten.mul", ("[1,64]", "[64]")), ("aten.add", ("[1,64]", "[1,64]")), ("aten.cat", ("[1,64]",)),
        ("aten.t", ("[64,64]",))] * 8
    profiled = layer * 80
    counted = [("aten.bmm", ("[1]",)) if index % 97 == 0 else call for index, call in enumerate(profiled)]
    matched = align(profiled, counted)
    assert [index for index, found in enumerate(matched) if found is None] == list(range(0, len(profiled), 97))
    assert all(found == index for index, found in enumerate(matched) if found is not None)
    shifted = counted[:50] + counted[51:]  # one counted call missing: every later call one place earlier
    assert align(profiled, shifted)[1000] == 999


@given(st.lists(st.sampled_from("abc"), max_size=12), st.lists(st.sampled_from("abc"), max_size=12))
def test_common_pairs_are_a_longest_common_subsequence(first: list[str], second: list[str]) -> None:
    pairs = common_pairs(first, second)
    assert all(first[i] == second[j] for i, j in pairs)
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(pairs, pairs[1:]))
    lengths = [[0] * (len(second) + 1) for _ in range(len(first) + 1)]  # the textbook dynamic programme
    for i, a in enumerate(first):
        for j, b in enumerate(second):
            lengths[i + 1][j + 1] = lengths[i][j] + 1 if a == b else max(lengths[i][j + 1], lengths[i + 1][j])
    assert len(pairs) == lengths[-1][-1]


def test_families_match_kernels_that_do_the_same_work_under_another_name() -> None:
    qkv = ("[1,12,128,64]",) * 3
    assert key("aten._scaled_dot_product_cudnn_attention", (*qkv, "[1,1,128,128]")) == key(
        "aten._scaled_dot_product_flash_attention_for_cpu", qkv)
    assert key("aten.cudnn_batch_norm", ("[1,64,56,56]", "[64]")) == key(
        "aten._native_batch_norm_legit_no_training", ("[1,64,56,56]", "[64]", "[64]"))
    assert key("aten.mm", ("[1,2]",)) != key("aten.bmm", ("[1,2]",))
    assert shapes_of("bfloat16[2048,4096], int64[1,2048], float32[]") == ("[2048,4096]", "[1,2048]", "[]")


def test_unmatched_calls_get_the_deepest_module_enclosing_their_matched_neighbours() -> None:
    modules = ["a.b.c", None, "a.b.d", None, "a.x", None, None]
    assert fill_modules(modules, "(root)") == ["a.b.c", "a.b", "a.b.d", "a", "a.x", "(root)", "(root)"]
    assert fill_modules([None, "a"], "(root)") == ["(root)", "a"]


def gpu_call_with_counts() -> tuple[Any, list[OpRecord]]:
    (trace,) = read_calls(linear_then_copy(), decomposes)
    counted = calls_of(("aten.t", "float32[16,8]", "proj", 0, 0),
                       ("aten.mm", "float32[4,8], float32[8,16]", "proj", 1024, 768),
                       ("aten._to_copy", "float32[4,16]", "head", 0, 384))
    return trace, counted


def test_the_tables_add_up_to_the_measured_call_with_idle_and_orphan_rows() -> None:
    trace, counted = gpu_call_with_counts()
    joined = attribute(trace, counted, not_free)
    assert [call.module for call in joined.counted] == ["proj", "proj", "head"] and joined.matched == 3
    roof = Roof(peak_flops=1024 / 10e-6, bandwidth=768 / 50e-6)  # mm: compute 10 us, memory 50 us
    built = tables([trace], joined.counted, joined.modules, call_ms=0.5, roof=roof, module_depth=3, overhead_below=0.1)
    rows = {row.name: row for row in built.operators}
    mm = rows["aten.mm"]
    assert mm.time_ms == pytest.approx(0.1) and mm.kernels == 1 and mm.idle_before_ms == pytest.approx(0.03)
    assert mm.bound_ms == pytest.approx(0.05) and mm.bottleneck == "memory" and mm.fraction == pytest.approx(0.5)
    assert mm.limited_by == "memory" and mm.excess_ms == pytest.approx(0.05)
    assert mm.flops_per_s == pytest.approx(1024 / 100e-6) and mm.bytes_per_s == pytest.approx(768 / 100e-6)
    copy = rows["aten._to_copy"]  # 384 B in 10 us against a 25 us memory bound: faster than the roof says
    assert copy.time_ms == pytest.approx(0.01) and copy.fraction == pytest.approx(2.5)
    assert rows[NO_OPERATOR_ROW].time_ms == pytest.approx(0.01) and rows[NO_OPERATOR_ROW].calls == 1
    assert built.busy_ms == pytest.approx(0.12) and rows[IDLE_ROW].time_ms == pytest.approx(0.38)
    assert sum(row.time_ms for row in built.operators) == pytest.approx(0.5) == built.total_ms
    assert sum(row.share for row in built.operators) == pytest.approx(1.0)
    assert "aten.t" not in rows  # a view: no time, no work


def test_module_rows_nest_and_add_up_to_their_parents() -> None:
    trace, _ = gpu_call_with_counts()
    counted = calls_of(("aten.t", "float32[16,8]", "enc.layer.proj", 0, 0),
                       ("aten.mm", "float32[4,8], float32[8,16]", "enc.layer.proj", 1024, 768),
                       ("aten._to_copy", "float32[4,16]", "enc", 0, 384))
    joined = attribute(trace, counted, not_free)
    built = tables([trace], joined.counted, joined.modules, call_ms=0.5, roof=None, module_depth=2, overhead_below=0.1)
    rows = {row.name: row for row in built.modules}
    assert [(row.name, row.parent) for row in built.modules] == [
        ("(root)", None), ("enc", "(root)"), ("enc.layer", "enc"), (IDLE_ROW, None), (NO_OPERATOR_ROW, None)]
    assert rows["enc.layer"].self_ms == pytest.approx(0.1)  # enc.layer.proj folded into it at depth 2
    assert rows["enc"].self_ms == pytest.approx(0.01) and rows["enc"].time_ms == pytest.approx(0.11)
    for row in built.modules:
        children = [child.time_ms for child in built.modules if child.parent == row.name]
        if row.self_ms is not None:
            assert row.time_ms == pytest.approx(row.self_ms + sum(children))
    assert sum(row.time_ms for row in built.modules if row.parent is None) == pytest.approx(0.5)
    assert rows["enc"].bound_ms is None and rows["enc"].flops == 1024  # no roof: no bound, the work still counted


def test_operators_the_counter_did_not_see_have_time_but_no_work_and_are_said() -> None:
    _, counted = gpu_call_with_counts()
    result = breakdown(linear_then_copy(), counted[:2], Measured(0.05, 5, "clock"), decomposes=decomposes,
                       free=not_free, roof=None, bound_convention="no bound", options=BreakdownOptions(),
                       cost=StageCost(0, 0, 0, 0, 0))
    copy = next(row for row in result.operators if row.name == "aten._to_copy")
    assert not copy.counted and copy.flops is None and copy.time_ms == pytest.approx(0.01)
    assert result.unmatched_profiled == 1 and result.unmatched_counted == 0
    assert result.total_ms == pytest.approx(0.12) and result.idle_ms == 0  # busy above the 0.05 ms call
    assert any("more than the 0.05 ms call" in note for note in result.notes)
    assert any("1 profiled operator call(s)" in note for note in result.notes)


def three_calls(second_ops: tuple[str, str] = ("aten::a", "aten::b")) -> list[dict[str, Any]]:
    """Three profiled calls of operators a and b; a is descheduled in the second call, b runs longer in the third."""
    marker = {"ph": "X", "cat": "user_annotation", "name": MARKER, "pid": 1, "tid": 1, "dur": 5}
    durations = [(10, 20), (100, 20), (10, 30)]
    events = []
    for index, (a, b) in enumerate(durations):
        base, names = 1000 * index, second_ops if index == 1 else ("aten::a", "aten::b")
        events += [{**marker, "ts": base}, op(names[0], base + 1, 1, 10 * index + 1),
                   op(names[1], base + 2, 1, 10 * index + 2), kernel("ka", base + 10, a, 10 * index + 1, 10 * index + 1),
                   kernel("kb", base + 200, b, 10 * index + 2, 10 * index + 2)]
    return events


def test_several_profiled_calls_give_each_operator_its_median() -> None:
    counted = calls_of(("aten.a", "", "m", 0, 0), ("aten.b", "", "m", 0, 0))
    settings = dict(decomposes=decomposes, free=not_free, roof=None, bound_convention="", options=BreakdownOptions(),
                    cost=StageCost(0, 0, 0, 0, 0))
    result = breakdown(three_calls(), counted, Measured(0.1, 5, ""), **settings)
    rows = {row.name: row.time_ms for row in result.operators}
    assert rows["aten.a"] == pytest.approx(0.010) and rows["aten.b"] == pytest.approx(0.020)  # 10 of (10, 100, 10)
    assert result.busy_ms == pytest.approx(0.030) and result.profiled_calls == 3
    assert result.profiled_ms == pytest.approx(0.220)  # walls 220, 220, 230
    # a call that ran other operators: the call whose device was busy for the median time, alone
    other = breakdown(three_calls(("aten::a", "aten::c")), counted, Measured(0.1, 5, ""), **settings)
    assert {row.name: row.time_ms for row in other.operators}["aten.b"] == pytest.approx(0.030)  # busy 30, 120, 40
