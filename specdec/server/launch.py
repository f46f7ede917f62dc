"""What both ways of serving share (`specdec serve` in one process, serve.py; with Ray Serve replicas,
ray_serve.py): the arguments checked and mapped onto SpeculativeConfig and SchedulerConfig, the engine
built from them, the HTTP layer's state, and the ready-to-paste examples printed at startup."""
from __future__ import annotations

import sys

from ..config import SpeculativeConfig
from ..engine import SchedulerConfig
from ..engine.scheduler import ITL_TARGET_S
from ..errors import SpecDecError
from ..utils import parse_json_object

SPEC_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "quantization",
             "eagle_topk", "num_steps"}


def parse_speculative_config(text: str | None) -> SpeculativeConfig:
    """vLLM's `--speculative-config` JSON keys -> SpeculativeConfig."""
    if not text:
        return SpeculativeConfig(method="auto")
    obj = parse_json_object(text, "--speculative-config")
    unknown = set(obj) - SPEC_KEYS
    if unknown:
        raise SpecDecError(f"--speculative-config: unknown key '{sorted(unknown)[0]}' "
                           f"(known: {', '.join(sorted(SPEC_KEYS))})")
    try:
        return SpeculativeConfig(**obj)
    except (TypeError, ValueError) as exc:
        raise SpecDecError(f"--speculative-config: {exc}") from None


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


def check_server_args(args) -> None:
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
    parse_speculative_config(args.speculative_config)
    parse_heads(getattr(args, "spec_heads", None))
    scheduler_config(args)


def parse_heads(text: str | None) -> dict[str, str | None]:
    """--spec-heads 'eagle3,medusa=DIR' -> {method: directory or None (the shipped head)}."""
    from ..config import HEAD_METHODS

    out: dict[str, str | None] = {}
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        method, _, path = part.partition("=")
        if method not in HEAD_METHODS:
            raise SpecDecError(f"--spec-heads: '{method}' is not a learned head method ({', '.join(HEAD_METHODS)})")
        out[method] = path or None
    return out


def scheduler_config(args) -> SchedulerConfig:
    try:
        itl = getattr(args, "itl_target_ms", ITL_TARGET_S * 1000)
        return SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                               itl_target_s=itl / 1000 if itl else None,
                               **({"max_total_tokens": args.max_total_tokens} if args.max_total_tokens else {}))
    except ValueError as exc:
        raise SpecDecError(str(exc)) from None


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

    spec = parse_speculative_config(args.speculative_config)
    if args.draft and spec.method in ("draft", "auto") and spec.model is None:
        spec.model = args.draft
    llm = LLM(target=args.target, draft=spec.model if spec.method in ("draft", "auto") else None, speculative=spec,
              dtype=args.dtype, device=args.device, max_model_len=args.max_model_len, num_threads=args.threads,
              scheduler=scheduler_config(args), quantization=args.quantization,
              heads=parse_heads(getattr(args, "spec_heads", None)),
              head_quantization=getattr(args, "head_quantization", None))
    if spec.method == "auto":
        from ..policy import PolicyConfig

        llm.policy(PolicyConfig(k_max=spec.num_speculative_tokens, max_load=args.spec_max_load,
                                min_acceptance=args.spec_min_acceptance))
    if llm.heads:
        llm.row_cost(1)          # token trees are sized by the measured cost model: measure it now, not mid-request
    name = args.served_model_name or llm.target.name
    engine = AsyncEngine(llm, spec, args.max_queued, ServerMetrics(name), log_interval_s=args.log_interval,
                         compute=compute)
    return engine, name


def server_state(engine, name: str | None, args):
    """The HTTP layer's state from `specdec serve`'s arguments (one process, or the Ray ingress)."""
    from .app import ServerState

    return ServerState(engine, name, api_key=args.api_key, drain_timeout_s=args.drain_timeout,
                       traffic_fraction=args.spec_traffic_fraction, max_request_bytes=args.max_request_bytes,
                       max_spec_pools=args.max_spec_pools)
