"""Teacher-forced replay of prompt-lookup strategies over the target's greedy answers (served r11's texts).

    .venv/bin/python docs/benchmarks/lookup-choice/replay.py [K]

Each strategy guesses up to K tokens at every step from the prompt and the answer so far; the guess's leading tokens
that equal the answer are accepted and one more token is committed (a greedy chain's verification). Prints, per
category and strategy, tokens committed per step, guessed rows per step and steps.
"""
import collections
import json
import sys

import numpy as np

from specdec import LLM
from specdec.bench.datasets import load_prompts

K = int(sys.argv[1]) if len(sys.argv) > 1 else 4
llm = LLM(speculative="none", progress=False)
tok = llm.tokenizer
prompts = load_prompts("builtin,long:8")
d = json.load(open("docs/benchmarks/auto-vs-fixed/served-intel-amx-r11/results.json"))
texts = {r["prompt_index"]: (r["category"], r["text"]) for r in d["requests"] if r["endpoint"] == "specdec-off"}
cases = []
for i, p in enumerate(prompts):
    cat, text = texts[i]
    assert cat == p.get("category"), (cat, p.get("category"))
    cases.append((cat, tok.encode_chat(p["messages"]), tok.encode(text)))


def occurrences(ids, n):
    """starts s (s + n < len) whose n-gram equals the tail, excluding the tail itself."""
    L = len(ids)
    tail = ids[L - n:]
    w = np.lib.stride_tricks.sliding_window_view(ids[: L - 1], n)
    hits = np.flatnonzero((w == tail).all(axis=1))
    hits = hits[hits + n < L]
    return hits[hits != L - n]


def recent(ids, k, max_n=4, min_n=1):
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        h = occurrences(ids, n)
        if h.size:
            s = int(h[-1]) + n
            return n, ids[s:s + k].tolist()
    return 0, []


def vote(ids, k, max_n=4, min_n=1, upto=1):
    """longest n; where its match length <= upto, the continuation most occurrences share (ties: most recent)."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        h = occurrences(ids, n)
        if h.size:
            if n > upto or h.size == 1:
                s = int(h[-1]) + n
                return n, ids[s:s + k].tolist()
            # grow the guess token by token along the majority branch
            alive = [int(x) + n for x in h]
            out = []
            while len(out) < k and alive:
                c = collections.Counter(int(ids[s]) for s in alive if s < len(ids))
                if not c:
                    break
                best = max(c.values())
                # ties: the most recent occurrence's token
                tok_ = next(int(ids[s]) for s in reversed(alive) if s < len(ids) and c[int(ids[s])] == best)
                out.append(tok_)
                alive = [s + 1 for s in alive if s < len(ids) and int(ids[s]) == tok_ and s + 1 < len(ids)]
            return n, out
    return 0, []


def longer_first(ids, k, max_n=8, min_n=1):
    return recent(ids, k, max_n, min_n)


def prompt_only(ids, k, plen, max_n=4, min_n=1):
    """occurrences in the prompt preferred over the answer's own (most recent within the prompt)."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        h = occurrences(ids, n)
        if h.size:
            hp = h[h + n < plen]
            s = int((hp if hp.size else h)[-1]) + n
            return n, ids[s:s + k].tolist()
    return 0, []


STRATS = {
    "recent": lambda ids, plen: recent(ids, K),
    "vote1": lambda ids, plen: vote(ids, K, upto=1),
    "vote2": lambda ids, plen: vote(ids, K, upto=2),
    "vote4": lambda ids, plen: vote(ids, K, upto=4),
    "max8": lambda ids, plen: longer_first(ids, K),
    "min2": lambda ids, plen: recent(ids, K, 4, 2),
    "prompt": lambda ids, plen: prompt_only(ids, K, plen),
}

# category -> strategy -> [steps, tokens, guessed rows]
res = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0, 0]))
for cat, pids, ans in cases:
    for name, f in STRATS.items():
        t, steps, rows = 0, 0, 0
        while t < len(ans):
            ctx = np.asarray(pids + ans[:t], dtype=np.int64)
            n, g = f(ctx, len(pids))
            a = 0
            while a < len(g) and t + a < len(ans) and g[a] == ans[t + a]:
                a += 1
            rows += len(g)
            t += a + 1
            steps += 1
        for r in (res[cat][name], res["all"][name]):
            r[0] += steps
            r[1] += len(ans)
            r[2] += rows
for cat, by in res.items():
    print(cat, " | ".join(f"{n}: {v[1]/v[0]:.3f} tok/step, {v[2]/v[0]:.2f} rows, {v[0]} steps" for n, v in by.items()))
