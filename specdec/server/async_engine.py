"""The engine loop, apart from the event loop: a worker thread steps requests; HTTP handlers await them.

- Admission: `try_admit()` reserves a slot in the bounded FIFO queue (fails fast when full, before any
  tokenizing); `submit()` turns the reservation into a queued request.
- The worker takes requests in FIFO order and drives each one's `Engine.run` generator one step (one target
  forward) at a time, so an abort is seen within one step; `running` is a list so a batching scheduler can
  later step several sequences per forward without changing this interface.
- Each request gets its deltas through an asyncio queue fed with `call_soon_threadsafe`. An exception in one
  request's step fails that request only.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field

from ..config import SpeculativeConfig
from ..engine import Engine, StreamDelta
from ..sampling_params import SamplingParams
from .metrics import ServerMetrics

log = logging.getLogger("specdec.server")


class QueueFull(Exception):
    pass


@dataclass
class RequestHandle:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    spec: SpeculativeConfig
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    aborted: threading.Event = field(default_factory=threading.Event)
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    pool: str = "default"
    arm: str = "spec"
    decision: object | None = None       # the policy's Decision (method "auto")

    def abort(self) -> None:
        self.aborted.set()

    def _push(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:          # the event loop is gone (server shutting down)
            pass

    async def deltas(self):
        """Async iterator of StreamDelta; raises the request's error if its step failed."""
        while True:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return


class RequestAborted(Exception):
    pass


class AsyncEngine:
    def __init__(self, llm, default_spec: SpeculativeConfig, max_queued: int, metrics: ServerMetrics,
                 log_interval_s: float = 10.0):
        self.llm = llm
        self.default_spec = default_spec
        self.max_queued = max_queued
        self.metrics = metrics
        self.log_interval_s = log_interval_s
        self._engines: dict[tuple, Engine] = {}
        self._waiting: collections.deque[RequestHandle] = collections.deque()
        self._reserved = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._running: list[tuple[RequestHandle, object, object]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.healthy = True
        self.last_error: str | None = None

    # -- admission (event loop side) -------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + self._reserved

    @property
    def num_running(self) -> int:
        return len(self._running)

    def try_admit(self) -> bool:
        with self._lock:
            # while nothing runs, one admitted request will run, not wait (it may still be tokenizing, off the loop)
            idle = 0 if self._running else 1
            if self._stopping or len(self._waiting) + self._reserved >= self.max_queued + idle:
                return False
            self._reserved += 1
            return True

    def release_admission(self) -> None:
        with self._lock:
            self._reserved -= 1

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
               spec: SpeculativeConfig, pool: str = "default", arm: str = "spec") -> RequestHandle:
        handle = RequestHandle(request_id, prompt_ids, params, spec, asyncio.get_running_loop(), pool=pool, arm=arm)
        with self._wake:
            self._reserved -= 1
            self._waiting.append(handle)
            self.metrics.set_queue(len(self._running), len(self._waiting) + self._reserved)
            self._wake.notify()
        return handle

    def engine_for(self, spec: SpeculativeConfig) -> Engine:
        key = (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_max, spec.prompt_lookup_min)
        if key not in self._engines:
            self._engines[key] = self.llm.make_engine(spec)
        return self._engines[key]

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="specdec-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop admitting; let queued and running requests finish for up to `timeout` s, then abort the rest."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self._waiting or self._running):
            time.sleep(0.05)
        with self._lock:
            pending = list(self._waiting) + [h for h, _, _ in self._running]
        for h in pending:
            h.abort()
        with self._wake:
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- worker thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        last_log = time.monotonic()
        while True:
            with self._wake:
                while not self._waiting and not self._running:
                    if self._stopping:
                        return
                    self._wake.wait(timeout=1.0)
                    if time.monotonic() - last_log >= self.log_interval_s:
                        break
                if not self._running and self._waiting:
                    self._start_next()
                self.metrics.set_queue(len(self._running), len(self._waiting) + self._reserved)
            for entry in list(self._running):
                self._step(entry)
            if time.monotonic() - last_log >= self.log_interval_s:
                line = self.metrics.interval_log_line()
                if line:
                    log.info(line)
                last_log = time.monotonic()

    def _start_next(self) -> None:
        handle = self._waiting.popleft()
        if handle.aborted.is_set():          # disconnected while queued: never started
            self.metrics.observe_abort(None)
            handle._push(RequestAborted(handle.request_id))
            return
        try:
            if handle.spec.method == "auto":
                engine, seq, handle.decision = self.llm.auto_sequence(
                    handle.prompt_ids, handle.params, handle.request_id, handle.pool,
                    load=len(self._running) + len(self._waiting) + self._reserved)
            else:
                engine = self.engine_for(handle.spec)
                seq = engine.new_sequence(handle.prompt_ids, handle.params)
                if handle.arm == "plain":
                    seq.stats.policy_reason = "rollout: plain arm"
        except Exception as exc:  # noqa: BLE001 - fails this request only
            handle._push(exc)
            return
        self.metrics.observe_queue_time(time.perf_counter() - handle.arrival)
        self._running.append((handle, seq, engine.run(seq)))

    def _step(self, entry) -> None:
        handle, seq, gen = entry
        if handle.aborted.is_set():
            gen.close()                      # releases the target's and the draft's caches
            self._running.remove(entry)
            self.metrics.observe_abort(seq.stats)
            handle._push(RequestAborted(handle.request_id))
            return
        try:
            delta: StreamDelta = next(gen)
        except Exception as exc:  # noqa: BLE001 - one request's failure never takes down the others
            log.exception("request %s failed", handle.request_id)
            self.last_error = f"{type(exc).__name__}: {exc}"
            gen.close()
            self._running.remove(entry)
            self.metrics.observe_failure()
            handle._push(exc)
            return
        if handle.first_token_at is None:
            handle.first_token_at = time.perf_counter()
            self.metrics.observe_first_token(handle.first_token_at - handle.arrival)
        handle._push(delta)
        if delta.finished:
            gen.close()                      # run its `finally` now: caches released with the request
            self._running.remove(entry)
            if handle.decision is not None:
                self.llm.policy().record(handle.pool, handle.decision, handle.params.temperature, delta.stats,
                                         seq.controller)
            self.metrics.observe_finished(delta.stats, handle.arrival, handle.arm)
