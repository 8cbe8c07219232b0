"""What a traced JAX program (its jaxpr) says by itself: FLOPs, bytes each equation moves, activation liveness.

Pure shape arithmetic over ``jax.make_jaxpr``/``jit(...).trace`` output, nothing compiled or run; the Tier 1 hooks
(:mod:`rpx_plugins.jax.counts`) report it. Conventions are the torch counter's (:mod:`rpx_plugins.torch.counter`)
wherever a JAX primitive corresponds to an aten operator:

* a ``dot_general`` runs output size x contracted size MACs;
* a ``conv_general_dilated`` runs output size x input features per group x kernel taps MACs, padding taps included; a
  transposed (input-dilated) one counts input positions instead of output ones;
* every other primitive is costed from the per-element tables below, whatever the dtype (XLA's own count includes
  type conversions, so it changes with precision); a primitive without an entry is counted in
  ``JaxprCounts.uncounted``, never as 0;
* equations inside ``scan`` run ``length`` times; call-like equations (jit, custom_jvp/vjp, checkpoint) once; other
  sub-programs (``while``, ``cond``) run a data-dependent number of times and are refused out loud.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable

import attrs

from rpx_core import cost_table
from rpx_core.errors import UnsupportedError
from rpx_core.types.counts import ROOT_MODULE
from rpx_plugins.jax.backend import is_floating

MATRIX_PRIMITIVES = ("dot_general", "conv_general_dilated")
#: Call-like primitives -> the parameter holding the jaxpr they run (once, or ``length`` times for scan).
CALL_JAXPR = {
    "jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr", "remat2": "jaxpr",
    "checkpoint": "jaxpr", "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "scan": "jaxpr",
}

#: Elementwise primitives by the shared cost table's name for what they do (rpx_core.cost_table, costed per OUTPUT
#: element, as the torch counter): arithmetic, comparisons, selects and each transcendental 1, logistic (sigmoid) 4.
PER_OUTPUT_ELEMENT: dict[str, int] = cost_table.select(
    cost_table.PER_OUTPUT_ELEMENT,
    (
        "add", "sub", "mul", "div", "neg", "abs", "sign", "clamp", "pow", "square", "sqrt", "rsqrt", "exp", "exp2",
        "expm1", "log", "log1p", "sin", "cos", "tan", "tanh", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh",
        "acosh", "atanh", "erf", "erfc", "floor", "ceil", "round", "eq", "ne", "lt", "le", "gt", "ge",
    ),
    {
        "add_any": "add", "rem": "fmod", "max": "maximum", "min": "minimum", "cbrt": "pow", "erf_inv": "erfinv",
        "is_finite": "isfinite", "select_n": "where", "and": "bitwise_and", "or": "bitwise_or", "not": "bitwise_not",
        "xor": "bitwise_xor", "logistic": "sigmoid",
    },
)
#: Reductions and cumulative ops along an axis, costed per INPUT element by the shared table (1 each).
PER_INPUT_ELEMENT: dict[str, int] = cost_table.select(
    cost_table.PER_INPUT_ELEMENT,
    ("argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin"),
    {
        "reduce_sum": "sum", "reduce_max": "amax", "reduce_min": "amin", "reduce_prod": "prod", "reduce_and": "all",
        "reduce_or": "any", "reduce_xor": "any", "cumlogsumexp": "logcumsumexp",
    },
)
#: Windowed reductions (pooling): window volume per output element, torch's pooling convention.
WINDOW_REDUCTIONS = frozenset({"reduce_window_sum", "reduce_window_max", "reduce_window_min"})
#: Zero FLOPs by definition, bytes still counted: type conversions, reshapes, broadcasts, slicing, concatenation,
#: transposes, padding, gathers/scatters, copies and fills.
DATA_MOVEMENT = frozenset(
    {
        "convert_element_type", "bitcast_convert_type", "reduce_precision", "reshape", "squeeze", "broadcast_in_dim",
        "transpose", "rev", "slice", "dynamic_slice", "dynamic_update_slice", "gather", "scatter", "concatenate",
        "split", "pad", "copy", "iota", "stop_gradient", "sharding_constraint", "device_put", "optimization_barrier",
    }
)


def other_flops_convention() -> str:
    """The per-element tables behind ``other_flops``, in words (stored with every result)."""
    lines = cost_table.describe(PER_OUTPUT_ELEMENT, PER_INPUT_ELEMENT)
    return "; ".join(
        [
            *lines,
            "integer_pow[y]: |y| - 1 multiplies per element, + 1 divide if y < 0 (x**3 costs 2, so jax.nn.gelu's tanh "
            "form totals 9 per element like torch's gelu formula; torch's generic aten.pow counts 1)",
            f"{', '.join(sorted(WINDOW_REDUCTIONS))}: window volume per output element",
            "dot_general, conv_general_dilated: matrix work only (macs), no other FLOPs",
            f"zero by definition (bytes still counted): {', '.join(sorted(DATA_MOVEMENT))}",
            "composites cost the sum of their primitives (jax.nn.gelu: 5 per element in erf form, 9 in tanh form); "
            "the same at every dtype; any other primitive is listed in uncounted_ops, never counted as 0",
        ]
    )


@attrs.frozen
class EqnCall:
    """One kind of equation (primitive, scope, operand shapes): the figures are for one execution."""

    op: str
    module: str
    inputs: str  # e.g. "float32[8,64], float32[64,32]"
    macs: int  # matrix work (see module docstring); 0 for other primitives
    other_flops: int  # from the per-element tables; 0 for data movement and for primitives without an entry
    bytes_read: int
    bytes_written: int


@attrs.define
class JaxprCounts:
    """What a walk over the jaxpr found, every figure already multiplied by how often its equation runs."""

    executions: Counter = attrs.Factory(Counter)  # EqnCall -> times it runs (equations that move bytes)
    uncounted: Counter = attrs.Factory(Counter)  # primitive without a FLOP entry -> times it runs
    weight_read_bytes: int = 0
    activation_read_bytes: int = 0
    written_bytes: int = 0


def nbytes(aval: Any) -> int:
    """Bytes of an aval or ShapeDtypeStruct at its own dtype."""
    return math.prod(aval.shape) * aval.dtype.itemsize


def shape_text(aval: Any) -> str:
    return f"{aval.dtype.name}[{','.join(str(d) for d in aval.shape)}]"


def dot_macs(eqn: Any) -> int:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval
    return int(eqn.outvars[0].aval.size) * math.prod(lhs.shape[d] for d in lhs_contract)


def conv_macs(eqn: Any) -> int:
    """MACs of a convolution, every kernel tap counted (padding included); see the module docstring."""
    lhs, rhs, out = eqn.invars[0].aval, eqn.invars[1].aval, eqn.outvars[0].aval
    lhs_spec, rhs_spec, out_spec = eqn.params["dimension_numbers"]
    per_output = rhs.shape[rhs_spec[1]]  # input features per group
    kernel = math.prod(rhs.shape[d] for d in rhs_spec[2:])
    out_spatial = math.prod(out.shape[d] for d in out_spec[2:])
    non_spatial = int(out.size) // out_spatial  # batch x output features
    transposed = any(d > 1 for d in eqn.params["lhs_dilation"])
    positions = math.prod(lhs.shape[d] for d in lhs_spec[2:]) if transposed else out_spatial
    return non_spatial * positions * per_output * kernel


def matrix_macs(eqn: Any) -> int:
    name = eqn.primitive.name
    if name == "dot_general":
        return dot_macs(eqn)
    return conv_macs(eqn) if name == "conv_general_dilated" else 0


def cost_per_output(eqn: Any) -> int | None:
    """FLOPs per output element of a primitive costed by its output; None for a primitive without an entry."""
    name = eqn.primitive.name
    if name == "integer_pow":
        y = eqn.params["y"]
        return max(abs(y) - 1, 0) + int(y < 0)
    if name in WINDOW_REDUCTIONS:
        return math.prod(eqn.params["window_dimensions"])
    return PER_OUTPUT_ELEMENT.get(name)


def other_flops(eqn: Any) -> int | None:
    """Non-matrix FLOPs of one execution of ``eqn`` from the tables above; None for a primitive without an entry."""
    name = eqn.primitive.name
    if name in MATRIX_PRIMITIVES or name in DATA_MOVEMENT:
        return 0
    if name in PER_INPUT_ELEMENT:
        return PER_INPUT_ELEMENT[name] * int(eqn.invars[0].aval.size)
    cost = cost_per_output(eqn)
    return None if cost is None else cost * int(eqn.outvars[0].aval.size)


def called(eqn: Any) -> tuple[Any, int] | None:
    """(jaxpr, times it runs) for a call-like equation, None for a plain primitive; other sub-programs (while, cond)
    run a data-dependent number of times and are refused out loud."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    name = eqn.primitive.name
    if name in CALL_JAXPR:
        inner = eqn.params[CALL_JAXPR[name]]
        return (inner.jaxpr if isinstance(inner, ClosedJaxpr) else inner), (eqn.params["length"] if name == "scan" else 1)
    values = [v for value in eqn.params.values() for v in (value if isinstance(value, tuple) else (value,))]
    if any(isinstance(v, (Jaxpr, ClosedJaxpr)) for v in values):
        raise UnsupportedError(
            f"the jax counter cannot count {name!r}: its sub-programs run a data-dependent number of times "
            f"(supported: {', '.join(sorted(CALL_JAXPR))})"
        )
    return None


def walk(jaxpr: Any, weights: set[Any], counts: JaxprCounts, times: int = 1, scope: str = "") -> None:
    """Count ``jaxpr``'s equations ``times`` times into ``counts``; ``weights`` are the vars holding params."""
    from jax.extend.core import Var

    for eqn in jaxpr.eqns:
        path = "/".join(part for part in (scope, str(eqn.source_info.name_stack)) if part)
        call = called(eqn)
        if call is not None:
            inner, repeat = call
            inner_weights = {v for v, outer in zip(inner.invars, eqn.invars) if isinstance(outer, Var) and outer in weights}
            walk(inner, inner_weights | set(inner.constvars), counts, times * repeat, path)
            continue
        operands = [v for v in eqn.invars if isinstance(v, Var)]
        read = sum(nbytes(v.aval) for v in operands)
        weight_read = sum(nbytes(v.aval) for v in operands if v in weights)
        written = sum(nbytes(v.aval) for v in eqn.outvars)
        counts.weight_read_bytes += times * weight_read
        counts.activation_read_bytes += times * (read - weight_read)
        counts.written_bytes += times * written
        other = other_flops(eqn)
        if other is None:
            counts.uncounted[eqn.primitive.name] += times
        if read + written:
            inputs = ", ".join(shape_text(v.aval) for v in operands)
            kind = EqnCall(eqn.primitive.name, path or ROOT_MODULE, inputs, matrix_macs(eqn), other or 0, read, written)
            counts.executions[kind] += times


def live_peak(jaxpr: Any, size: Callable[[Any], int]) -> int:
    """Peak bytes of the values ``jaxpr``'s equations create, each held from its equation to its last use (outputs to
    the end); the jaxpr's own inputs (params, model inputs) are not counted. A call's peak is its body's; a scan holds
    its stacked outputs while one body iteration runs."""
    from jax.extend.core import Var

    last_use = {v: index for index, eqn in enumerate(jaxpr.eqns) for v in eqn.invars if isinstance(v, Var)}
    last_use.update({v: len(jaxpr.eqns) for v in jaxpr.outvars if isinstance(v, Var)})
    live: dict[Any, int] = {}
    peak = 0
    for index, eqn in enumerate(jaxpr.eqns):
        outputs = sum(size(v.aval) for v in eqn.outvars)
        call = called(eqn)
        if call is None:
            during = outputs
        elif eqn.primitive.name == "scan":
            during = outputs + live_peak(call[0], size)
        else:
            during = max(outputs, live_peak(call[0], size))
        peak = max(peak, sum(live.values()) + during)
        live.update({v: size(v.aval) for v in eqn.outvars if last_use.get(v, -1) > index})
        for v in eqn.invars:
            if isinstance(v, Var) and last_use[v] == index:
                live.pop(v, None)
    return max(peak, sum(live.values()))


def fp16_size(aval: Any) -> int:
    """Bytes of ``aval`` if it were stored in 2 bytes per element when floating."""
    return math.prod(aval.shape) * (2 if is_floating(aval.dtype) else aval.dtype.itemsize)
