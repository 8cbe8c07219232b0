"""measure_breakdown on the ``jax`` backend: not applicable, with the reason this model's compiled program gives.

What ``jax.profiler`` records (read on the CPU with jax 0.10.2, ``create_perfetto_trace``): one event per executed
thunk of the compiled program on XLA's threads, named by its HLO instruction (``args.hlo_op``: "ynn_fusion.1",
"broadcast_add_fusion"), and the Python side's annotations. XLA compiles the operations rpx counts (the jaxpr's
equations: dot_general, add, tanh, ...) into those instructions, several to one kernel and often across modules (a
Dense layer's bias add fused with the activation of the module that calls it): a kernel's time cannot be given to one
counted operation, and to one module only when it holds no other module's work. The HLO's metadata
(``op_name="jit(apply)/M/fc1/add"``: the name scope rpx reads for modules, then the primitive) says which operations
each kernel runs, so the stage reads the compiled program and says how this model's operations were fused, instead of
dividing a kernel's time by a guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from rpx_core.plugin import NotApplicable, StageContext, UnsupportedError, hookimpl
from rpx_core.types.breakdown import BreakdownResult

#: HLO instructions that run no kernel of their own.
NO_KERNEL = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})
_COMPUTATION = re.compile(r"^(ENTRY )?%(\S+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = \S+ ([\w-]+)\(")
_CALLS = re.compile(r"(?:calls|to_apply)=%([\w.-]+)")
_OP_NAME = re.compile(r'op_name="([^"]+)"')


def kernels(hlo_text: str) -> dict[str, set[str]]:
    """Each kernel the compiled program runs (its entry computation's instructions that are not parameters,
    constants or tuples) -> the operations it runs, as their metadata names them ("jit(apply)/M/fc1/dot_general")."""
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        if (match := _COMPUTATION.match(line)) is not None:
            current = match.group(2)
            computations[current] = []
            entry = current if match.group(1) else entry
        elif line.strip() == "}":
            current = None
        elif current is not None:
            computations[current].append(line)
    if entry is None:
        return {}

    def operations(lines: list[str], seen: frozenset[str]) -> Iterator[str]:
        for line in lines:  # an op_name ending in a call ("jit(relu)") names no operation of its own
            yield from (name for name in _OP_NAME.findall(line) if "(" not in name.rsplit("/", 1)[-1])
            for called in _CALLS.findall(line):
                if called in computations and called not in seen:
                    yield from operations(computations[called], seen | {called})

    found = {}
    for line in computations[entry]:
        match = _INSTRUCTION.match(line)
        if match is not None and match.group(2) not in NO_KERNEL:
            found[match.group(1)] = set(operations([line], frozenset()))
    return found


def scope(op_name: str) -> str:
    """The module scope of an operation: "jit(apply)/M/fc1/dot_general" -> "M/fc1"; the wrappers of nested jitted
    functions ("jit(relu)") are calls, not modules."""
    return "/".join(part for part in op_name.split("/")[:-1] if "(" not in part)


def fusion_report(fused: dict[str, set[str]]) -> str:
    """How the operations were compiled into kernels, in words, with an example of each kind of mixing."""
    shared = {name: ops for name, ops in fused.items() if len(ops) > 1}
    crossing = {name: ops for name, ops in fused.items() if len({scope(op) for op in ops}) > 1}
    text = (f"XLA compiled this model into {len(fused)} kernels (running several of the operations rpx counts: "
            f"{len(shared)}; running work of several modules: {len(crossing)})")
    for label, group in (("e.g.", shared), ("across modules, e.g.", crossing)):
        if group:
            name, ops = next(iter(group.items()))
            text += f"; {label} {name}: {', '.join(sorted(ops))}"
    return text


def refusal(hlo_text: str) -> Exception:
    """NotApplicable when the compiled kernels mix operations (no per-operation time exists for this model);
    UnsupportedError when each runs one (the breakdown would exist, but rpx does not read XLA's profiles yet)."""
    fused = kernels(hlo_text)
    if any(len(ops) > 1 for ops in fused.values()):
        return NotApplicable(
            f"measure_breakdown on jax: {fusion_report(fused)}. jax.profiler records time per compiled kernel "
            "(XLA's thunks, by HLO instruction), and a kernel that runs several operations cannot give its time to "
            "one of them: rpx does not divide it by a guess; measure_latency times the whole call")
    return UnsupportedError(f"measure_breakdown on jax: {fusion_report(fused)}; each kernel runs one operation, but "
                            "rpx does not read XLA's profiles yet")


@hookimpl(trylast=True)
def rpx_measure_breakdown(ctx: StageContext) -> BreakdownResult | None:
    if ctx.backend.framework != "jax":
        return None
    model = ctx.model()
    args, kwargs = ctx.inputs(1)
    raise refusal(model.apply.lower(model.params, *args, **kwargs).compile().as_text())
