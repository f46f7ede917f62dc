"""Summary arithmetic over benchmark runs: pure functions over lists of run dicts (unit-tested by hand).

A run is one (prompt, method, k, temperature, repeat); the baseline of a run is the `none` run with the
same prompt, temperature and repeat (hence the same seed). Speedups are medians of per-prompt ratios, so
one slow prompt does not move them.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict

from ..config import PLAIN

ALL = "all"


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def baseline_key(run: dict) -> tuple:
    return run["prompt_index"], run["temperature"], run["repeat"]


def config_key(run: dict) -> tuple:
    return run["method"], run["k"], run["temperature"]


def ok(run: dict) -> bool:
    return not run.get("error")


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (method, k, temperature, category), plus category 'all' per (method, k, temperature)."""
    base = {baseline_key(r): r for r in runs if r["method"] == PLAIN and ok(r)}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(*config_key(r), r["category"])].append(r)
        groups[(*config_key(r), ALL)].append(r)
    rows = []
    for (method, k, temperature, category), sel in groups.items():
        good = [r for r in sel if ok(r)]
        rows.append({"method": method, "k": k, "temperature": temperature, "category": category,
                     "n": len(sel), "errors": len(sel) - len(good), **_aggregate(good, base, temperature)})
    order = {m: i for i, m in enumerate(dict.fromkeys(r["method"] for r in runs))}
    cats = {c: i for i, c in enumerate(dict.fromkeys([r["category"] for r in runs] + [ALL]))}
    rows.sort(key=lambda r: (r["temperature"], cats[r["category"]], order[r["method"]], r["k"]))
    return rows


def _ratios(good: list[dict], base: dict, field: str, invert: bool = False) -> list[float]:
    out = []
    for r in good:
        b = base.get(baseline_key(r))
        if b and b.get(field) and r.get(field):
            out.append(b[field] / r[field] if invert else r[field] / b[field])
    return out


def _draft_step_cost(good: list[dict], base: dict) -> float | None:
    """Proposing time per target forward, as a fraction of one plain target forward (the same prompts' `none` runs:
    their verify time per forward)."""
    draft_s = sum(r.get("draft_time_s") or 0.0 for r in good)
    forwards = sum(r.get("target_forwards") or 0 for r in good)
    plain = [base.get(baseline_key(r)) for r in good]
    plain_s = sum(b.get("verify_time_s") or 0.0 for b in plain if b)
    plain_n = sum(b.get("target_forwards") or 0 for b in plain if b)
    if not forwards or not plain_n or not plain_s:
        return None
    return (draft_s / forwards) / (plain_s / plain_n)


def _aggregate(good: list[dict], base: dict, temperature: float) -> dict:
    if not good:
        return {"decode_tok_s": None, "speedup": None}
    col = lambda f: [r[f] for r in good if r.get(f) is not None]  # noqa: E731
    drafted = sum(r.get("draft_tokens") or 0 for r in good)
    accepted = sum(r.get("accepted_tokens") or 0 for r in good)
    steps = sum(r.get("draft_steps") or 0 for r in good)
    per_pos_d: list[int] = []
    per_pos_a: list[int] = []
    for r in good:
        positions = zip(r.get("drafted_per_position") or [], r.get("accepted_counts_per_position") or [])
        for i, (d, a) in enumerate(positions):
            if i >= len(per_pos_d):
                per_pos_d.append(0)
                per_pos_a.append(0)
            per_pos_d[i] += d
            per_pos_a[i] += a
    e2e_total = sum(col("e2e_s"))
    parities = [r["parity"] for r in good if r.get("parity") is not None]
    return {
        "completion_tokens": median(col("completion_tokens")),
        "decode_tok_s": median(col("decode_tok_s")),
        "ttft_s": median(col("ttft_s")),
        "tpot_s": median(col("tpot_s")),
        "tpot_p95_s": percentile(col("tpot_s"), 95),
        "tpot_p99_s": percentile(col("tpot_s"), 99),
        "e2e_s": median(col("e2e_s")),
        "e2e_p95_s": percentile(col("e2e_s"), 95),
        "e2e_p99_s": percentile(col("e2e_s"), 99),
        "speedup": median(_ratios(good, base, "decode_tok_s")),
        "e2e_speedup": median(_ratios(good, base, "e2e_s", invert=True)),
        "acceptance_rate": accepted / drafted if drafted else None,
        # decode tokens per decode-phase target forward: what any speedup has to come from
        "tokens_per_forward": (sum(max(0, (r.get("completion_tokens") or 0) - 1) for r in good)
                               / sum(r["target_forwards"] for r in good if r.get("target_forwards"))
                               if any(r.get("target_forwards") for r in good) else None),
        "mean_accepted_length": 1 + accepted / steps if steps else None,
        "accepted_per_position": [a / d for a, d in zip(per_pos_a, per_pos_d)],
        "draft_overhead": sum(col("draft_time_s")) / e2e_total if e2e_total else None,
        "draft_step_cost": _draft_step_cost(good, base),
        "draft_kv_mb": max(col("draft_kv_bytes"), default=0) / 2**20,
        "peak_rss_mb": max(col("peak_rss_mb"), default=None),
        # token-for-token parity is the promise for greedy decoding only; sampled runs are equal in distribution
        "parity_rate": (sum(parities) / len(parities)) if parities and temperature == 0 else None,
    }
