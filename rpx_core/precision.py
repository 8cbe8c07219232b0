"""The precisions rpx knows and how many bytes a floating-point element takes at each.

Execution support is per backend and roofline peaks are per GPU; this is the shared vocabulary both check against.
"""

from __future__ import annotations

import difflib

from rpx_core.errors import RpxError

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
#: Bytes one floating-point element takes at each precision: tf32 is stored as fp32, fp8 and int8 in one byte.
BYTES_PER_ELEMENT = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


class UnknownPrecisionError(RpxError):
    """The precision is not one rpx knows (see PRECISIONS)."""


def check_precision(precision: str) -> str:
    """Return ``precision`` if rpx knows it, else raise UnknownPrecisionError with the closest known name."""
    if precision not in PRECISIONS:
        close = difflib.get_close_matches(precision, PRECISIONS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownPrecisionError(f"unknown precision {precision!r} (known: {', '.join(PRECISIONS)}){hint}")
    return precision
