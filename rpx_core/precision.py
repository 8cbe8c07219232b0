"""The precisions rpx knows, each as one object: its element size, and the dtype each framework executes it with.

Resolved once, when the plan is made; backends declare which precisions they execute (``Backend.precisions``) and
GPU packs which ones they have peaks for. fp8 and int8 have no execution dtype here: they are counted (Tier 1, on the
meta device) and bounded (Tier 2), never run by the built-in backends.
"""

from __future__ import annotations

from typing import Literal, get_args

import attrs

from rpx_core.errors import RpxError, did_you_mean

PrecisionName = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]


@attrs.frozen
class Precision:
    """One precision: how many bytes a floating-point element takes, and the dtype name per framework that
    executes it (absent: that framework cannot execute it)."""

    name: str
    element_bytes: int  # bytes per floating-point element as stored (tf32 is stored as fp32)
    dtypes: dict[str, str] = attrs.Factory(dict)  # framework ("torch", "jax") -> dtype name used to execute
    note: str = ""

    def dtype(self, framework: str) -> str | None:
        """The dtype name ``framework`` executes this precision with, or None if it cannot."""
        return self.dtypes.get(framework)


PRECISIONS: dict[str, Precision] = {
    precision.name: precision
    for precision in (
        Precision("fp32", 4, {"torch": "float32", "jax": "float32"}),
        Precision("tf32", 4, {"torch": "float32"}, "fp32 storage, TF32 tensor-core matmuls (CUDA only)"),
        Precision("fp16", 2, {"torch": "float16", "jax": "float16"}),
        Precision("bf16", 2, {"torch": "bfloat16", "jax": "bfloat16"}),
        Precision("fp8", 1, {}, "counted and bounded at 1 byte per element; not executed"),
        Precision("int8", 1, {}, "counted and bounded at 1 byte per element; not executed"),
    )
}
assert tuple(PRECISIONS) == get_args(PrecisionName)

#: Bytes one floating-point element takes at each precision, by name.
BYTES_PER_ELEMENT = {name: precision.element_bytes for name, precision in PRECISIONS.items()}


class UnknownPrecisionError(RpxError):
    """The precision is not one rpx knows (see PRECISIONS)."""


def unknown_precision(name: str) -> str:
    """What to say about a precision name rpx does not know: the known ones, the closest first."""
    return f"unknown precision {name!r} (known: {', '.join(PRECISIONS)}){did_you_mean(name, PRECISIONS)}"


def get_precision(name: str) -> Precision:
    """The precision called ``name``; UnknownPrecisionError with the closest known name otherwise."""
    try:
        return PRECISIONS[name]
    except KeyError:
        raise UnknownPrecisionError(unknown_precision(name)) from None


def check_precision(name: str) -> str:
    """Return ``name`` if rpx knows it, else raise UnknownPrecisionError."""
    return get_precision(name).name


def precision_of_dtype(dtype_name: str) -> str | None:
    """The precision a model whose floating weights have ``dtype_name`` ("bfloat16", "torch.float16",
    "float8_e4m3fn", ...) holds, whatever the framework: fp32, fp16, bf16 or fp8 (every float8 variant stores one byte
    per element); None for other dtypes (float64), whose model is run at the spec's default. float32 is fp32, not
    tf32: TF32 is a way to compute, not a way to store."""
    name = dtype_name.removeprefix("torch.")
    if name.startswith("float8"):
        return "fp8"
    return next((precision.name for precision in PRECISIONS.values() if precision.name != "tf32"
                 and name in precision.dtypes.values()), None)
