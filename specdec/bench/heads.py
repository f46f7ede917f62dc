"""`python -m specdec.bench.heads`: what a learned head's drafting costs, per head quantization, in one process.

Loads the target and its shipped heads once per `--head-quantization` scheme, then times each head's proposer as
the engine drives it (the cost model's measurement: the target's states of the newest row handed over, then one
proposal after `--context` rows, each right after a target forward as in the engine, which evicts the head's
weights from the caches): the first draft token and each further one, in ms and as a fraction of a
one-row target forward. The schemes are timed in interleaved rounds, best of each, so a burst of load from
elsewhere spoils one sample of every scheme rather than all samples of one.

    python -m specdec.bench.heads --quantization int4 --head-quantization none,int8
"""
from __future__ import annotations

import argparse

import torch

from ..config import PLAIN, QUANTIZATIONS, SpeculativeConfig
from ..proposers.registry import METHOD_TABLE, head_methods


def measure(llm, heads: dict[str, str | None], schemes: list[str], context: int = 256, rounds: int = 3,
            repeats: int = 5) -> dict:
    """heads: {method: head directory, or None for the target's shipped head} -> {"heads": {(method, scheme):
    (first_s, further_s)}, "target_s": a one-row target forward, "packed": {(method, scheme): the scheme run}},
    times in seconds."""
    from ..loading import load_head_for
    from ..policy.measure import forward_times, head_times, one_target_step
    from ..proposers import BuildContext, build_proposer

    model, eng = llm.target.model, llm.engine
    w = model.embed_tokens.weight
    proposers, packed = {}, {}
    for m, path in heads.items():
        for q in schemes:
            head = load_head_for(m, path, llm.target, q)
            packed[(m, q)] = head.quantization          # the scheme its linears really run
            proposers[(m, q)] = build_proposer(m, BuildContext(model, eng.vocab_size, eng.sched_cfg.max_total_tokens,
                                                               eng.sched_cfg.max_num_batched_tokens,
                                                               heads={m: head.module}))
    best: dict = {}
    with torch.inference_mode():
        target_s = forward_times(model, [1], context, repeats)[1]
        target_step = one_target_step(model, context)
        for _ in range(rounds):
            for key, p in proposers.items():
                first, further = head_times(p, model.config.hidden_size, w.shape[0], w.dtype, w.device, context, 4,
                                            repeats, target_step)
                old = best.get(key, (float("inf"), float("inf")))
                best[key] = (min(old[0], first), min(old[1], further))
    return {"target_s": target_s, "heads": best, "packed": packed}


def main(argv: list[str] | None = None) -> None:
    from ..llm import LLM

    ap = argparse.ArgumentParser(prog="python -m specdec.bench.heads", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quantization", default="none", choices=list(QUANTIZATIONS), help="the target's linears")
    ap.add_argument("--methods", default=",".join(m for m in head_methods() if METHOD_TABLE[m].trainable),
                    help=f"comma list of {', '.join(head_methods())}")
    ap.add_argument("--head-quantization", default="none,int8", help="comma list of none, int8, int4")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    methods, schemes = args.methods.split(","), args.head_quantization.split(",")
    bad = [m for m in methods if m not in head_methods()] + [q for q in schemes if q not in QUANTIZATIONS]
    if bad:
        raise SystemExit(f"python -m specdec.bench.heads: unknown method or scheme {bad}")
    llm = LLM(quantization=args.quantization, progress=False, speculative=SpeculativeConfig(method=PLAIN))
    r = measure(llm, dict.fromkeys(methods), schemes, args.context, args.rounds, args.repeats)
    t1 = r["target_s"]
    print(f"target forward (1 row, {args.context} keys): {t1 * 1e3:.1f} ms; best of {args.rounds} rounds")
    print("| head | linears | first draft token ms | / forward | each further ms | / forward |")
    print("|---|---|---|---|---|---|")
    for (m, q), (a, b) in r["heads"].items():
        print(f"| {m} | {q} | {a * 1e3:.2f} | {a / t1:.3f} | {b * 1e3:.2f} | {b / t1:.3f} |")


if __name__ == "__main__":
    main()
