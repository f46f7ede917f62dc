"""What the HTTP layer (app.py) calls `engine`: one interface, two implementations. `AsyncEngine`
(async_engine.py) drives one engine in this process; `RayEngineClient` (ray_client.py) stands in front of N engine
replicas on Ray Serve. The app reads nothing else of either, so a route written against this works for both;
tests/test_server.py checks that both classes implement every member."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from ..config import SpeculativeConfig
from ..sampling_params import SamplingParams


@runtime_checkable
class RequestStream(Protocol):
    """One admitted request, as the app sees it: its deltas, and a way to stop it."""
    replica: str | None                          # behind a router: the replica that decodes it

    def deltas(self) -> AsyncIterator[Any]:      # engine.StreamDelta items; raises the request's error
        ...

    def abort(self) -> None:
        ...


@runtime_checkable
class EngineClient(Protocol):
    default_spec: SpeculativeConfig              # the server-wide speculative config
    max_queued: int
    last_error: str | None

    # what the app needs to parse and size a request
    @property
    def tokenizer(self) -> Any: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def model_name(self) -> str | None: ...

    # admission: try_admit() reserves a place before any tokenizing; submit() turns it into a request,
    # release_admission() gives it back when the request fails before submit
    def try_admit(self) -> bool: ...

    def release_admission(self) -> None: ...

    def admit_more(self, count: int) -> None: ...    # an admitted request's other choices (n): reserved as one

    def observe_rejected(self) -> None: ...

    async def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams, spec: SpeculativeConfig,
                     pool: str = "default", arm: str = "spec", affinity: str | None = None,
                     cache_salt: str | None = None) -> RequestStream: ...

    # load and health
    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def alive(self) -> bool: ...

    # status and metrics
    def method_names(self) -> tuple[str, ...]: ...   # the methods a request may name, without their status

    def methods(self) -> list[dict]: ...         # the methods it runs, each with its status section

    def policy_status(self) -> dict | None: ...

    def prefix_cache_status(self) -> dict: ...

    def render_metrics(self) -> bytes: ...

    # lifecycle
    async def startup(self) -> None: ...

    def shutdown(self, timeout: float = 30.0) -> None: ...
