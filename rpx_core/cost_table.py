"""The per-element FLOP costs behind every ``other_flops`` figure rpx reports, for the torch and the JAX counter alike.

Why here, in the engine, and not in a plugin: ``other_flops`` is part of the result contract
(:class:`rpx_core.types.counts.FlopsResult`), so any counter, built-in or a plugin's, must price non-matrix work with
the same table for its figures to compare; and both built-in counters (``rpx_plugins.torch.counter`` and
``rpx_plugins.jax.jaxpr``) import it without importing the other's framework. Plain data: no torch, no jax.

Operations are named as torch's aten operators (the vocabulary most users know); the JAX counter maps its primitives
onto these names with :func:`select`, so an add, a sigmoid or a row sum costs the same in both. exp, log, sqrt, rsqrt,
tanh, erf, sin, cos and every other transcendental count 1 FLOP; composite activations count their elementwise steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rpx_core.errors import did_you_mean

#: Softmax / log-softmax, per element: row max, subtract, exp, row sum, divide (or log-subtract).
SOFTMAX = 5
#: Softmax backward, per element: grad x out, row sum, subtract, multiply by out (log-softmax: exp, sum, mul, sub).
SOFTMAX_BACKWARD = 4
#: GELU, erf form, per element: 0.5 * x * (1 + erf(x / sqrt(2))): divide, erf, add, two multiplies.
GELU_ERF = 5
#: GELU, tanh form, per element: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))): cube (2), 3 multiplies, 2 adds,
#: tanh, 1.
GELU_TANH = 9
#: GELU backward, erf form, per element: cdf = 0.5 (1 + erf(x / sqrt 2)) (4), pdf = exp(-x^2 / 2) / sqrt(2 pi) (4),
#: grad * (cdf + x * pdf) (3).
GELU_ERF_BACKWARD = 11
#: GELU backward, tanh form, per element: t = tanh(k (x + c x^3)) (6); 0.5 x, 1 + t, 0.5 (1 + t) (3);
#: 0.5 x (1 - t^2) k (1 + 3 c x^2) (7); add, multiply by grad (2).
GELU_TANH_BACKWARD = 18
#: SiLU backward, per element: s = sigmoid(x) (4), grad * s * (1 + x (1 - s)) (5).
SILU_BACKWARD = 9
#: Layer / group norm, per element: mean, subtract, square, variance sum, scale by rstd; + 1 each for weight, bias.
LAYER_NORM = 5
#: Layer / group norm backward, per element: x_hat from the saved mean and rstd (2, shared by the input and weight
#: gradients); input gradient: g = grad * weight (1 with a weight), g * x_hat, two row sums, x_hat * mean(g x_hat),
#: two subtractions, scale by rstd (7); weight gradient: grad * x_hat summed (2); bias gradient: grad summed (1).
LAYER_NORM_BACKWARD_XHAT, LAYER_NORM_BACKWARD_INPUT, NORM_BACKWARD_WEIGHT, NORM_BACKWARD_BIAS = 2, 7, 2, 1
#: RMS norm, per element: square, sum, scale by rstd; + 1 for the weight.
RMS_NORM = 3
#: RMS norm backward, per element: x_hat = x * rstd (1, shared); input gradient: g = grad * weight (1 with a weight),
#: g * x_hat, row sum, x_hat * mean(g x_hat), subtract, scale by rstd (5); weight gradient: grad * x_hat summed (2).
RMS_NORM_BACKWARD_XHAT, RMS_NORM_BACKWARD_INPUT = 1, 5
#: Batch norm, per element: subtract mean, scale by invstd; + 1 each for weight, bias; + 3 in training for the batch
#: statistics (sum, square, sum). Running-statistics updates (per channel) are not counted.
BATCH_NORM, BATCH_NORM_STATISTICS = 2, 3
#: Batch norm backward, per element. Training: x_hat from the saved statistics (2), grad summed (1), grad * x_hat
#: summed (2), input gradient = scale * (grad - mean(grad) - x_hat * mean(grad x_hat)) (4; the sums are needed for
#: it whichever gradients are asked). Inference: input gradient = grad * weight * invstd (1, the scale per channel);
#: weight gradient = x_hat (2) times grad summed (2); bias gradient = grad summed (1).
BATCH_NORM_BACKWARD_TRAINING_INPUT, BATCH_NORM_BACKWARD_INFERENCE_INPUT = 4, 1

#: FLOPs per OUTPUT element of elementwise operations (in-place variants like ``add_`` cost as their operation).
PER_OUTPUT_ELEMENT: dict[str, int] = {
    **dict.fromkeys(
        (
            "add", "sub", "rsub", "mul", "div", "neg", "abs", "sign", "sgn", "reciprocal", "pow", "sqrt", "rsqrt",
            "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh", "erf", "erfc",
            "floor", "ceil", "round", "trunc", "frac", "fmod", "remainder", "floor_divide", "atan2", "copysign",
            "maximum", "minimum", "fmax", "fmin", "clamp", "clamp_min", "clamp_max", "relu", "leaky_relu", "hardtanh",
            "threshold", "threshold_backward", "where", "masked_fill", "eq", "ne", "lt", "le", "gt", "ge",
            "logical_not", "logical_and", "logical_or", "logical_xor", "bitwise_not", "bitwise_and", "bitwise_or",
            "isnan", "isinf", "nan_to_num",
            # also JAX primitives (see rpx_plugins.jax.jaxpr)
            "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "square", "erfinv", "isfinite",
            "bitwise_xor",
        ),
        1,
    ),
    **dict.fromkeys(("addcmul", "addcdiv", "lerp", "native_dropout", "native_dropout_backward"), 2),
    **dict.fromkeys(("softplus", "elu", "hardsigmoid", "sigmoid_backward", "tanh_backward"), 3),
    **dict.fromkeys(("sigmoid", "hardswish", "log_sigmoid_forward"), 4),
    "silu": 5,  # x * sigmoid(x)
    "silu_backward": SILU_BACKWARD,
}

#: FLOPs per INPUT element of reductions and row-wise operations (the final divide of a mean is folded in).
PER_INPUT_ELEMENT: dict[str, int] = {
    **dict.fromkeys(
        (
            "sum", "mean", "nansum", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "any", "all",
            "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp",
            "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_avg_pool1d", "adaptive_max_pool2d",
            "adaptive_max_pool3d",
        ),
        1,
    ),
    **dict.fromkeys(("linalg_vector_norm", "norm"), 2),  # square, add
    **dict.fromkeys(("var", "std", "var_mean", "std_mean"), 3),  # subtract mean, square, add
    **dict.fromkeys(("_softmax", "_safe_softmax", "_log_softmax"), SOFTMAX),
    **dict.fromkeys(("_softmax_backward_data", "_log_softmax_backward_data"), SOFTMAX_BACKWARD),
}


def per_element(operation: str) -> int:
    """The FLOPs rpx prices one element of ``operation`` at, by its aten name (``"mul"``, ``"sigmoid"``, ``"sum"``):
    per output element of an elementwise operation, per input element of a reduction or row-wise one. For a plugin
    pricing its own operator's elementwise steps as rpx prices the same work; KeyError with the closest names for a
    name the table does not hold."""
    for table in (PER_OUTPUT_ELEMENT, PER_INPUT_ELEMENT):
        if operation in table:
            return table[operation]
    raise KeyError(f"the cost table has no operation {operation!r}{did_you_mean(operation, [*PER_OUTPUT_ELEMENT, *PER_INPUT_ELEMENT])}")


def select(table: Mapping[str, int], names: Iterable[str] = (), renamed: Mapping[str, str] | None = None) -> dict[str, int]:
    """A framework's own view of ``table``: ``names`` it shares with the table, plus ``renamed`` (framework name ->
    table name) for the ones it spells differently. A name missing from the table is a KeyError at import."""
    chosen = {name: table[name] for name in names}
    chosen.update({name: table[operation] for name, operation in (renamed or {}).items()})
    return chosen


def describe(per_output: Mapping[str, int], per_input: Mapping[str, int]) -> list[str]:
    """Per-element cost tables in words, one line per (cost, element kind): the text results store as convention."""
    by_cost: dict[tuple[str, int], list[str]] = {}
    for table, where in ((per_output, "output"), (per_input, "input")):
        for name, cost in table.items():
            by_cost.setdefault((where, cost), []).append(name)
    return [f"{cost} per {where} element: {', '.join(names)}" for (where, cost), names in by_cost.items()]
