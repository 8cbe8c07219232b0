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
* sub-programs: call-like equations (jit, custom_jvp/vjp, checkpoint) run once; ``scan`` runs ``length`` times;
  ``shard_map`` (and ``pmap``, which JAX runs as one) runs its per-device body once on every device of its manual mesh
  axes; ``cond`` records every branch and counts the largest (by FLOPs, then bytes), since the branch taken is not
  known from abstract inputs; ``while`` runs a static trip count when its loop is ``i < N`` with ``i`` starting at a
  literal and stepping by one, else the ``while_iterations`` given, else it is refused out loud; ``pallas_call``
  kernels are listed in ``uncounted`` with their call counts (bytes of their operands still counted).
* module paths come from the name stack (Flax linen scopes, and the scopes rpx adds for NNX and Equinox), transform
  wrappers such as ``jvp(...)`` unwrapped; equations under ``transpose(...)`` are the backward phase, under
  ``OPTIMIZER_SCOPE`` the optimizer update (and under ``ACCUMULATE_SCOPE``, gradient accumulation, backward too).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable

import attrs

from rpx_core.plugin import UnsupportedError, cost_table
from rpx_core.types.counts import BACKWARD_MODULE, ROOT_MODULE
from rpx_plugins.jax.backend import is_floating

MATRIX_PRIMITIVES = ("dot_general", "conv_general_dilated")
#: Call-like primitives -> the parameter holding the jaxpr they run (once, or ``length`` times for scan).
CALL_JAXPR = {
    "jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr", "remat2": "jaxpr",
    "checkpoint": "jaxpr", "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "scan": "jaxpr",
    "shard_map": "jaxpr", "custom_lin": "jaxpr",
}
#: Sub-programs counted by their own rule (see the module docstring), beside the call-like ones.
CONTROL_FLOW = ("cond", "while")
#: Kernels whose body is not XLA's to count: listed as uncounted with their calls; their operands' bytes counted.
OPAQUE_KERNELS = frozenset({"pallas_call", "mosaic_gpu_call", "triton_kernel_call"})
#: The named scope rpx puts around an optimizer update (counted as the "update" phase).
OPTIMIZER_SCOPE = "rpx_optimizer"
#: The by_module entry of the optimizer update's operations (as BACKWARD_MODULE holds the backward pass's).
OPTIMIZER_MODULE = "(optimizer)"
#: The named scope rpx puts around adding one micro-batch's gradients to the others' (counted as backward work, as
#: torch's gradient accumulation runs in its backward pass).
ACCUMULATE_SCOPE = "rpx_accumulate"
#: Elementwise primitives XLA reports as transcendentals (rpx counts each at 1 FLOP per element in other_flops).
TRANSCENDENTAL = frozenset(
    {
        "exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "sin", "cos", "tan", "asin", "acos", "atan",
        "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "erf_inv", "rsqrt", "sqrt", "cbrt", "pow",
    }
)

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
#: Scatters that combine each update with the value it lands on (the transpose of a gather, e.g. a cross-entropy's
#: label pick): 1 per update element. Their ``update_jaxpr`` is the combiner, not a sub-program to walk.
SCATTER_COMBINES = {"scatter-add": 1, "scatter-mul": 1, "scatter-min": 1, "scatter-max": 1}
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
            f"{', '.join(sorted(SCATTER_COMBINES))}: 1 per update element",
            "dot_general, conv_general_dilated: matrix work only (macs), no other FLOPs",
            f"zero by definition (bytes still counted): {', '.join(sorted(DATA_MOVEMENT))}",
            "composites cost the sum of their primitives (jax.nn.gelu: 5 per element in erf form, 9 in tanh form); "
            "the same at every dtype; any other primitive is listed in uncounted_ops, never counted as 0",
        ]
    )


@attrs.frozen
class EqnCall:
    """One kind of equation (primitive, module, phase, operand shapes): the figures are for one execution."""

    op: str
    module: str
    inputs: str  # e.g. "float32[8,64], float32[64,32]"
    macs: int  # matrix work (see module docstring); 0 for other primitives
    other_flops: int  # from the per-element tables; 0 for data movement and for primitives without an entry
    bytes_read: int
    bytes_written: int
    phase: str = "forward"  # "forward", "backward" (under transpose(...)) or "optimizer" (under OPTIMIZER_SCOPE)
    transcendentals: int = 0  # output elements of TRANSCENDENTAL primitives (to set beside XLA's figure)


@attrs.define
class JaxprCounts:
    """What a walk over the jaxpr found, every figure already multiplied by how often its equation runs."""

    executions: Counter = attrs.Factory(Counter)  # EqnCall -> times it runs (equations that move bytes)
    uncounted: Counter = attrs.Factory(Counter)  # primitive without a FLOP entry -> times it runs
    weight_read_bytes: int = 0
    activation_read_bytes: int = 0
    written_bytes: int = 0
    #: How each sub-program was counted, in words (cond branches, while trip counts, shard_map meshes, kernels).
    notes: list[str] = attrs.Factory(list)
    devices: int = 1  # the most devices a shard_map (or pmap) body was counted on
    loop_iterations: int = 0  # iterations of scan/while bodies beyond the first (XLA's cost analysis counts one)
    padded_convolutions: int = 0  # convolutions with padding (rpx counts padding taps, XLA does not)


@attrs.frozen
class ModuleNaming:
    """How name-stack components become module paths: the component naming the model itself (linen's root class)
    and prefixes of components that name classes rather than modules (Equinox's own ``eqx.nn.Linear`` scopes)."""

    root: str | None = None
    ignored_prefixes: tuple[str, ...] = ()


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
    if name in SCATTER_COMBINES:
        return SCATTER_COMBINES[name] * int(eqn.invars[2].aval.size)
    cost = cost_per_output(eqn)
    return None if cost is None else cost * int(eqn.outvars[0].aval.size)


def open_jaxpr(program: Any) -> Any:
    from jax.extend.core import ClosedJaxpr

    return program.jaxpr if isinstance(program, ClosedJaxpr) else program


def has_subprogram(eqn: Any) -> bool:
    from jax.extend.core import ClosedJaxpr, Jaxpr

    values = [v for value in eqn.params.values() for v in (value if isinstance(value, tuple) else (value,))]
    return any(isinstance(v, (Jaxpr, ClosedJaxpr)) for v in values)


def manual_devices(eqn: Any) -> int:
    """Devices a shard_map body runs on: the product of its manual mesh axes (every axis if none are listed)."""
    mesh = eqn.params["mesh"]
    axes = eqn.params.get("manual_axes") or eqn.params.get("newly_manual_axes") or mesh.axis_names
    return math.prod(dict(mesh.shape)[axis] for axis in axes)


def static_trip_count(eqn: Any) -> int | None:
    """Iterations of a ``while`` whose condition is ``carry[k] < N`` (N a literal or a constant literal operand),
    whose body adds 1 to ``carry[k]``, and whose ``carry[k]`` starts at a literal; None for any other loop."""
    from jax.extend.core import Literal

    cond, body = open_jaxpr(eqn.params["cond_jaxpr"]), open_jaxpr(eqn.params["body_jaxpr"])
    cond_consts, body_consts = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    init = eqn.invars[cond_consts + body_consts :]
    if len(cond.eqns) != 1 or cond.eqns[0].primitive.name != "lt":
        return None
    counter, bound = cond.eqns[0].invars
    carries = cond.invars[cond_consts:]
    if counter not in carries or not isinstance(bound, Literal):
        return None
    k = carries.index(counter)
    start = init[k]
    step = next((e for e in body.eqns if e.outvars[0] is body.outvars[k]), None)
    body_counter = body.invars[body_consts + k]
    increments = (
        step is not None
        and step.primitive.name == "add"
        and body_counter in step.invars
        and any(isinstance(v, Literal) and v.val == 1 for v in step.invars)
    )
    if not increments or not isinstance(start, Literal):
        return None
    return max(int(bound.val) - int(start.val), 0)


def unwrap(component: str) -> str:
    """``transpose(jvp(M))`` -> ``M``: a transform's wrapper around a scope name; ``vmap()`` -> ``""``."""
    while component.endswith(")") and "(" in component:
        component = component[component.index("(") + 1 : -1]
    return component


def module_and_phase(stack: str, naming: ModuleNaming) -> tuple[str, str]:
    """(module path joined with ".", phase) of a raw name stack such as ``transpose(jvp(M))/Dense_0``."""
    phase, names = "forward", []
    for position, part in enumerate(p for p in stack.split("/") if p):
        if part == OPTIMIZER_SCOPE:
            phase = "optimizer"
            continue
        if part.startswith("transpose(") or part == ACCUMULATE_SCOPE:
            phase = "backward"
        name = unwrap(part)
        if not name or (position == 0 and name == naming.root) or name.startswith(naming.ignored_prefixes):
            continue
        names.append(name)
    if phase == "backward":
        return BACKWARD_MODULE, phase
    if phase == "optimizer":
        return OPTIMIZER_MODULE, phase
    return (".".join(names) or ROOT_MODULE), phase


class Walker:
    """Counts a jaxpr into a JaxprCounts; see the module docstring for each kind of sub-program."""

    def __init__(
        self, counts: JaxprCounts, size: Callable[[Any], int] = nbytes, naming: ModuleNaming = ModuleNaming(),
        while_iterations: int | None = None,
    ) -> None:
        self.counts, self.size, self.naming, self.while_iterations = counts, size, naming, while_iterations

    def walk(self, jaxpr: Any, weights: set[Any], times: int = 1, scope: str = "") -> None:
        for eqn in jaxpr.eqns:
            stack = "/".join(part for part in (scope, str(eqn.source_info.name_stack)) if part)
            name = eqn.primitive.name
            if name in CALL_JAXPR:
                inner = open_jaxpr(eqn.params[CALL_JAXPR[name]])
                repeat = eqn.params["length"] if name == "scan" else 1
                if name == "scan":
                    self.counts.loop_iterations += times * (repeat - 1)
                if name == "shard_map":
                    repeat = manual_devices(eqn)
                    self.counts.devices = max(self.counts.devices, repeat)
                    self.counts.notes.append(
                        f"shard_map in {module_and_phase(stack, self.naming)[0]}: its per-device body counted once on "
                        f"each of {repeat} devices (mesh {dict(eqn.params['mesh'].shape)})"
                    )
                self.walk(inner, self.inner_weights(inner.invars, eqn.invars, weights) | set(inner.constvars),
                          times * repeat, stack)
            elif name == "cond":
                self.cond(eqn, weights, times, stack)
            elif name == "while":
                self.loop(eqn, weights, times, stack)
            elif name in OPAQUE_KERNELS or name in SCATTER_COMBINES or name == "scatter" or not has_subprogram(eqn):
                self.record(eqn, weights, times, stack)
            else:
                raise UnsupportedError(
                    f"the jax counter cannot count {name!r}: it runs sub-programs rpx has no rule for "
                    f"(supported: {', '.join(sorted([*CALL_JAXPR, *CONTROL_FLOW, *OPAQUE_KERNELS]))})"
                )

    @staticmethod
    def inner_weights(inner: list[Any], outer: list[Any], weights: set[Any]) -> set[Any]:
        from jax.extend.core import Var

        return {v for v, o in zip(inner, outer) if isinstance(o, Var) and o in weights}

    def cond(self, eqn: Any, weights: set[Any], times: int, stack: str) -> None:
        """Every branch counted on its own and recorded; the largest (FLOPs, then bytes) goes into the totals."""
        operands = eqn.invars[1:]
        sizes = []
        for branch in eqn.params["branches"]:
            scratch = JaxprCounts()
            inner = open_jaxpr(branch)
            Walker(scratch, self.size, self.naming, self.while_iterations).walk(
                inner, self.inner_weights(inner.invars, operands, weights) | set(inner.constvars), 1, stack
            )
            flops = sum((2 * c.macs + c.other_flops) * n for c, n in scratch.executions.items())
            moved = sum((c.bytes_read + c.bytes_written) * n for c, n in scratch.executions.items())
            sizes.append((flops, moved))
        largest = max(range(len(sizes)), key=lambda i: sizes[i])
        where = module_and_phase(stack, self.naming)[0]
        listed = ", ".join(f"branch {i}: {flops} FLOPs, {moved} bytes" for i, (flops, moved) in enumerate(sizes))
        self.counts.notes.append(
            f"cond in {where} (x{times}): {listed}; counted branch {largest}, the largest, since the branch taken is "
            "not known from abstract inputs"
        )
        inner = open_jaxpr(eqn.params["branches"][largest])
        self.walk(inner, self.inner_weights(inner.invars, operands, weights) | set(inner.constvars), times, stack)
        self.record_operands(eqn.invars[:1], weights, times)  # the branch index is read

    def loop(self, eqn: Any, weights: set[Any], times: int, stack: str) -> None:
        """A while loop at its static trip count, else at ``while_iterations``, else refused out loud."""
        trips = static_trip_count(eqn)
        where = module_and_phase(stack, self.naming)[0]
        if trips is not None:
            how = f"its static trip count {trips}"
        elif self.while_iterations is not None:
            trips, how = self.while_iterations, f"[options.count_flops] while_iterations = {self.while_iterations}"
        else:
            raise UnsupportedError(
                f"the jax counter cannot count 'while' in {where}: its trip count depends on data; set "
                "[options.count_flops] while_iterations = N to count its body N times (fori_loop with static bounds "
                "and `i < N` loops are counted exactly)"
            )
        self.counts.notes.append(f"while in {where} (x{times}): body counted {trips} times ({how}), condition {trips + 1}")
        self.counts.loop_iterations += times * max(trips - 1, 0)
        cond_consts, body_consts = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        carries = eqn.invars[cond_consts + body_consts :]
        cond, body = open_jaxpr(eqn.params["cond_jaxpr"]), open_jaxpr(eqn.params["body_jaxpr"])
        cond_operands = [*eqn.invars[:cond_consts], *carries]
        body_operands = [*eqn.invars[cond_consts : cond_consts + body_consts], *carries]
        self.walk(cond, self.inner_weights(cond.invars, cond_operands, weights), times * (trips + 1), stack)
        self.walk(body, self.inner_weights(body.invars, body_operands, weights), times * trips, stack)

    def record_operands(self, operands: list[Any], weights: set[Any], times: int) -> None:
        from jax.extend.core import Var

        for v in operands:
            if isinstance(v, Var):
                if v in weights:
                    self.counts.weight_read_bytes += times * self.size(v.aval)
                else:
                    self.counts.activation_read_bytes += times * self.size(v.aval)

    def record(self, eqn: Any, weights: set[Any], times: int, stack: str) -> None:
        from jax.extend.core import Var

        counts, size, name = self.counts, self.size, eqn.primitive.name
        operands = [v for v in eqn.invars if isinstance(v, Var)]
        read = sum(size(v.aval) for v in operands)
        weight_read = sum(size(v.aval) for v in operands if v in weights)
        written = sum(size(v.aval) for v in eqn.outvars)
        counts.weight_read_bytes += times * weight_read
        counts.activation_read_bytes += times * (read - weight_read)
        counts.written_bytes += times * written
        other = None if name in OPAQUE_KERNELS else other_flops(eqn)
        if other is None:
            counts.uncounted[name] += times
        if name in OPAQUE_KERNELS and name not in {n.split(":")[0] for n in counts.notes}:
            counts.notes.append(f"{name}: a custom kernel whose body XLA does not see; listed in uncounted_ops, "
                                "its operands' and results' bytes counted")
        if name == "conv_general_dilated" and any(low or high for low, high in eqn.params["padding"]):
            counts.padded_convolutions += times
        if read + written:
            module, phase = module_and_phase(stack, self.naming)
            inputs = ", ".join(shape_text(v.aval) for v in operands)
            transcendental = int(eqn.outvars[0].aval.size) if name in TRANSCENDENTAL else 0
            kind = EqnCall(name, module, inputs, matrix_macs(eqn), other or 0, read, written, phase, transcendental)
            counts.executions[kind] += times


def walk(
    jaxpr: Any, weights: set[Any], counts: JaxprCounts, times: int = 1, scope: str = "",
    size: Callable[[Any], int] = nbytes, naming: ModuleNaming = ModuleNaming(), while_iterations: int | None = None,
) -> None:
    """Count ``jaxpr``'s equations ``times`` times into ``counts``; ``weights`` are the vars holding params."""
    Walker(counts, size, naming, while_iterations).walk(jaxpr, weights, times, scope)


def subprograms(eqn: Any) -> list[Any]:
    """The jaxprs an equation may run (for liveness); [] for a plain primitive or an opaque kernel."""
    name = eqn.primitive.name
    if name in CALL_JAXPR:
        return [open_jaxpr(eqn.params[CALL_JAXPR[name]])]
    if name == "cond":
        return [open_jaxpr(branch) for branch in eqn.params["branches"]]
    if name == "while":
        return [open_jaxpr(eqn.params["cond_jaxpr"]), open_jaxpr(eqn.params["body_jaxpr"])]
    return []


def live_peak(jaxpr: Any, size: Callable[[Any], int]) -> int:
    """Peak bytes of the values ``jaxpr``'s equations create, each held from its equation to its last use (outputs to
    the end); the jaxpr's own inputs (params, model inputs) are not counted. A call's peak is its body's (a cond's,
    its largest branch's); a scan or while holds its outputs while one body iteration runs."""
    from jax.extend.core import Var

    last_use = {v: index for index, eqn in enumerate(jaxpr.eqns) for v in eqn.invars if isinstance(v, Var)}
    last_use.update({v: len(jaxpr.eqns) for v in jaxpr.outvars if isinstance(v, Var)})
    live: dict[Any, int] = {}
    peak = 0
    for index, eqn in enumerate(jaxpr.eqns):
        outputs = sum(size(v.aval) for v in eqn.outvars)
        inner = max((live_peak(program, size) for program in subprograms(eqn)), default=0)
        during = outputs + inner if eqn.primitive.name in ("scan", "while") else max(outputs, inner)
        peak = max(peak, sum(live.values()) + during)
        live.update({v: size(v.aval) for v in eqn.outvars if last_use.get(v, -1) > index})
        for v in eqn.invars:
            if isinstance(v, Var) and last_use[v] == index:
                live.pop(v, None)
    return max(peak, sum(live.values()))


def fp16_size(aval: Any) -> int:
    """Bytes of ``aval`` if it were stored in 2 bytes per element when floating."""
    return math.prod(aval.shape) * (2 if is_floating(aval.dtype) else aval.dtype.itemsize)


def size_at(precision_bytes: int | None) -> Callable[[Any], int]:
    """Bytes of an aval with floating elements at ``precision_bytes`` each (None: at its own dtype)."""
    if precision_bytes is None:
        return nbytes

    def size(aval: Any) -> int:
        return math.prod(aval.shape) * (precision_bytes if is_floating(aval.dtype) else aval.dtype.itemsize)

    return size
