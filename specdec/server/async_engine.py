"""The engine loop, apart from the event loop: a worker thread drives `LLMEngine.step()`; HTTP handlers await.

- Admission: `try_admit()` reserves a place (fails fast when the queue is full, before any tokenizing); `submit()`
  turns the reservation into a request. A place is a free running slot (`max_num_seqs`) or one of `max_queued`
  waiting places.
- The worker (the engine's compute thread, which also loaded the models: see compute.py) adds submitted requests
  to the engine at step boundaries (continuous batching: they join the running batch while others decode),
  aborts requests whose client left (their KV and draft state are freed before the next step), runs one step,
  and hands each request its delta through an asyncio queue fed with `call_soon_threadsafe`. A request's error
  fails that request only.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from ..config import AUTO, SpeculativeConfig
from ..engine import StepOutput
from ..sampling.grammar import warm as warm_grammar
from ..sampling_params import SamplingParams
from .compute import ComputeThread
from .metrics import ServerMetrics

log = logging.getLogger("specdec.server")
SETTLE_AFTER_IDLE_S = 0.3   # the engine settles the prefix cache only after this long without requests
# an idle engine's first step waits at most this long for requests already admitted and still tokenizing, so a
# burst that arrives together prefills together (docs/benchmarks/serve-vs-llamacpp/intel-amx/c4-gather)
GATHER_S = 0.05
STATE_SAVE_EVERY = 16       # finished requests between writes of the methods' state files (--suffix-cache)


def warm_tokenizer(tokenizer) -> None:
    """Build what a server's first request would otherwise pay for: the tokenizer's tables and llguidance's view of
    it (~1 s for a 150k vocabulary; structured outputs and their admission checks use it)."""
    tokenizer.warm()
    warm_grammar(tokenizer)


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
    last_token_at: float | None = None   # when its last delta with tokens went out (the ITL histogram's gaps)
    pool: str = "default"
    arm: str = "spec"
    cache_salt: str | None = None        # the request's cache partition (admission.cache_partition)
    seq: object | None = None            # the engine's Sequence once added
    started: bool = False                # left the waiting queue (queue time observed)
    replica: str | None = None           # behind a router: the engine replica that decodes it

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
                 log_interval_s: float = 10.0, compute: ComputeThread | None = None, gather_s: float = GATHER_S):
        self.llm = llm
        self.gather_s = gather_s
        self.compute = compute or ComputeThread()      # the thread that loaded `llm`, when the caller has one
        self.engine = llm.engine
        self.default_spec = default_spec
        self.max_queued = max_queued
        self.metrics = metrics
        self.log_interval_s = log_interval_s
        self._incoming: list[RequestHandle] = []       # submitted, not yet added to the engine
        self._handles: dict[str, RequestHandle] = {}   # added to the engine, not finished
        self._reserved = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stopping = False
        self._worker: Future | None = None
        self._listening = False
        self.healthy = True
        self.last_error: str | None = None
        self._prefix_status: dict = self.engine.prefix_cache_stats()   # a snapshot the engine thread refreshes
        self._finished_since_save = 0
        self._last_busy = time.monotonic()         # the engine thread's last step with requests

    # -- what the HTTP layer reads (RayEngineClient answers the same names for a set of replicas) ----------
    @property
    def tokenizer(self):
        return self.llm.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    @property
    def model_name(self) -> str:
        return self.llm.target.name

    def method_names(self) -> tuple[str, ...]:
        """The methods a request may name (cheap: no status is collected)."""
        return self.llm.method_names()

    def methods(self) -> list[dict]:
        """The methods this engine runs (a request may name only these), each with its status section."""
        return self.llm.methods()

    def policy_status(self) -> dict | None:
        return self.llm.policy_status()

    def prefix_cache_status(self) -> dict:
        """The prefix cache's queries, hits, hit rate and size, as of the engine thread's last step."""
        return dict(self._prefix_status)

    def render_metrics(self) -> bytes:
        return self.metrics.render()

    def observe_rejected(self) -> None:
        self.metrics.rejected.inc()

    async def startup(self) -> None:
        """Before serving: measure (or read) the cost model for method auto and export every pool's state, warm
        the tokenizer, start the worker thread."""
        if self.default_spec.method == AUTO:
            await self.compute.run(self.llm.policy)
            self.llm.policy().set_listener(self.metrics.set_pool_enabled)
        await asyncio.to_thread(warm_tokenizer, self.llm.tokenizer)
        self.start()

    # -- admission (event loop side) -------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting + len(self._incoming) + self._reserved

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def alive(self) -> bool:
        return self.healthy and self._worker is not None and not self._worker.done()

    def try_admit(self) -> bool:
        with self._lock:
            free_slots = max(0, self.engine.sched_cfg.max_num_seqs - self.engine.num_running)
            if self._stopping or self.num_waiting >= self.max_queued + free_slots:
                return False
            self._reserved += 1
            return True

    def release_admission(self) -> None:
        with self._wake:
            self._reserved -= 1
            self._wake.notify()             # an idle engine may be gathering the admissions in flight

    def admit_more(self, count: int) -> None:
        """Places for an admitted request's other choices (n > 1): the request was admitted as a whole."""
        with self._lock:
            self._reserved += count

    async def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                     spec: SpeculativeConfig, pool: str = "default", arm: str = "spec",
                     affinity: str | None = None, cache_salt: str | None = None) -> RequestHandle:
        """Turns an admission into a request (`affinity`, the client's spec_pool tag, matters only to a router
        in front of several engines)."""
        handle = RequestHandle(request_id, prompt_ids, params, spec, asyncio.get_running_loop(), pool=pool, arm=arm,
                               cache_salt=cache_salt)
        with self._wake:
            self._reserved -= 1
            self._incoming.append(handle)
            self.metrics.set_queue(self.num_running, self.num_waiting)
            self._wake.notify()
        return handle

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        self._worker = self.compute.submit(self._loop)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop admitting; let queued and running requests finish for up to `timeout` s, then abort the rest."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self._incoming or self._handles):
            time.sleep(0.05)
        with self._lock:
            pending = list(self._incoming) + list(self._handles.values())
        for h in pending:
            h.abort()
        with self._wake:
            self._wake.notify()
        if self._worker is not None:
            wait([self._worker], timeout=10)
        try:
            self.compute.call(self.llm.save_state)
        except Exception:  # noqa: BLE001 - a failed save loses what the pools learned since the last one, no more
            log.exception("could not save a method's state file")
        self.compute.stop()

    # -- worker thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        last_log = time.monotonic()
        while True:
            with self._wake:
                while not self._incoming and not self._handles:
                    if self._stopping:
                        return
                    idle = time.monotonic() - self._last_busy
                    if self.engine.has_background_work():
                        # idle for a moment (a client sending its next call at once finds the engine free): settle
                        # the prefix cache, a bounded chunk at a time
                        if idle >= SETTLE_AFTER_IDLE_S:
                            break
                        self._wake.wait(timeout=SETTLE_AFTER_IDLE_S - idle)
                        continue
                    self._wake.wait(timeout=1.0)
                    if time.monotonic() - last_log >= self.log_interval_s:
                        break
                if self._incoming and not self._handles:
                    self._gather()
                incoming, self._incoming = self._incoming, []
                # added under the lock: a request taken from `_incoming` and not yet in the engine's waiting list
                # would count in neither, and try_admit would admit past the queue's size meanwhile
                for handle in incoming:
                    self._add(handle)
            for handle in [h for h in self._handles.values() if h.aborted.is_set()]:
                self._abort(handle)
            if self._handles:               # only this server's requests are in the engine
                try:
                    outputs = self.engine.step()
                except Exception as exc:  # noqa: BLE001 - the engine's own failure: every request errs, loop goes on
                    log.exception("engine step failed")
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    outputs = [StepOutput(rid, None, exc) for rid in list(self._handles)]
                info = self.engine.last_step
                if info.num_seqs:
                    self.metrics.observe_step(info.num_seqs, info.num_rows, info.num_preempted,
                                              self.engine.kv_usage())
                for out in outputs:
                    self._dispatch(out)
                self._mark_started()
                self._last_busy = time.monotonic()
            elif not incoming:
                try:
                    self.engine.settle()
                except Exception:  # noqa: BLE001 - a failed settle drops the cache; requests are unaffected
                    log.exception("prefix cache settle failed; clearing the cache")
                    self.engine.reset_prefix_cache()
            self._prefix_status = self.engine.prefix_cache_stats()
            self.metrics.set_prefix_cache(self._prefix_status)
            self.metrics.set_queue(self.num_running, self.num_waiting)
            if time.monotonic() - last_log >= self.log_interval_s:
                line = self.metrics.interval_log_line()
                if line:
                    log.info(line)
                last_log = time.monotonic()

    def _gather(self) -> None:
        """Called holding the lock, the engine idle and a request submitted: wait (at most gather_s) while other
        admitted requests are still being tokenized. Started at once, the first step would prefill the first
        request alone and the others after it (at concurrency 4, three of four first tokens a step later);
        a request that arrives alone finds no other admission and waits for nothing."""
        deadline = time.monotonic() + self.gather_s
        while self._reserved > 0 and not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wake.wait(timeout=left)

    def _add(self, handle: RequestHandle) -> None:
        if handle.aborted.is_set():          # disconnected while queued: never started
            self.metrics.observe_abort(None)
            handle._push(RequestAborted(handle.request_id))
            return
        try:
            handle.seq = self.engine.add_request(handle.request_id, handle.prompt_ids, handle.params, handle.spec,
                                                 handle.pool, handle.cache_salt)
        except Exception as exc:  # noqa: BLE001 - fails this request only
            handle._push(exc)
            return
        if handle.arm == "plain":
            handle.seq.stats.policy_reason = "rollout: plain arm"
        self._handles[handle.request_id] = handle
        if not self._listening and self.llm.policy_created:
            self.llm.policy().set_listener(self.metrics.set_pool_enabled)     # export every pool's state, once
            self._listening = True

    def _mark_started(self) -> None:
        for h in self._handles.values():
            if not h.started and h.seq is not None and (h.seq.num_computed or h.seq.output_ids):
                h.started = True
                self.metrics.observe_queue_time(time.perf_counter() - h.arrival)

    def _abort(self, handle: RequestHandle) -> None:
        self._handles.pop(handle.request_id, None)
        seq = self.engine.abort(handle.request_id)
        self.metrics.observe_abort(seq.stats if seq is not None else None, handle.pool)
        handle._push(RequestAborted(handle.request_id))

    def _dispatch(self, out: StepOutput) -> None:
        handle = self._handles.get(out.request_id)
        if handle is None:
            return
        if out.error is not None:
            log.error("request %s failed: %s: %s", handle.request_id, type(out.error).__name__, out.error)
            self.last_error = f"{type(out.error).__name__}: {out.error}"
            self._handles.pop(handle.request_id, None)
            self.metrics.observe_failure()
            handle._push(out.error)
            return
        delta = out.delta
        now = time.perf_counter()
        if handle.first_token_at is None:
            handle.first_token_at = now
            self.metrics.observe_first_token(handle.first_token_at - handle.arrival)
        elif delta.token_ids and handle.last_token_at is not None:
            self.metrics.observe_token_gap(now - handle.last_token_at)
        if delta.token_ids:
            handle.last_token_at = now
        handle._push(delta)
        if delta.finished:
            self._handles.pop(handle.request_id, None)
            self.metrics.observe_finished(delta.stats, handle.arrival, handle.arm, handle.pool)
            self._finished_since_save += 1
            if self._finished_since_save >= STATE_SAVE_EVERY:
                self._finished_since_save = 0
                try:
                    self.llm.save_state()
                except Exception:  # noqa: BLE001 - the server goes on; the next save tries again
                    log.exception("could not save a method's state file")
