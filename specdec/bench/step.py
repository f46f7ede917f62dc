"""`python -m specdec.bench.step`: what one engine step costs, and what it is made of.

Loads the target, starts `--seqs` plain greedy requests on built-in prompts, runs their prefills, then times
`--steps` decode steps (each sequence one row per step) and reports the median step and, per step, the time
spent in each kind of module: the layer linears, the output head, attention, the fused elementwise steps, and
the rest (Python, scheduling, sampling). The pieces are timed by wrapping the modules, which adds a few
microseconds per call.

    python -m specdec.bench.step --quantization int4 --seqs 1
    python -m specdec.bench.step --quantization none --seqs 1,8
    python -m specdec.bench.step --quantization int4 --ops-impl scalar,auto   # attention and SiLU: scalar vs vector
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

from torch import nn

from ..config import PLAIN, SpeculativeConfig
from ..sampling_params import SamplingParams
from .datasets import load_prompts

ELEMENTWISE = ("rms_norm", "rope_qkv", "silu_mul")


def _timer(fn, key: str, acc: dict):
    """fn, adding the time of every call to acc[key]."""
    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        acc[key] += time.perf_counter() - t
        return out
    return timed


@contextmanager
def _timed(model: nn.Module, acc: dict, ops_impl: str = "auto"):
    """Wrap the model's linears (the head apart) and the compiled layer steps so that each adds its time to acc;
    attention and SiLU run on the compiled path `ops_impl` (cpu_ops.OPS_IMPLS)."""
    from ..models import cpu_ops

    head = model.lm_head
    undo = []
    for mod in model.modules():
        if mod is model or not hasattr(mod, "out_features") or list(mod.children()):
            continue
        mod.forward = _timer(mod.forward, "output head" if mod is head else "layer linears", acc)
        undo.append(lambda m=mod: m.__dict__.pop("forward", None))
    for fn in (*ELEMENTWISE, "ragged_attention"):
        orig = getattr(cpu_ops, fn)
        call = orig if fn not in ("ragged_attention", "silu_mul") else functools.partial(orig, impl=ops_impl)
        setattr(cpu_ops, fn, _timer(call, "attention" if fn == "ragged_attention" else "norms, rotary, SiLU", acc))
        undo.append(lambda fn=fn, orig=orig: setattr(cpu_ops, fn, orig))
    try:
        yield
    finally:
        for u in undo:
            u()


def measure(llm, seqs: int, steps: int, ops_impl: str = "auto") -> dict:
    """Median ms of a plain decode step with `seqs` sequences, and the mean ms per step of each part."""
    eng = llm.engine
    params = SamplingParams(max_tokens=steps + 64, temperature=0.0)
    room = eng.max_model_len - params.max_tokens - 8             # a small model's window: cut long prompts
    prompts = [llm.encode(p["messages"])[:room] for p in load_prompts("builtin")]
    ids = [f"bench-step-{seqs}-{i}" for i in range(seqs)]
    for i, rid in enumerate(ids):
        eng.add_request(rid, prompts[i % len(prompts)], params, SpeculativeConfig(method=PLAIN))
    try:
        while eng.num_waiting or any(s.prefilling for s in eng.scheduler.running):
            eng.step()
        for _ in range(3):
            eng.step()
        times, acc = [], defaultdict(float)
        with _timed(llm.target.model, acc, ops_impl):
            for _ in range(steps):
                t = time.perf_counter()
                eng.step()
                times.append(time.perf_counter() - t)
        total = sum(times)
        parts = {k: v / steps * 1e3 for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}
        parts["rest"] = (total - sum(acc.values())) / steps * 1e3
        return {"seqs": seqs, "ops_impl": ops_impl, "step_ms": statistics.median(times) * 1e3,
                "min_ms": min(times) * 1e3, "parts_ms": parts}
    finally:
        for rid in ids:
            eng.abort(rid)


def main(argv: list[str] | None = None) -> None:
    from ..llm import LLM

    ap = argparse.ArgumentParser(prog="python -m specdec.bench.step", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quantization", default="none", choices=["none", "int8", "int4"])
    ap.add_argument("--seqs", default="1", help="comma list: sequences decoding together (one row each per step)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ops-impl", default="auto",
                    help="comma list of the compiled attention/SiLU paths to time: auto, scalar, avx512, avx2")
    args = ap.parse_args(argv)
    from ..models import cpu_ops

    impls = args.ops_impl.split(",")
    unknown = [i for i in impls if i not in cpu_ops.OPS_IMPLS]
    if unknown:
        raise SystemExit(f"--ops-impl: unknown {unknown}; choose from {', '.join(cpu_ops.OPS_IMPLS)}")
    llm = LLM(quantization=args.quantization, progress=False, speculative=SpeculativeConfig(method=PLAIN))
    for n, impl in ((int(v), i) for v in args.seqs.split(",") for i in impls):
        r = measure(llm, n, args.steps, impl)
        print(f"{n} sequence(s), ops {impl}: step median {r['step_ms']:.1f} ms (min {r['min_ms']:.1f}); per step: "
              + ", ".join(f"{k} {v:.1f} ms" for k, v in r["parts_ms"].items()), flush=True)


if __name__ == "__main__":
    main()
