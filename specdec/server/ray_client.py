"""The ingress's side of `specdec serve --replicas N` (ray_serve.py): `RayEngineClient` is the EngineClient the
FastAPI app talks to, in front of N engine replicas, and `RemoteHandle` one request decoded on a replica; with what
a replica streams back (`Accepted`, `Refused`, `Failed`)."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from .async_engine import QueueFull, RequestAborted, warm_tokenizer
from .metrics import merge_labelled

log = logging.getLogger("specdec.server")
ENGINE_NAME = "SpecdecEngine"


# -- what a replica streams back ---------------------------------------------------------------------------------
@dataclass
class Accepted:
    replica: str
    pid: int


@dataclass
class Refused:              # the replica's own queue is full (Serve's limits normally stop a request earlier)
    replica: str


@dataclass
class Failed:
    kind: str               # "aborted" (the replica is shutting down) | "error"
    message: str


class ReplicaLost(RuntimeError):
    """The engine replica decoding this request died (or became unreachable) before it finished."""


# -- the ingress's view of the replicas --------------------------------------------------------------------------
class RemoteHandle:
    """The app's request handle for a request decoded on a replica (same surface as RequestHandle)."""

    def __init__(self, gen, accepted: Accepted, client: RayEngineClient):
        self._gen = gen
        self.replica = accepted.replica
        self.pid = accepted.pid
        self._client = client
        self._done = False
        self._cut = False

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._gen.cancel()
            self._client._finished(self)

    def cut(self) -> None:           # drain deadline: end with RequestAborted
        self._cut = True
        self.abort()

    async def deltas(self):
        import ray.exceptions
        from ray.serve.exceptions import RequestCancelledError

        try:
            async for item in self._gen:
                if isinstance(item, Failed):
                    raise RequestAborted(item.message) if item.kind == "aborted" else RuntimeError(item.message)
                yield item
                if item.finished:
                    self._done = True
                    self._client._finished(self)
                    return
        except RequestCancelledError:
            if self._cut:
                raise RequestAborted("cut at the drain deadline") from None
            raise
        except ray.exceptions.RayError as exc:
            self._client.replica_errors.inc()
            raise ReplicaLost(f"engine replica {self.replica} (pid {self.pid}) was lost mid-request "
                              f"({type(exc).__name__}); Ray Serve restarts it") from None
        raise ReplicaLost(f"engine replica {self.replica} ended the stream early")


class RayEngineClient:
    """What the FastAPI app calls `engine`, for N replicas: admission, submit, metrics and status across them."""

    def __init__(self, handle, default_spec, max_queued: int, engine_name: str = ENGINE_NAME):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self._handle = handle.options(stream=True)
        self._control = handle
        self.default_spec = default_spec
        self.max_queued = max_queued
        self.engine_name = engine_name
        self.tokenizer = None
        self.max_model_len = 0
        self._methods: list[dict] = []                # each replica runs the same methods (one EngineArgs)
        self.model_name: str | None = None
        self._inflight: set[RemoteHandle] = set()
        self._reserved = 0
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.last_error: str | None = None
        self.pool_replicas: dict[str, str] = {}        # spec_pool tag -> the replica that last decoded it
        r = self._registry = CollectorRegistry()
        self.rejected = Counter("specdec:request_rejected", "Requests refused with 429 (queue full)", registry=r)
        self.replica_errors = Counter("specdec:replica_lost_requests",
                                      "Requests ended with an error because their engine replica died", registry=r)
        self.replicas = Gauge("specdec:num_replicas", "Engine replicas reporting to the ingress", registry=r)

    async def startup(self) -> None:
        self._loop = asyncio.get_running_loop()
        info = await self._control.describe.remote()
        self.tokenizer = info["tokenizer"]
        self.max_model_len = info["max_model_len"]
        self._methods = info["methods"]
        self.model_name = info["model_name"]
        await asyncio.to_thread(warm_tokenizer, self.tokenizer)

    def _reports(self) -> dict[str, dict]:
        from .ray_reports import replica_reports

        return replica_reports(self.engine_name)

    # -- the names the app reads -----------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._inflight)

    @property
    def num_waiting(self) -> int:
        return self._reserved

    @property
    def alive(self) -> bool:
        reports = self._reports()
        return not self._stopping and (not reports or any(r.get("alive", True) for r in reports.values()))

    def try_admit(self) -> bool:
        if self._stopping:
            return False
        self._reserved += 1
        return True

    def release_admission(self) -> None:
        self._reserved -= 1

    def admit_more(self, count: int) -> None:
        self._reserved += count                      # an admitted request's other choices (n > 1)

    def observe_rejected(self) -> None:
        self.rejected.inc()

    async def submit(self, request_id, prompt_ids, params, spec, pool: str = "default", arm: str = "spec",
                     affinity: str | None = None, cache_salt: str | None = None) -> RemoteHandle:
        import ray.exceptions
        from ray.serve.exceptions import BackPressureError

        for attempt in range(3):
            gen = self._handle.generate.remote(request_id, prompt_ids, params, spec, pool=pool, arm=arm,
                                               affinity=affinity, cache_salt=cache_salt)
            try:
                first = await gen.__anext__()
            except BackPressureError:
                raise QueueFull() from None
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                # nothing was decoded yet: another replica takes it
                log.warning("request %s: replica lost before it accepted (%s); retrying", request_id,
                            type(exc).__name__)
                if attempt == 2:
                    raise ReplicaLost(f"no engine replica accepted the request ({type(exc).__name__})") from None
                continue
            if isinstance(first, Refused):
                gen.cancel()
                raise QueueFull()
            handle = RemoteHandle(gen, first, self)
            self._reserved -= 1                      # on failure the app releases the admission
            self._inflight.add(handle)
            if affinity is not None and not affinity.startswith("prefix:"):   # spec_pool tags (bounded), not
                self.pool_replicas[affinity] = first.replica                   # every prompt's prefix hash
            return handle
        raise AssertionError("unreachable")

    def _finished(self, handle: RemoteHandle) -> None:
        self._inflight.discard(handle)

    def shutdown(self, timeout: float = 0) -> None:
        """Drain deadline (called from a worker thread): stop admitting; what still decodes after `timeout` s is
        cut on the event loop, each request ending with RequestAborted."""
        self._stopping = True
        deadline = time.monotonic() + timeout
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._inflight and self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: [h.cut() for h in list(self._inflight)])

    def render_metrics(self) -> bytes:
        from prometheus_client import generate_latest

        reports = self._reports()
        self.replicas.set(len(reports))
        texts = {rid: r["metrics"] for rid, r in sorted(reports.items()) if r.get("metrics")}
        texts["ingress"] = generate_latest(self._registry)
        return merge_labelled(texts)

    def method_names(self) -> tuple[str, ...]:
        """The methods every replica runs, as the first replica described them (no report is read)."""
        return tuple(row["method"] for row in self._methods)

    def methods(self) -> list[dict]:
        """The methods every replica runs, each method's status section per replica (each replica keeps the
        state of the pools routed to it: suffix decoding's, for one)."""
        reports = sorted(self._reports().items())
        out = []
        for row in self._methods:
            sections = {rid: next((m["status"] for m in r.get("methods") or [] if m["method"] == row["method"]), {})
                        for rid, r in reports}
            out.append({**row, "status": {"replicas": sections}})
        return out

    def prefix_cache_status(self) -> dict:
        """Every replica's prefix cache, and their queries and hits summed."""
        caches = {rid: r.get("prefix_cache") or {} for rid, r in sorted(self._reports().items())}
        queries = sum(c.get("queries", 0) for c in caches.values())
        hits = sum(c.get("hits", 0) for c in caches.values())
        return {"enabled": any(c.get("enabled") for c in caches.values()), "queries": queries, "hits": hits,
                "hit_rate": hits / queries if queries else None, "replicas": caches}

    def policy_status(self) -> dict:
        reports = self._reports()
        return {"routing": {"affinity": "spec_pool, else a hash of the prompt's first 64 tokens",
                            "pools": dict(self.pool_replicas)},
                "replicas": {rid: {"running": r.get("running"), "waiting": r.get("waiting"), "alive": r.get("alive"),
                                   "pid": r.get("pid"), "policy": r.get("policy")}
                             for rid, r in sorted(reports.items())}}
