"""Whether the machine was quiet while this process timed something: the cost model is measured once and cached,
so a measurement taken while other processes ran (a second server loading beside this one on a 2-core machine)
would steer the policy from wrong prices for as long as the cache lives. Linux only (/proc); elsewhere nothing is
known and a measurement counts as quiet."""
from __future__ import annotations

import os
from pathlib import Path

STAT = Path("/proc/stat")
SELF_STAT = Path("/proc/self/stat")
# the share of all CPUs other processes may keep busy while a measurement still counts as quiet: a tenth of a
# 2-core machine is a fifth of one core
QUIET_SHARE = 0.1 if (os.cpu_count() or 1) <= 4 else 0.05


def cpu_times() -> tuple[int, int] | None:
    """(idle + iowait, total) jiffies over all CPUs, or None where /proc/stat is not there."""
    try:
        fields = STAT.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    values = [int(x) for x in fields]
    return values[3] + (values[4] if len(values) > 4 else 0), sum(values[:8])


def own_jiffies() -> int | None:
    """User + system time of this process's threads so far, in /proc/stat's clock ticks (None: unknown)."""
    try:
        text = SELF_STAT.read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()        # the command name, in parentheses, may hold spaces
    return int(fields[11]) + int(fields[12])       # utime, stime (fields 14 and 15 of proc(5))


class ForeignLoad:
    """`with ForeignLoad() as load: ...` -> load.fraction: the share of all CPUs' time that other processes kept
    busy meanwhile (None where /proc cannot tell). This process's own threads are not counted, so a measurement
    that keeps every core busy itself still reads 0 on a quiet machine."""

    def __init__(self):
        self.fraction: float | None = None

    def __enter__(self) -> ForeignLoad:
        self._cpu, self._own = cpu_times(), own_jiffies()
        return self

    def __exit__(self, *exc) -> None:
        cpu, own = cpu_times(), own_jiffies()
        if None in (cpu, own, self._cpu, self._own) or cpu[1] <= self._cpu[1]:
            return
        total = cpu[1] - self._cpu[1]
        busy = total - (cpu[0] - self._cpu[0])
        self.fraction = max(0.0, busy - (own - self._own)) / total

    @property
    def quiet(self) -> bool:
        return self.fraction is None or self.fraction <= QUIET_SHARE



def wait_for_quiet(timeout_s: float = 60.0, window_s: float = 0.5) -> float:
    """Block until a window of `window_s` seconds in which other processes kept at most QUIET_SHARE of the CPUs
    busy, or `timeout_s` passes. Returns the seconds waited."""
    import time

    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        with ForeignLoad() as load:
            time.sleep(window_s)
        if load.quiet:
            break
    return time.perf_counter() - start
