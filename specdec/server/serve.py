"""`specdec serve`: load the models, start uvicorn, print ready-to-paste examples, drain on SIGTERM."""
from __future__ import annotations

import logging
import math
import signal
import sys

from .launch import build_engine, check_server_args, example_key, examples, server_state


def run_server(args) -> int:
    engine_args = check_server_args(args)
    from ..loading import resolve_quantization

    # resolved here (after the checks: this may assemble the built-in model) to print it, and so that every Ray
    # replica loads the same weights
    engine_args.quantization = args.quantization = resolve_quantization(engine_args)
    args.engine_args = engine_args             # built once; the engine (or each Ray replica) gets this one
    if args.replicas is not None or args.ray_address or args.autoscaling_config:
        from .ray_serve import run_ray_server

        return run_ray_server(args)

    import uvicorn

    from .app import create_app, drain

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine, name = build_engine(args)
    state = server_state(engine, name, args)
    app = create_app(state)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                print(examples(args.host, args.port, name, example_key(args), args.quantization), file=sys.stderr,
                      flush=True)

        async def shutdown(self, sockets=None):
            # The drain runs first, with the socket still listening: new clients and load-balancer probes get 503
            # (/health: "draining") instead of a refused connection, while the requests in flight finish (at the
            # deadline the rest are cut with an error, which ends their responses); then uvicorn closes the
            # socket and waits for the open connections.
            await drain(state)
            await super().shutdown(sockets)

    # uvicorn's own deadline is only a backstop behind the drain (its expiry cancels handlers mid-body)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                            timeout_graceful_shutdown=math.ceil(args.drain_timeout) + 10)
    server = Server(config)
    # uvicorn drains on SIGTERM, then re-raises the signal once it is done; a no-op handler underneath makes
    # that re-raise harmless, so a drained shutdown exits 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run()
    return 0 if server.started else 1
