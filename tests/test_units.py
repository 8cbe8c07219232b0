"""Human units on the console: every formatter against hand-written expectations."""

import pytest

from rpx_core.show import units


@pytest.mark.parametrize("value, digits, expected", [
    (0, 3, "0"), (1234, 3, "1230"), (12.0, 3, "12.0"), (0.000123456, 3, "0.000123"), (999.96, 3, "1000"),
    (1.005, 2, "1.0"), (-4.567, 3, "-4.57"), (5.066e-05, 3, "0.0000507"),
])  # fmt: skip
def test_significant(value, digits, expected):
    assert units.significant(value, digits) == expected


@pytest.mark.parametrize("ms, expected", [
    (5.066e-05, "50.7 ns"),  # the "5.066e-05 ms"
    (0.0001741, "174 ns"), (0.5444, "544 µs"), (0.99996, "1.00 ms"), (43.23, "43.2 ms"), (2500, "2.50 s"),
    (75_000, "75.0 s"), (None, "-"), (0, "0 s"),
])  # fmt: skip
def test_milliseconds(ms, expected):
    assert units.milliseconds(ms) == expected


@pytest.mark.parametrize("n, expected", [
    (288_800, "289 kB"),  # the "0.0002888 GB"
    (512, "512 B"), (999_960, "1.00 MB"), (80e9, "80.0 GB"), (1.5e12, "1.50 TB"), (None, "-"),
])  # fmt: skip
def test_size(n, expected):
    assert units.size(n) == expected


@pytest.mark.parametrize("fn, value, expected", [
    (units.flops, 3_394_000, "3.39 MFLOP"), (units.flops, 2.347e10, "23.5 GFLOP"), (units.flops, 1.4e14, "140 TFLOP"),
    (units.flops, 600, "600 FLOP"), (units.macs, 1_622_000, "1.62 MMAC"),
    (units.flop_rate, 19.5e12, "19.5 TFLOP/s"), (units.bandwidth, 3.35e12, "3.35 TB/s"),
    (units.count, 5466, "5466"), (units.count, 172_300, "172 k"), (units.count, 6.74e9, "6.74 G"),
    (units.rate, 812.34, "812/s"), (units.rate, 12_345, "12.3 k/s"),
    (units.percent, 0.4213, "42%"), (units.percent, 0.0512, "5.1%"), (units.percent, 1.0, "100%"),
    (units.ratio, 1.0, "1.00x"), (units.ratio, 0.25, "0.250x"), (units.intensity, 10.23, "10.2 FLOP/B"),
])  # fmt: skip
def test_named_units(fn, value, expected):
    assert fn(value) == expected
