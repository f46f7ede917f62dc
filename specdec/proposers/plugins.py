"""Third-party proposers: installed packages name a method declaration in the `specdec.proposers` entry-point
group (vLLM loads its plugins from entry-point groups the same way):

    [project.entry-points."specdec.proposers"]
    repeat = "my_package:METHOD"          # a specdec.Method, a list of them, or a callable returning either

The method table (proposers/registry.py) loads them when it is first read, after the built-in methods, so the
method then works everywhere a built-in one does: LLM, `specdec generate`, `specdec serve` (server-wide and per
request), `bench offline`, status and auto.
SPECDEC_PLUGINS (vLLM's VLLM_PLUGINS) limits which entry points load: unset loads all, a comma list loads those
names, an empty value none. A plugin that fails to import or declares a bad row is one warning line, and specdec
goes on with the methods it has.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from importlib.metadata import entry_points

from .method import Method

GROUP = "specdec.proposers"
log = logging.getLogger("specdec.plugins")
_loaded: dict[str, list[str]] = {}          # entry point name -> the methods it registered


def load_plugins(register: Callable[[Method], Method]) -> dict[str, list[str]]:
    """Hand every installed plugin's methods to `register` (each entry point once per process; register raises
    ValueError for a bad row). Returns {entry point: [method, ...]}."""
    wanted = os.environ.get("SPECDEC_PLUGINS")
    names = None if wanted is None else {n.strip() for n in wanted.split(",") if n.strip()}
    for ep in entry_points(group=GROUP):
        if ep.name in _loaded or (names is not None and ep.name not in names):
            continue
        _loaded[ep.name] = []
        where = f"{ep.name} = {ep.value}"
        try:
            obj = ep.load()
            obj = obj() if callable(obj) and not isinstance(obj, Method) else obj
            methods = list(obj) if isinstance(obj, (list, tuple)) else [obj]
        except Exception as exc:  # noqa: BLE001 - any failure of third-party code is reported, never fatal
            log.warning("specdec: proposer plugin '%s' not loaded: %s: %s", where, type(exc).__name__, exc)
            continue
        dist = ep.dist.name if ep.dist is not None else ep.module
        for m in methods:
            try:
                if isinstance(m, Method) and m.origin == "specdec":
                    m = Method(**{**m.__dict__, "origin": dist})
                register(m)
            except ValueError as exc:
                log.warning("specdec: proposer plugin '%s' not loaded: %s", where, exc)
                continue
            _loaded[ep.name].append(m.name)
    return dict(_loaded)


def loaded_plugins() -> dict[str, list[str]]:
    return dict(_loaded)
