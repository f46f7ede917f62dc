"""The HTTP layer's state: the engine it talks to and the server's own settings (what `specdec serve`'s flags
set beside EngineArgs), shared by the app's routes, admission and responses."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .engine_client import EngineClient

RETRY_AFTER_S = 1
# 2 MiB: a prompt that fills a 32k-token window is ~0.3 MB even as JSON-escaped CJK text or a list of token ids,
# so this leaves ~7x headroom, while a larger body cannot be a prompt that fits and only costs parse time.
DEFAULT_MAX_REQUEST_BYTES = 2 * 1024 * 1024
DEFAULT_MAX_SPEC_POOLS = 32
OTHER_POOL = "other"          # where spec_pool tags beyond --max-spec-pools go


@dataclass
class ServerState:
    engine: EngineClient             # an AsyncEngine, or a RayEngineClient in front of N engine replicas
    served_model_name: str | None        # None: the engine's model name (known once it has started)
    api_key: str | None = None           # one key (shorthand for api_keys={key: ""})
    api_keys: dict[str, str] = field(default_factory=dict)   # {key: tenant} (launch.api_keys); empty: no auth
    drain_timeout_s: float = 30.0
    traffic_fraction: float = 1.0        # share of requests (by request id hash) that may speculate
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_spec_pools: int = DEFAULT_MAX_SPEC_POOLS   # distinct client spec_pool tags; later new ones share OTHER_POOL
    dashboard: bool = True               # GET /dashboard and /v1/dashboard/data (--no-dashboard: off)
    vllm_metrics: bool = False           # /metrics also under vLLM's names (--export-vllm-metrics)
    draining: bool = field(default=False, init=False)   # SIGTERM seen: no new requests
    closed: bool = field(default=False, init=False)     # drain deadline passed: the engine is shut down
    pools: set = field(default_factory=set, init=False)
    drain_task: asyncio.Future | None = field(default=None, init=False)   # drain() in progress

    def __post_init__(self):
        if self.api_key and not self.api_keys:
            self.api_keys = {self.api_key: ""}

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len
