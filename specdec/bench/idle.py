"""Wait for an idle machine before a benchmark request: on a 2-core machine one busy process beside a request (a
server still settling its last answer, another endpoint finishing) changes its timing by more than the effect
measured. Linux only (/proc/stat); elsewhere it does not wait."""
from __future__ import annotations

import time
from pathlib import Path

STAT = Path("/proc/stat")


def _cpu_times() -> tuple[int, int] | None:
    """(idle + iowait, total) jiffies over all CPUs, or None where /proc/stat is not there."""
    try:
        fields = STAT.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    values = [int(x) for x in fields]
    return values[3] + (values[4] if len(values) > 4 else 0), sum(values[:8])


def busy_fraction(window_s: float = 0.25) -> float | None:
    """The share of all CPUs' time spent busy over the next `window_s` seconds (None: cannot tell)."""
    a = _cpu_times()
    time.sleep(window_s)
    b = _cpu_times()
    if a is None or b is None or b[1] <= a[1]:
        return None
    return 1.0 - (b[0] - a[0]) / (b[1] - a[1])


def wait_until_idle(max_busy: float = 0.1, timeout_s: float = 30.0, window_s: float = 0.25) -> float:
    """Block until a window of `window_s` seconds shows at most `max_busy` of the CPUs busy, or `timeout_s`
    passes. Returns the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        busy = busy_fraction(window_s)
        if busy is None or busy <= max_busy:
            break
    return time.perf_counter() - start
