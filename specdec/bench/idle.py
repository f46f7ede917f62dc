"""Wait for an idle machine before a benchmark request: on a 2-core machine one busy process beside a request (a
server still settling its last answer, another endpoint finishing) changes its timing by more than the effect
measured. Linux only (/proc/stat); elsewhere it does not wait."""
from __future__ import annotations

import time

from ..policy.quiet import cpu_times


def busy_fraction(window_s: float = 0.25) -> float | None:
    """The share of all CPUs' time spent busy over the next `window_s` seconds (None: cannot tell)."""
    a = cpu_times()
    time.sleep(window_s)
    b = cpu_times()
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
