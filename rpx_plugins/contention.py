"""Whether other work competed with a measurement: the machine's CPU time less rpx's own, the hypervisor's steal,
and other processes on the measured device.

A latency measured while other processes ran can be tight and wrong at once (a CPU MLP taking 0.88 ms per call read
23.9 ms with a 1.4% spread on a shared machine): the samples cannot say so, the machine can. ``/proc/stat`` counts
every CPU's busy, idle and stolen time since boot; read at both ends of the region, less what ``os.times()`` says
rpx's own process (every thread) used, it gives what the rest of the machine did meanwhile. Platforms without
``/proc/stat`` record no figure (None) and no judgement.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import attrs

from rpx_core.types.latency import Contention

PROC_STAT = "/proc/stat"
METHOD = (
    "/proc/stat CPU times at the region's ends (busy = user + nice + system + irq + softirq) less os.times() of "
    "rpx's process; steal from /proc/stat; load average from os.getloadavg(); device processes from the backend"
)
#: Shorter regions are not judged: /proc/stat counts in clock ticks (10 ms), too coarse to tell.
MIN_JUDGED_SECONDS = 0.1
#: Competition for the cores: the rest of the machine plus rpx used more than this share of them.
FULL_SHARE = 0.9
#: Time the hypervisor gave other virtual machines, as a share of all CPU time, above which the region was contended.
STEAL_SHARE = 0.02


@attrs.frozen
class CpuTimes:
    """Seconds of CPU time summed over every CPU since boot."""

    busy: float
    steal: float
    total: float


def read_cpu_times(path: str = PROC_STAT) -> CpuTimes | None:
    """The aggregate ``cpu`` line of ``/proc/stat`` in seconds; None where there is none (not Linux)."""
    try:
        with open(path) as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = ([int(v) for v in fields[1:9]] + [0] * 8)[:8]
    tick = os.sysconf("SC_CLK_TCK")
    busy = user + nice + system + irq + softirq
    return CpuTimes(busy / tick, steal / tick, (busy + idle + iowait + steal) / tick)


def own_cpu_seconds() -> float:
    """CPU seconds rpx's process used so far, every thread, user and system."""
    times = os.times()
    return times.user + times.system


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class ContentionMeter:
    """Reads the machine at :meth:`start` and :meth:`stop`; ``stop`` says whether other work competed between them.
    Every source is injectable, so a test decides what the machine did."""

    def __init__(self, threshold: float, device_processes: Callable[[], tuple[str, ...] | None] = lambda: None, *,
                 cpu_times: Callable[[], CpuTimes | None] = read_cpu_times,
                 own_seconds: Callable[[], float] = own_cpu_seconds, cores: int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 load: Callable[[], float | None] = load_average) -> None:
        self.threshold = threshold
        self.device_processes = device_processes
        self.cpu_times, self.own_seconds, self.clock, self.load = cpu_times, own_seconds, clock, load
        self.cores = cores or os.cpu_count()
        self._start: tuple[CpuTimes | None, float, float] | None = None

    def start(self) -> None:
        self._start = (self.cpu_times(), self.own_seconds(), self.clock())

    def stop(self) -> Contention:
        if self._start is None:
            raise RuntimeError("ContentionMeter.stop() before start()")
        before, own_before, began = self._start
        after, own_after, ended = self.cpu_times(), self.own_seconds(), self.clock()
        seconds = ended - began
        others = self.device_processes()
        contention = Contention(METHOD, cores=self.cores, seconds=seconds, load_average=self.load(),
                                device_processes=others)
        if before is not None and after is not None and seconds > 0:
            own = (own_after - own_before) / seconds
            elapsed_cpu = after.total - before.total
            contention = attrs.evolve(
                contention, own_cores=own,
                other_cores=max(0.0, (after.busy - before.busy) / seconds - own),
                steal_share=(after.steal - before.steal) / elapsed_cpu if elapsed_cpu > 0 else None,
            )
        return attrs.evolve(contention, problem=self.problem(contention))

    def problem(self, contention: Contention) -> str | None:
        """What competed with rpx, in words; None when nothing did (or the region was too short to tell)."""
        found = []
        if contention.device_processes:
            listed = ", ".join(contention.device_processes[:3]) + (", ..." if len(contention.device_processes) > 3 else "")
            found.append(f"{len(contention.device_processes)} other process(es) used the device ({listed})")
        if (contention.seconds or 0) >= MIN_JUDGED_SECONDS and contention.other_cores is not None and self.cores:
            own, other = contention.own_cores or 0.0, contention.other_cores
            if other > self.threshold * self.cores and own + other > FULL_SHARE * self.cores:
                load = "" if contention.load_average is None else f" (load average {contention.load_average:.1f})"
                found.append(f"other processes kept {other:.1f} of the {self.cores} cores busy while rpx used "
                             f"{own:.1f}{load}")
            if (contention.steal_share or 0.0) > STEAL_SHARE:
                found.append(f"the hypervisor stole {contention.steal_share:.0%} of the CPU time")
        return "; ".join(found) or None
