"""What a traced JAX program (its jaxpr) says by itself: matrix MACs, bytes each equation moves, activation liveness.

Pure shape arithmetic over ``jax.make_jaxpr``/``jit(...).trace`` output, nothing compiled or run; the Tier 1 hooks
(:mod:`rpx_plugins.jax_tier1`) combine it with XLA's cost analysis. Conventions are torch's counter's where the two
can agree (see :mod:`rpx_plugins.jax_tier1` for the full list):

* a ``dot_general`` runs output size x contracted size MACs;
* a ``conv_general_dilated`` runs output size x input features per group x kernel taps MACs, padding taps included; a
  transposed (input-dilated) one counts input positions instead of output ones. XLA counts only taps that land on
  real input, so that figure is kept too (``xla_macs``) to split XLA's total honestly;
* equations inside ``scan`` run ``length`` times; call-like equations (jit, custom_jvp/vjp, checkpoint) once; other
  sub-programs (``while``, ``cond``) run a data-dependent number of times and are refused out loud.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable

import attrs

from rpx_core.errors import UnsupportedError
from rpx_core.tier1 import ROOT_MODULE
from rpx_plugins.jax_backend import is_floating

MATRIX_PRIMITIVES = ("dot_general", "conv_general_dilated")
#: Call-like primitives -> the parameter holding the jaxpr they run (once, or ``length`` times for scan).
CALL_JAXPR = {
    "jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr", "remat2": "jaxpr",
    "checkpoint": "jaxpr", "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "scan": "jaxpr",
}


@attrs.frozen
class MatrixCall:
    """One kind of matrix equation: the figures are for one execution."""

    op: str
    module: str
    inputs: str  # e.g. "float32[8,64], float32[64,32]"
    macs: int  # rpx's convention (see module docstring)
    xla_macs: int  # what XLA's cost analysis counts for it (padding taps skipped)
    bytes_read: int
    bytes_written: int


@attrs.define
class JaxprCounts:
    """What a walk over the jaxpr found, every figure already multiplied by how often its equation runs."""

    executions: Counter = attrs.Factory(Counter)  # MatrixCall -> times it runs
    occurrences: Counter = attrs.Factory(Counter)  # MatrixCall -> equations in the program (what XLA counts)
    weight_read_bytes: int = 0
    activation_read_bytes: int = 0
    written_bytes: int = 0
    scan_repeats: int = 0  # body executions beyond the one XLA counts, over every scan


def nbytes(aval: Any) -> int:
    """Bytes of an aval or ShapeDtypeStruct at its own dtype."""
    return math.prod(aval.shape) * aval.dtype.itemsize


def shape_text(aval: Any) -> str:
    return f"{aval.dtype.name}[{','.join(str(d) for d in aval.shape)}]"


def dot_macs(eqn: Any) -> int:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval
    return int(eqn.outvars[0].aval.size) * math.prod(lhs.shape[d] for d in lhs_contract)


def valid_taps(
    size: int, kernel: int, outputs: int, stride: int, pad_low: int, lhs_dilation: int, rhs_dilation: int
) -> int:
    """(output, kernel tap) pairs of one spatial dimension that land on a real input element (XLA counts only these)."""
    span = (size - 1) * lhs_dilation + 1
    return sum(
        1
        for o in range(outputs)
        for k in range(kernel)
        if 0 <= (i := o * stride - pad_low + k * rhs_dilation) < span and i % lhs_dilation == 0
    )


def conv_macs(eqn: Any) -> tuple[int, int]:
    """(rpx MACs, XLA's MACs) of a convolution; see the module docstring."""
    p = eqn.params
    lhs, rhs, out = eqn.invars[0].aval, eqn.invars[1].aval, eqn.outvars[0].aval
    lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
    per_output = rhs.shape[rhs_spec[1]]  # input features per group
    kernel = [rhs.shape[d] for d in rhs_spec[2:]]
    out_spatial = [out.shape[d] for d in out_spec[2:]]
    non_spatial = int(out.size) // math.prod(out_spatial)  # batch x output features
    transposed = any(d > 1 for d in p["lhs_dilation"])
    positions = [lhs.shape[d] for d in lhs_spec[2:]] if transposed else out_spatial
    macs = non_spatial * math.prod(positions) * per_output * math.prod(kernel)
    taps = [
        valid_taps(lhs.shape[ld], k, o, s, low, dil_l, dil_r)
        for ld, k, o, s, (low, _), dil_l, dil_r in zip(
            lhs_spec[2:], kernel, out_spatial, p["window_strides"], p["padding"], p["lhs_dilation"], p["rhs_dilation"]
        )
    ]
    return macs, non_spatial * per_output * math.prod(taps)


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
        name = eqn.primitive.name
        path = "/".join(part for part in (scope, str(eqn.source_info.name_stack)) if part)
        call = called(eqn)
        if call is not None:
            inner, repeat = call
            inner_weights = {v for v, outer in zip(inner.invars, eqn.invars) if isinstance(outer, Var) and outer in weights}
            if name == "scan":
                counts.scan_repeats += times * repeat - 1
            walk(inner, inner_weights | set(inner.constvars), counts, times * repeat, path)
            continue
        operands = [v for v in eqn.invars if isinstance(v, Var)]
        read = sum(nbytes(v.aval) for v in operands)
        weight_read = sum(nbytes(v.aval) for v in operands if v in weights)
        written = sum(nbytes(v.aval) for v in eqn.outvars)
        counts.weight_read_bytes += times * weight_read
        counts.activation_read_bytes += times * (read - weight_read)
        counts.written_bytes += times * written
        if name in MATRIX_PRIMITIVES:
            macs, xla_macs = (dot_macs(eqn),) * 2 if name == "dot_general" else conv_macs(eqn)
            inputs = ", ".join(shape_text(v.aval) for v in operands)
            matrix = MatrixCall(name, path or ROOT_MODULE, inputs, macs, xla_macs, read, written)
            counts.executions[matrix] += times
            counts.occurrences[matrix] += 1


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
