"""Figures in human units for everything rpx prints: one place decides how a time, a size or a count reads.

Conventions: decimal prefixes throughout (1 kB = 1e3 bytes, 1 GB = 1e9 bytes, 1 GFLOP = 1e9 FLOPs), as in the
results files; three significant digits by default (a figure rounded to 3 digits is what a reader compares); a
prefix is chosen so the number sits in [1, 1000). Absent figures are ``-``, never zero.
"""

from __future__ import annotations

import math

MISSING = "-"

_SI = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0), ("m", 1e-3), ("µ", 1e-6), ("n", 1e-9))


def significant(value: float, digits: int = 3) -> str:
    """``value`` rounded to ``digits`` significant digits, in plain notation: 0.000123 -> "0.000123", 1234 -> "1234",
    12.0 -> "12.0" (trailing zeros kept: they say how precise the figure is)."""
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    rounded = float(f"{value:.{digits}g}")
    magnitude = math.floor(math.log10(abs(rounded)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{rounded:.{decimals}f}"


def scaled(value: float | None, unit: str, digits: int = 3, *, smallest: str = "n", largest: str = "T") -> str:
    """``value`` (in base units) with the SI prefix that puts it in [1, 1000): 2.5e-5 s -> "25.0 µs"."""
    if value is None:
        return MISSING
    prefixes = [(p, f) for p, f in _SI if _rank(largest) <= _rank(p) <= _rank(smallest)]
    if value == 0:
        return f"0 {unit}"
    for prefix, factor in prefixes:
        if float(significant(abs(value) / factor, digits)) >= 1:  # largest first: 999.96 k rounds to 1.00 M
            return f"{'-' if value < 0 else ''}{significant(abs(value) / factor, digits)} {prefix}{unit}"
    prefix, factor = prefixes[-1]
    return f"{significant(value / factor, digits)} {prefix}{unit}"


def _rank(prefix: str) -> int:
    return [p for p, _ in _SI].index(prefix)


def seconds(value: float | None, digits: int = 3) -> str:
    """A duration in seconds: ns, µs, ms or s (60 s and more stay in seconds: "75.0 s")."""
    if value is not None and abs(value) >= 1:
        return f"{significant(value, digits)} s"
    return scaled(value, "s", digits, largest="")


def milliseconds(value: float | None, digits: int = 3) -> str:
    """A duration given in milliseconds (the results files' unit for latencies and bounds)."""
    return seconds(None if value is None else value / 1e3, digits)


def size(value: float | None, digits: int = 3) -> str:
    """Bytes: B, kB, MB, GB, TB (decimal)."""
    if value is not None and abs(value) < 1000:
        return f"{int(value)} B" if float(value).is_integer() else f"{significant(value, digits)} B"
    return scaled(value, "B", digits, smallest="")


def flops(value: float | None, digits: int = 3) -> str:
    """FLOPs: kFLOP ... TFLOP; fewer than 1000 are counted exactly."""
    return _count_unit(value, "FLOP", digits)


def macs(value: float | None, digits: int = 3) -> str:
    return _count_unit(value, "MAC", digits)


def _count_unit(value: float | None, unit: str, digits: int) -> str:
    if value is not None and abs(value) < 1000:
        return f"{value:g} {unit}"
    return scaled(value, unit, digits, smallest="")


def flop_rate(value: float | None, digits: int = 3) -> str:
    """FLOP per second: GFLOP/s, TFLOP/s."""
    return scaled(value, "FLOP/s", digits, smallest="")


def bandwidth(bytes_per_s: float | None, digits: int = 3) -> str:
    return scaled(bytes_per_s, "B/s", digits, smallest="")


def count(value: float | None, digits: int = 3) -> str:
    """A plain count (parameters, calls): exact below 10,000, else with k/M/G/T: 1234567 -> "1.23 M"."""
    if value is None:
        return MISSING
    if abs(value) < 10_000:
        return f"{value:g}" if isinstance(value, float) else str(value)
    return scaled(value, "", digits, smallest="").rstrip()


def rate(value: float | None, unit: str = "/s", digits: int = 3) -> str:
    """Samples (or frames) per second: "1.23 k/s"; below 1000 plainly: "812/s"."""
    if value is None:
        return MISSING
    if abs(value) < 1000:
        return f"{significant(value, digits)}{unit}"
    return scaled(value, unit, digits, smallest="")


def ratio(value: float | None, digits: int = 3) -> str:
    """A dimensionless ratio: "1.23x"."""
    return MISSING if value is None else f"{significant(value, digits)}x"


def percent(fraction: float | None, digits: int = 2) -> str:
    """A fraction 0-1 as a percentage: 0.4213 -> "42%", 0.0512 -> "5.1%"."""
    if fraction is None:
        return MISSING
    return f"{significant(fraction * 100, digits)}%"


def intensity(flop_per_byte: float | None, digits: int = 3) -> str:
    """Arithmetic intensity, FLOP per byte."""
    return MISSING if flop_per_byte is None else f"{significant(flop_per_byte, digits)} FLOP/B"
