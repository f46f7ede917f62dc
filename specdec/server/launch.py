"""What both ways of serving share (`specdec serve` in one process, serve.py; with Ray Serve replicas,
ray_serve.py): the arguments checked (the engine's through EngineArgs.from_cli_args), the engine built from
them, the HTTP layer's state, and the ready-to-paste examples printed at startup."""
from __future__ import annotations

import hashlib
import sys

from ..config import AUTO
from ..engine_args import EngineArgs
from ..errors import SpecDecError


def examples(host: str, port: int, model: str, api_key: str | None, quantization: str | None = None) -> str:
    """Ready-to-paste requests. The Python line names this interpreter (the venv's) and is printed only when the
    `openai` package is importable here (it is a test extra); otherwise a streaming curl stands in."""
    import importlib.util

    base = f"http://{host}:{port}/v1"
    auth = f" -H 'Authorization: Bearer {api_key}'" if api_key else ""
    key = api_key or "none"
    body = (f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Write a Python function that '
            f'reverses a string."}}], "max_tokens": 128')
    text = f"""specdec is ready on {base}  (metrics: http://{host}:{port}/metrics)
"""
    if quantization:
        text += f"target weights: {WEIGHTS.get(quantization, quantization)}\n"
    text += f"""
curl {base}/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}}}'
"""
    if importlib.util.find_spec("openai") is not None:
        sdk = (f"from openai import OpenAI; c = OpenAI(base_url='{base}', api_key='{key}'); "
               f"print(c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': "
               "'Write a Python function that reverses a string.'}], max_tokens=128).choices[0].message.content)")
        text += f"""
{sys.executable} -c "{sdk}"
"""
    else:
        text += f"""
curl -N {base}/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}, "stream": true}}'
"""
    return text


WEIGHTS = {"int4": "int4 (the GGUF's quantized blocks on specdec's CPU kernels; --quantization none for bf16)",
           "int8": "int8 (weight-only, per channel)", "none": "the runtime dtype (--quantization none)"}


def example_key(args) -> str | None:
    """The key the startup examples show: the first --api-key, a placeholder for keys only in a file."""
    if args.api_key:
        return args.api_key[0]
    return "KEY" if getattr(args, "api_key_file", None) else None


def api_keys(keys: list[str] | None, key_file: str | None) -> dict[str, str]:
    """{API key: tenant} from --api-key (repeatable) and --api-key-file (a line a key: `KEY [TENANT]`, `#`
    comments). Each key is its own tenant (a digest of the key: never the key itself) unless the file names the
    tenant, so several keys can share one; a single key is the one tenant "" (as before tenants existed)."""
    out: dict[str, str | None] = {k: None for k in keys or []}
    if key_file is not None:
        try:
            lines = open(key_file, encoding="utf-8").read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecDecError(f"--api-key-file {key_file}: cannot read it ({exc.strerror or exc})") from None
        for n, line in enumerate(lines, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) > 2:
                raise SpecDecError(f"--api-key-file {key_file}:{n}: expected 'KEY [TENANT]', got {len(fields)} fields")
            out[fields[0]] = fields[1] if len(fields) == 2 else None
    if len(out) == 1 and None in out.values():
        return {k: "" for k in out}
    return {k: t if t is not None else hashlib.sha256(k.encode()).hexdigest()[:16] for k, t in out.items()}


def check_server_args(args) -> EngineArgs:
    """The server's own flags checked, and the engine's: the EngineArgs built from them (once: `build_engine`
    takes it from `args.engine_args`)."""
    if args.max_queued < 0:
        raise SpecDecError("--max-queued must be >= 0")
    if not 0 <= args.spec_traffic_fraction <= 1:
        raise SpecDecError("--spec-traffic-fraction must be in [0, 1]")
    if args.max_request_bytes < 1:
        raise SpecDecError("--max-request-bytes must be >= 1")
    if args.max_spec_pools < 0:
        raise SpecDecError("--max-spec-pools must be >= 0")
    if args.drain_timeout < 0:
        raise SpecDecError("--drain-timeout must be >= 0")
    api_keys(args.api_key, getattr(args, "api_key_file", None))        # a bad key file: one line, before loading
    if args.suffix_cache and (args.replicas is not None or args.ray_address or args.autoscaling_config):
        raise SpecDecError("--suffix-cache is for one server process: with --replicas each replica keeps its "
                           "pools in memory")
    return EngineArgs.from_cli_args(args)      # the engine's own flags: checked where EngineArgs is built


def build_engine(args):
    """Load the models named by `specdec serve`'s arguments; returns (AsyncEngine, served model name). One server
    process runs one; each Ray Serve engine replica runs one. The loading runs on the engine's compute thread,
    the thread that later drives its steps (compute.py says why)."""
    from .compute import ComputeThread

    compute = ComputeThread()
    return compute.call(_build_engine, args, compute)


def _build_engine(args, compute):
    from ..llm import LLM
    from .async_engine import AsyncEngine
    from .metrics import ServerMetrics

    engine_args = getattr(args, "engine_args", None) or check_server_args(args)
    llm = LLM(engine_args)
    if llm.speculative.method == AUTO or llm.policy_candidates():
        # any request may ask for auto (or hybrid, which steps by auto's controller): the cost model is measured (or
        # read) now, on this thread, not on the engine thread in the middle of the first such request
        llm.policy()
    if llm.heads:
        llm.row_cost(1)          # token trees are sized by the measured cost model: measure it now, not mid-request
    name = args.served_model_name or llm.target.name
    engine = AsyncEngine(llm, engine_args.speculative, args.max_queued, ServerMetrics(name),
                         log_interval_s=args.log_interval, compute=compute)
    return engine, name


def server_state(engine, name: str | None, args):
    """The HTTP layer's state from `specdec serve`'s arguments (one process, or the Ray ingress)."""
    from .state import ServerState

    return ServerState(engine, name, api_keys=api_keys(args.api_key, getattr(args, "api_key_file", None)),
                       drain_timeout_s=args.drain_timeout, dashboard=not getattr(args, "no_dashboard", False),
                       vllm_metrics=getattr(args, "export_vllm_metrics", False),
                       traffic_fraction=args.spec_traffic_fraction, max_request_bytes=args.max_request_bytes,
                       max_spec_pools=args.max_spec_pools)
