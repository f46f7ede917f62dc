"""`specdec bench decode`: decode speed of each method on the built-in prompts, in one process.

Every (method, k) runs on the same prompts after a warm-up; the table reports medians per category
and the speedup against `none` (median of per-prompt ratios), plus parity with `none`.
"""
from __future__ import annotations

import statistics
import time

from ..config import SpeculativeConfig
from ..llm import LLM
from ..sampling_params import SamplingParams
from ..utils import write_json_atomic
from .prompts import BUILTIN_PROMPTS


def divergence_margin(llm: LLM, prompt_ids: list[int], base_ids: list[int], other_ids: list[int]) -> float | None:
    """Target's top-2 logit margin at the first token where two outputs differ (None if identical).

    A margin at the level of bf16 rounding says the divergence is a near-tie, not a bug.
    """
    import torch

    i = next((j for j, (a, b) in enumerate(zip(base_ids, other_ids)) if a != b), None)
    if i is None:
        return None
    ids = prompt_ids + base_ids[:i]
    model = llm.target.model
    hidden = model(torch.tensor([ids]), torch.arange(len(ids))[None], model.new_kv_cache(len(ids)))
    top2 = model.compute_logits(hidden[0, -1]).topk(2).values
    return float(top2[0] - top2[1])


def run_decode_bench(target: str, draft: str | None, methods: list[str], ks: list[int], categories: list[str] | None,
                     max_tokens: int, dtype: str, out: str | None, draft_quantization: str | None = None,
                     prompt_lookup: tuple[int, int] = (4, 1)) -> dict:
    need_draft = "draft" in methods
    t0 = time.perf_counter()
    llm = LLM(target=target, draft=draft, dtype=dtype,
              speculative=SpeculativeConfig(method="draft" if need_draft else "none", quantization=draft_quantization),
              progress=True)
    load_s = time.perf_counter() - t0
    prompts = [p for p in BUILTIN_PROMPTS if not categories or p["category"] in categories]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    llm.generate(prompts[0]["messages"], SamplingParams(max_tokens=8, temperature=0.0))  # warm-up
    configs = [("none", 0)] + [(m, k) for m in methods if m != "none" for k in ks]
    engines = {(m, k): llm.make_engine(SpeculativeConfig(method=m, num_speculative_tokens=k or None,
                                                         prompt_lookup_max=prompt_lookup[0],
                                                         prompt_lookup_min=prompt_lookup[1]))
               for m, k in configs}
    runs = []
    for i, prompt in enumerate(prompts):
        for (m, k), engine in engines.items():
            o = llm.generate(prompt["messages"], params, engine=engine)[0]
            runs.append({"prompt_index": i, "category": prompt["category"], "method": m, "k": k,
                         "prompt_ids": o.prompt_token_ids, "token_ids": o.token_ids, **o.stats.to_dict()})
    base = {r["prompt_index"]: r for r in runs if r["method"] == "none"}
    for r in runs:
        b = base[r["prompt_index"]]
        r["parity"] = r["token_ids"] == b["token_ids"]
        if not r["parity"]:
            r["divergence_margin"] = divergence_margin(llm, r["prompt_ids"], b["token_ids"], r["token_ids"])
    rows = []
    for (m, k) in configs:
        for cat in dict.fromkeys(p["category"] for p in prompts):
            sel = [r for r in runs if r["method"] == m and r["k"] == k and r["category"] == cat]
            ratios = [r["decode_tok_s"] / base[r["prompt_index"]]["decode_tok_s"] for r in sel]
            acc = [r["acceptance_rate"] for r in sel if r["acceptance_rate"] is not None]
            rows.append({"method": m, "k": k, "category": cat,
                         "decode_tok_s": statistics.median(r["decode_tok_s"] for r in sel),
                         "speedup": statistics.median(ratios),
                         "acceptance": statistics.median(acc) if acc else None,
                         "mean_accepted_length": statistics.median(
                             [r["mean_accepted_length"] for r in sel if r["mean_accepted_length"]] or [0]) or None,
                         "parity": sum(r["parity"] for r in sel) / len(sel),
                         "divergence_margins": [round(r["divergence_margin"], 4) for r in sel if not r["parity"]]})
    result = {"target": llm.target.name, "draft": llm.draft.name if llm.draft else None, "dtype": dtype,
              "draft_quantization": draft_quantization, "prompt_lookup_max_min": list(prompt_lookup),
              "max_tokens": max_tokens, "load_s": load_s,
              # bytes a target forward streams: every weight but the embedding table (only rows are gathered)
              "target_read_gb_per_forward": (llm.target.weight_bytes - llm.target.model.embed_tokens.weight.nbytes) / 1e9,
              "rows": rows, "runs": runs}
    if out:
        write_json_atomic(out, result)
    return result


def _baseline_gbs(result: dict) -> float:
    speeds = [r["decode_tok_s"] for r in result["rows"] if r["method"] == "none"]
    return result["target_read_gb_per_forward"] * statistics.median(speeds) if speeds else 0.0


def format_table(result: dict) -> str:
    lines = [f"target {result['target']}  draft {result['draft']}  dtype {result['dtype']}  "
             f"max_tokens {result['max_tokens']}  load {result['load_s']:.1f}s  "
             f"target reads {result['target_read_gb_per_forward']:.2f} GB/forward "
             f"(plain decode at {_baseline_gbs(result):.1f} GB/s)",
             f"{'method':8s} {'k':>2s} {'category':12s} {'tok/s':>7s} {'speedup':>8s} {'accept':>7s} {'mal':>5s} {'parity':>6s}"]
    for r in result["rows"]:
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
        mal = f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else "-"
        margins = f" margins {r['divergence_margins']}" if r["divergence_margins"] else ""
        lines.append(f"{r['method']:8s} {r['k']:2d} {r['category']:12s} {r['decode_tok_s']:7.2f} "
                     f"{r['speedup']:7.2f}x {acc:>7s} {mal:>5s} {r['parity']:6.2f}{margins}")
    return "\n".join(lines)
