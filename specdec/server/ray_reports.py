"""The ingress process's registry of its engine-replica routers (SpecPoolRouter registers itself here).

Serve pickles a request router's module by value, so the registry lives in this module, imported by reference,
where the ingress's code and the router find the same objects."""
from __future__ import annotations

import threading
import weakref

_routers: dict[str, weakref.WeakSet] = {}
_lock = threading.Lock()


def register(name: str, router) -> None:
    with _lock:
        _routers.setdefault(name, weakref.WeakSet()).add(router)


def replica_reports(name: str) -> dict[str, dict]:
    """What each live replica of deployment `name` last reported through `record_routing_stats` (empty before the
    handle's first use)."""
    with _lock:
        routers = list(_routers.get(name, ()))
    out: dict[str, dict] = {}
    for router in routers:
        out.update(router.reports())
    return out
