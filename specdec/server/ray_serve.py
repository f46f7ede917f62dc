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
from dataclasses import replace

from ..engine_args import parse_speculative_config
from ..errors import SpecDecError
from .async_engine import RequestAborted
from .launch import api_keys, build_engine, example_key, examples, server_state
from .ray_client import ENGINE_NAME, Accepted, Failed, RayEngineClient, Refused

log = logging.getLogger("specdec.server")
APP_NAME = "specdec"
INGRESS_NAME = "SpecdecIngress"
STATS_PERIOD_S = 1.0
AUTOSCALING_KEYS = {"min_replicas", "max_replicas", "initial_replicas", "target_ongoing_requests",
                    "upscale_delay_s", "downscale_delay_s", "downscale_to_zero_delay_s", "upscaling_factor",
                    "downscaling_factor", "smoothing_factor", "upscale_smoothing_factor",
                    "downscale_smoothing_factor", "metrics_interval_s", "look_back_period_s",
                    "aggregation_function"}


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
                       arm: str = "spec", affinity: str | None = None, cache_salt: str | None = None):
        engine = self.engine
        if not engine.try_admit():
            engine.observe_rejected()
            yield Refused(self.replica)
            return
        try:
            handle = await engine.submit(request_id, prompt_ids, params, spec, pool=pool, arm=arm,
                                         cache_salt=cache_salt)
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
    key = next(iter(api_keys(args.api_key, getattr(args, "api_key_file", None))), None)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
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
        print(examples(args.host, args.port, args.served_model_name or _served_name(args), example_key(args)).replace(
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
