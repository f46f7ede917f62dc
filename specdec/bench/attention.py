"""`python -m specdec.bench.attention`: ms of the attention of a 28-layer forward, per context length and row count.

The shapes are Qwen2.5-1.5B's (12 query heads, 2 KV heads of 128, bf16 caches, one cache tensor for 28 layers, so
a forward reads each layer's keys from memory as the engine does). Rows are one sequence's verification rows
(decode rows: a chain of `rows` tokens after `context` cached ones), attended by specdec._C's ragged_attention;
the time is the whole call (writing the new K/V into the cache included), the minimum over `--reps` rounds, each
round timing every (context, rows) pair once, interleaved. A(rows, context) / A(1, context) is what verifying
`rows` tokens costs in attention against a one-token step.

With `--model` (a model argument, e.g. qwen2.5-coder-1.5b-instruct): whole forwards of that model instead, as the
engine verifies (policy.measure.forward_times: `rows` decode rows after `context` cached tokens), and
V(rows, context) = t(rows, context) / t(1, context), the cost the policy weighs a draft of rows - 1 tokens by.
"""
from __future__ import annotations

import argparse
import time

import torch

LAYERS, HQ, HKV, D = 28, 12, 2, 128


def _ops():
    from ..models.cpu_ops import _ops as ops

    ext = ops()
    if ext is None:
        raise SystemExit("specdec.bench.attention: specdec._C is not built")
    return ext


def attention_ms(contexts: list[int], rows: list[int], reps: int, impl: str = "auto",
                 dtype: torch.dtype = torch.bfloat16, layers: int = LAYERS) -> dict[tuple[int, int], float]:
    """{(context, rows): ms} for `layers` calls of ragged_attention over one cache per (context, rows)."""
    from ..models.cpu_ops import OPS_IMPLS

    ext = _ops()
    torch.manual_seed(0)
    cap = max(contexts) + max(rows) + 64
    kc = torch.randn(layers, HKV, cap, D).to(dtype)
    vc = torch.randn(layers, HKV, cap, D).to(dtype)
    inputs = {r: (torch.randn(r, HQ, D).to(dtype), torch.randn(r, HKV, D).to(dtype), torch.randn(r, HKV, D).to(dtype))
              for r in rows}
    best = {(c, r): float("inf") for c in contexts for r in rows}
    for rep in range(reps + 1):
        for c in contexts:
            for r in rows:
                q, k, v = inputs[r]
                t0 = time.perf_counter()
                for layer in range(layers):
                    ext.ragged_attention(q, k, v, [kc], [vc], layer, [c], [r], [0], [0], [r], [c + r], [None],
                                         [True], [None], impl=OPS_IMPLS[impl])
                if rep:                                   # round 0 warms up
                    best[c, r] = min(best[c, r], (time.perf_counter() - t0) * 1e3)
    return best


def forward_ms(model_arg: str, contexts: list[int], rows: list[int], reps: int,
               quantization: str | None = None) -> dict[tuple[int, int], float]:
    """{(context, rows): ms} of whole forwards of the model (min over reps, every rows count timed in each round)."""
    from ..models.loader import default_quantization, load_model
    from ..policy.measure import forward_times_by_context

    lm = load_model(model_arg, progress=False, quantization=quantization or default_quantization(model_arg))
    by = forward_times_by_context(lm.model, rows, sorted(contexts), reps)
    return {(c, r): t * 1e3 for c, times in by.items() for r, t in times.items()}


def _table(ms: dict, contexts: list[int], rows: list[int], name: str) -> None:
    print("| context | " + " | ".join(f"{r} rows" for r in rows) + " | " +
          " | ".join(f"{name}({r})/{name}(1)" for r in rows if r > 1) + " |")
    print("|---|" + "---|" * (2 * len(rows) - (1 in rows)))
    for c in contexts:
        cells = [f"{ms[c, r]:.2f}" for r in rows]
        ratios = [f"{ms[c, r] / ms[c, rows[0]]:.2f}" for r in rows if r > 1]
        print(f"| {c} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specdec.bench.attention", description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", default="64,1024,2048,4096", help="comma list of cached tokens before the rows")
    ap.add_argument("--rows", default="1,2,4,8,16", help="comma list of rows (verification rows of one sequence)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--impl", default="auto", choices=["auto", "scalar", "avx512", "avx2", "avx512bf16", "amx"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--model", default=None, help="time whole forwards of this model (its cache, its dtype)")
    ap.add_argument("--quantization", default=None, help="with --model: none | int8 | int4 (default: the model's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    contexts = [int(x) for x in args.contexts.split(",")]
    rows = [int(x) for x in args.rows.split(",")]
    if args.model:
        ms = forward_ms(args.model, contexts, rows, args.reps, args.quantization)
        contexts = sorted({c for c, _ in ms})                # cut to the model's window where it ends sooner
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per forward of {args.model} "
              f"({args.quantization or 'quantization as serve picks it'}), decode rows after `context` cached tokens, "
              f"best of {args.reps}")
        _table(ms, contexts, rows, "V")
        return
    ms = attention_ms(contexts, rows, args.reps, args.impl, getattr(torch, args.dtype))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, impl {args.impl}; ms of "
          f"{LAYERS} layers' attention ({HQ} heads, {HKV} KV heads of {D}), best of {args.reps}")
    _table(ms, contexts, rows, "A")


if __name__ == "__main__":
    main()
