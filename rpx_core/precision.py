"""The precisions rpx knows and how many bytes a floating-point element takes at each.

Execution support is per backend and roofline peaks are per GPU; this is the shared vocabulary both check against.
"""

from __future__ import annotations

from typing import Literal, get_args

from rpx_core.errors import RpxError, did_you_mean

Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
#: Bytes one floating-point element takes at each precision: tf32 is stored as fp32, fp8 and int8 in one byte.
BYTES_PER_ELEMENT = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


class UnknownPrecisionError(RpxError):
    """The precision is not one rpx knows (see PRECISIONS)."""


def check_precision(precision: str) -> str:
    """Return ``precision`` if rpx knows it, else raise UnknownPrecisionError with the closest known name."""
    if precision not in PRECISIONS:
        raise UnknownPrecisionError(
            f"unknown precision {precision!r} (known: {', '.join(PRECISIONS)}){did_you_mean(precision, PRECISIONS)}"
        )
    return precision
