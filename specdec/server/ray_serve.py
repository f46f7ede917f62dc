"""`specdec serve --replicas N`: the OpenAI server as a Ray Serve application, N engine replicas behind one endpoint.

    HTTP -> Serve proxy -> SpecdecIngress (1 replica: the same FastAPI app as `specdec serve`; tokenizes, checks,
            |                              streams, answers /metrics and /v1/speculative/status for all replicas)
            +-- SpecPoolRouter --> SpecdecEngine x N (each loads the models once and runs one AsyncEngine:
                                   continuous batching, speculation, its own acceptance pools and metrics)

- A request travels to a replica as token ids; the replica answers with a stream: first `Accepted` (its id and
  pid) or `Refused` (its queue is full), then the engine's deltas, ending with the finished delta or `Failed`.
- Back-pressure: Serve sends a replica at most `max_num_seqs` requests (`max_ongoing_requests`); more wait in the
  router, up to `--max-queued`; beyond that Serve refuses (BackPressureError) and the client gets 429 with
  Retry-After.
- A replica that dies: its requests end with an error (a stream: an error event, then [DONE]); a request that it
  had not accepted yet is sent to another replica; Serve starts a new replica (the controller notices the dead
  actor, or `check_health` failing when its engine thread died).
- Metrics: each replica reports its Prometheus text through Serve's `record_routing_stats` (every second); the
  ingress's /metrics writes every replica's samples with a `replica` label, beside its own (`replica="ingress"`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

from ..engine_args import parse_speculative_config
from ..errors import SpecDecError
from .async_engine import QueueFull, RequestAborted, warm_tokenizer
from .launch import build_engine, examples, server_state
from .metrics import merge_labelled

log = logging.getLogger("specdec.server")
APP_NAME = "specdec"
ENGINE_NAME = "SpecdecEngine"
INGRESS_NAME = "SpecdecIngress"
STATS_PERIOD_S = 1.0
AUTOSCALING_KEYS = {"min_replicas", "max_replicas", "initial_replicas", "target_ongoing_requests",
                    "upscale_delay_s", "downscale_delay_s", "downscale_to_zero_delay_s", "upscaling_factor",
                    "downscaling_factor", "smoothing_factor", "upscale_smoothing_factor",
                    "downscale_smoothing_factor", "metrics_interval_s", "look_back_period_s",
                    "aggregation_function"}


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


# -- the engine replica ------------------------------------------------------------------------------------------
class EngineReplica:
    """One engine: the models, an AsyncEngine, its metrics. Constructed by Serve on a worker process."""

    async def __init__(self, args):
        from ray import serve

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.engine, self.name = await asyncio.to_thread(build_engine, args)
        self.replica = serve.get_replica_context().replica_id.unique_id
        await self.engine.startup()          # the cost model (method auto), the worker thread: ready before traffic

    def describe(self) -> dict:
        """What the ingress needs before it can serve: the tokenizer, the context window, the defaults."""
        e = self.engine
        return {"tokenizer": e.tokenizer, "max_model_len": e.max_model_len, "methods": e.methods(),
                "default_spec": e.default_spec, "model_name": self.name}

    async def generate(self, request_id: str, prompt_ids: list[int], params, spec, pool: str = "default",
                       arm: str = "spec", affinity: str | None = None):
        engine = self.engine
        if not engine.try_admit():
            engine.observe_rejected()
            yield Refused(self.replica)
            return
        try:
            handle = await engine.submit(request_id, prompt_ids, params, spec, pool=pool, arm=arm)
        except BaseException:
            engine.release_admission()
            raise
        yield Accepted(self.replica, os.getpid())
        try:
            async for delta in handle.deltas():
                yield delta
        except RequestAborted as exc:
            yield Failed("aborted", str(exc))
        except Exception as exc:  # noqa: BLE001 - this request's failure, sent as data (exceptions may not pickle)
            yield Failed("error", f"{type(exc).__name__}: {exc}")
        finally:
            handle.abort()      # the ingress cancelled (client gone): free the sequence within one step

    def record_routing_stats(self) -> dict:
        e = self.engine
        return {"metrics": e.render_metrics().decode(), "policy": e.policy_status(),
                "prefix_cache": e.prefix_cache_status(), "methods": e.methods(), "running": e.num_running,
                "waiting": e.num_waiting, "alive": e.alive, "last_error": e.last_error, "pid": os.getpid(),
                "at": time.time()}

    def check_health(self) -> None:
        if not self.engine.alive:
            raise RuntimeError(f"engine thread is not running: {self.engine.last_error}")

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown(0)


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

    def observe_rejected(self) -> None:
        self.rejected.inc()

    async def submit(self, request_id, prompt_ids, params, spec, pool: str = "default", arm: str = "spec",
                     affinity: str | None = None) -> RemoteHandle:
        import ray.exceptions
        from ray.serve.exceptions import BackPressureError

        for attempt in range(3):
            gen = self._handle.generate.remote(request_id, prompt_ids, params, spec, pool=pool, arm=arm,
                                               affinity=affinity)
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


class Ingress:
    """The ingress deployment: builds the FastAPI app of `specdec serve` around a RayEngineClient."""

    def __init__(self, engine_handle, args):
        self._engine_handle = engine_handle
        self._args = args

    def __serve_build_asgi_app__(self):
        from .app import create_app

        a = self._args
        client = RayEngineClient(self._engine_handle, parse_speculative_config(a.speculative_config), a.max_queued)
        return create_app(server_state(client, a.served_model_name, a))


# -- the launcher ------------------------------------------------------------------------------------------------
def autoscaling_config(text: str | None, replicas: int) -> dict | None:
    """`--autoscaling-config` JSON (Ray Serve's keys) -> dict; None when absent."""
    if not text:
        return None
    from ..utils import parse_json_object

    obj = parse_json_object(text, "--autoscaling-config")
    unknown = set(obj) - AUTOSCALING_KEYS
    if unknown:
        raise SpecDecError(f"--autoscaling-config: unknown key '{sorted(unknown)[0]}' "
                           f"(known: {', '.join(sorted(AUTOSCALING_KEYS))})")
    obj.setdefault("initial_replicas", replicas)
    obj.setdefault("min_replicas", min(1, obj["initial_replicas"]))
    obj.setdefault("max_replicas", max(obj["initial_replicas"], obj["min_replicas"], 1))
    try:
        from ray.serve.config import AutoscalingConfig
    except ImportError:
        return obj
    try:
        AutoscalingConfig(**obj)                  # Ray Serve's own checks (min <= initial <= max, ...)
    except Exception as exc:  # noqa: BLE001 - pydantic's error, shown in one line
        errs = exc.errors() if hasattr(exc, "errors") else []
        detail = (f"{'.'.join(map(str, errs[0]['loc'])) + ': ' if errs[0].get('loc') else ''}{errs[0]['msg']}"
                  if errs else " ".join(str(exc).split())[:300])
        raise SpecDecError(f"--autoscaling-config: {detail}") from None
    return obj


def threads_per_replica(args) -> int:
    if args.threads:
        return args.threads
    return max(1, (os.cpu_count() or 1) // max(1, args.replicas))


def build_app(args):
    """The Serve application: the ingress bound to N engine replicas."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from .ray_router import SpecPoolRouter

    threads = threads_per_replica(args)
    args.threads = threads
    args.engine_args = replace(args.engine_args, num_threads=threads)     # each replica's share of the cores
    auto = autoscaling_config(args.autoscaling_config, args.replicas)
    engine = serve.deployment(
        EngineReplica, name=ENGINE_NAME,
        num_replicas=None if auto else args.replicas, autoscaling_config=auto,
        max_ongoing_requests=args.max_num_seqs,             # more wait in the router, where they can still spill
        max_queued_requests=args.max_queued if args.max_queued > 0 else -1,
        ray_actor_options={"num_cpus": threads},
        request_router_config=RequestRouterConfig(request_router_class=SpecPoolRouter,
                                                  request_router_kwargs={"name": ENGINE_NAME},
                                                  request_routing_stats_period_s=STATS_PERIOD_S,
                                                  request_routing_stats_timeout_s=5.0),
        health_check_period_s=2.0, health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=args.drain_timeout)
    ingress = serve.deployment(serve.ingress()(Ingress), name=INGRESS_NAME, num_replicas=1,
                               ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000,
                               graceful_shutdown_timeout_s=args.drain_timeout + 5)
    return ingress.bind(engine.bind(args), args)


def _served_name(args) -> str:
    """The model id the ingress serves (the target's name unless --served-model-name), asked of the ingress."""
    import httpx

    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        return httpx.get(f"http://{host}:{args.port}/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return "<model>"


def _has_ray_token() -> bool:
    from pathlib import Path

    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token")).expanduser()
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or path.is_file()


def run_ray_server(args) -> int:
    if args.replicas is None:
        args.replicas = 1
    if args.replicas < 1:
        raise SpecDecError("--replicas must be >= 1")
    autoscaling_config(args.autoscaling_config, args.replicas)       # its errors before anything starts
    if args.ray_address and "RAY_AUTH_MODE" not in os.environ and _has_ray_token():
        # a cluster from `ray start --head` uses token auth once a token exists, but a driver given an explicit
        # address (Ray 2.60) sends the token only when the mode is said (before ray is imported): say it
        os.environ["RAY_AUTH_MODE"] = "token"
    try:
        import ray
        from ray import serve
    except ImportError:
        raise SpecDecError("--replicas needs Ray Serve: pip install 'specdec[ray]'") from None

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_app(args)
    started_ray = args.ray_address is None
    # a local Ray (no --ray-address): one node, this machine's cores; workers inherit this interpreter's sys.path
    ray.init(address=args.ray_address or "local", include_dashboard=False, logging_level=logging.WARNING,
             runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("SPECDEC_")}},
             **({"num_cpus": os.cpu_count()} if started_ray else {}))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)    # returns once every replica is up
        print(examples(args.host, args.port, args.served_model_name or _served_name(args), args.api_key).replace(
            "specdec is ready", f"specdec is ready ({args.replicas} engine replicas on Ray Serve)", 1),
            file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            pass
        log.info("stopping: draining for up to %gs", args.drain_timeout)
    finally:
        try:
            serve.delete(APP_NAME)          # Serve waits graceful_shutdown_timeout_s for in-flight requests
            if started_ray:
                serve.shutdown()
        finally:
            if started_ray:
                ray.shutdown()
    return 0
