"""The one thread that runs an engine's torch work in a server process: it loads the models, measures the cost
model, then drives the engine's steps.

Why one thread: libgomp (torch's OpenMP on Linux) gives every thread that opens a parallel region a team of its
own, and once it manages more threads than there are CPUs it stops spinning between regions: a team's workers
sleep on a futex after each region and are woken for the next. A forward opens a few hundred regions, so steps
run from a second thread while the loading thread's team still exists were much slower (docs/benchmarks/
server-overhead). The HTTP side (event loop, tokenizer threads) never runs torch.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class ComputeThread:
    """One daemon worker thread; work runs in submission order. The engine loop holds it until the engine stops,
    so only start-up work (loading, measuring) is submitted before it."""

    def __init__(self, name: str = "specdec-engine"):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)

    @property
    def current(self) -> bool:
        """Is the caller this thread?"""
        return threading.current_thread() is self._thread

    def submit(self, fn: Callable[..., T], *args, **kwargs) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """`fn(*args, **kwargs)` on this thread, waited for (from this thread itself: a plain call)."""
        if self.current:
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()

    async def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """`call` for an event loop: awaits this thread without blocking the loop."""
        if self.current:
            return fn(*args, **kwargs)
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def stop(self) -> None:
        """The thread ends after the work already submitted."""
        self._queue.put(None)
