"""Whether other work competed with a measurement: /proc/stat read at both ends, less rpx's own CPU time.

The machine is a real /proc/stat-format file written by the test (and, once, this machine's own): which figures the
meter derives from two readings is computed here by hand from the same numbers.
"""

from __future__ import annotations

import os

import pytest

from rpx_plugins.contention import ContentionMeter, read_cpu_times

TICK = os.sysconf("SC_CLK_TCK")


def stat_line(user: int, system: int, idle: int, steal: int = 0) -> str:
    """The aggregate line of /proc/stat: user nice system idle iowait irq softirq steal guest guest_nice (ticks)."""
    return f"cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n"


def meter(tmp_path, before: str, after: str, own: tuple[float, float], seconds: float = 2.0, cores: int = 2,
          processes=lambda: None) -> ContentionMeter:
    stat = tmp_path / "stat"
    readings = iter((before, after))
    owns, clock = iter(own), iter((100.0, 100.0 + seconds))

    def cpu_times():
        stat.write_text(next(readings))
        return read_cpu_times(str(stat))

    return ContentionMeter(0.1, processes, cpu_times=cpu_times, own_seconds=lambda: next(owns), cores=cores,
                           clock=lambda: next(clock), load=lambda: 4.5)


def measure(contention_meter: ContentionMeter):
    contention_meter.start()
    return contention_meter.stop()


def test_other_processes_busy_on_the_cores_are_named(tmp_path):
    # 2 s on 2 cores: the machine was busy 3.6 s (user 3.0 + system 0.6), rpx's own process used 1.0 s of it
    before, after = stat_line(1000, 500, 9000), stat_line(1000 + 3 * TICK, 500 + TICK * 6 // 10, 9000 + TICK * 4 // 10)
    found = measure(meter(tmp_path, before, after, own=(10.0, 11.0)))
    assert found.own_cores == pytest.approx(0.5) and found.other_cores == pytest.approx((3.6 - 1.0) / 2)
    assert found.steal_share == 0 and found.cores == 2 and found.seconds == 2.0 and found.load_average == 4.5
    assert found.problem == "other processes kept 1.3 of the 2 cores busy while rpx used 0.5 (load average 4.5)"


def test_a_quiet_machine_and_a_machine_with_room_to_spare_are_not_contended(tmp_path):
    # nothing but rpx: busy time equals rpx's own
    quiet = measure(meter(tmp_path, stat_line(0, 0, 0), stat_line(2 * TICK, 0, 2 * TICK), own=(0.0, 2.0)))
    assert quiet.other_cores == pytest.approx(0.0) and quiet.problem is None
    # 64 cores, others use 10 of them, rpx 8: more than 10% of the machine, but 18 of 64 leaves plenty of room
    roomy = measure(meter(tmp_path, stat_line(0, 0, 0), stat_line(36 * TICK, 0, 92 * TICK), own=(0.0, 16.0),
                          cores=64))
    assert roomy.other_cores == pytest.approx(10.0) and roomy.problem is None


def test_steal_and_other_processes_on_the_device_are_named(tmp_path):
    stolen = measure(meter(tmp_path, stat_line(0, 0, 0), stat_line(2 * TICK, 0, TICK, steal=TICK), own=(0.0, 2.0),
                           processes=lambda: ("4242 python3", "4343 trainer")))
    assert stolen.steal_share == pytest.approx(0.25) and stolen.device_processes == ("4242 python3", "4343 trainer")
    assert stolen.problem == ("2 other process(es) used the device (4242 python3, 4343 trainer); the hypervisor "
                              "stole 25% of the CPU time")


def test_a_region_too_short_to_read_is_not_judged_and_a_machine_without_proc_stat_gives_no_figure(tmp_path):
    short = measure(meter(tmp_path, stat_line(0, 0, 0), stat_line(TICK, 0, 0), own=(0.0, 0.0), seconds=0.05))
    assert short.other_cores is not None and short.problem is None  # clock ticks are 10 ms: too coarse to tell
    assert read_cpu_times(str(tmp_path / "no-such-file")) is None
    blind = ContentionMeter(0.1, cpu_times=lambda: None)
    blind.start()
    found = blind.stop()
    assert found.other_cores is None and found.own_cores is None and found.problem is None


def test_this_machine_is_read():
    """The real /proc/stat and os.times() of this process (Linux, where CI runs): figures, whatever they are."""
    if read_cpu_times() is None:
        pytest.skip("no /proc/stat here")
    real = ContentionMeter(0.1)
    real.start()
    sum(range(2_000_000))  # some CPU time of rpx's own
    found = real.stop()
    assert found.cores == os.cpu_count() and found.own_cores is not None and found.own_cores >= 0
    assert found.other_cores is not None and found.other_cores >= 0
