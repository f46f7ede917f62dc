"""Replay of draft-chain stopping rules over collect.py's record (greedy chains; the cost model's c and V).

    python docs/benchmarks/draft-confidence/simulate.py RECORD.json [C] [V1,V2,...]

A step at answer position t drafts positions t, t+1, ... until its rule stops it; the leading tokens equal to the
answer are accepted and one more is committed. Its cost: n draft steps of C target steps each and V(n + 1). The
draft's confidence at a position after its first wrong token is not in the record (the draft went on from its own
token): `tf` reads the teacher-forced one there, `pess` has a confidently wrong token drafted on to the cap.
Prints per category the calibration (the share of matches by q_max bucket) and each rule's tokens per step and
speed over plain decoding.
"""
import collections
import json
import sys

rec = json.load(open(sys.argv[1]))["cases"]
C = float(sys.argv[2]) if len(sys.argv) > 2 else 0.25
V = [float(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else \
    [1.0, 1.033, 1.113, 1.15, 1.264, 1.423, 1.497, 1.549, 1.712]


def v(rows):
    return V[rows - 1] if rows <= len(V) else V[-1] + (rows - len(V)) * (V[-1] - V[-2])


def run(case, rule, mode="tf"):
    q, m = case["q_max"], case["match"]
    L = len(m)
    t = tokens = steps = 0
    cost = 0.0
    while t < L:
        n = acc = 0
        alive = True
        p = 1.0
        while t + n < L:
            i = n
            n += 1
            if alive and m[t + i]:
                acc += 1
            elif alive:
                alive = False
                if mode == "pess" and rule(i, q[t + i], p) and rule.cap > n:
                    n = min(rule.cap, L - t)
                    break
            p *= q[t + i]
            if not rule(i, q[t + i], p) or n >= rule.cap:
                if getattr(rule, "exclude", False) and not rule(i, q[t + i], p):
                    n -= 1                    # the unsure token is dropped: its verification row is not paid
                    acc = min(acc, n)
                break
        commit = min(acc + 1, L - t)
        t += commit
        tokens += commit
        steps += 1
        cost += n * C + v(n + 1)
    return tokens, steps, cost


class Fixed:
    def __init__(self, k):
        self.cap, self.name = k, f"fixed k={k}"

    def __call__(self, i, q, p):
        return True


class Conf:
    """stop after a token the draft gave less than tau (HF's assistant_confidence_threshold)."""
    def __init__(self, tau, cap):
        self.tau, self.cap, self.name = tau, cap, f"q_max>={tau} cap {cap}"

    def __call__(self, i, q, p):
        return q >= self.tau


class Cum:
    """stop once the product of the chain's confidences falls below tau."""
    def __init__(self, tau, cap):
        self.tau, self.cap, self.name = tau, cap, f"prod q>={tau} cap {cap}"

    def __call__(self, i, q, p):
        return p >= self.tau


class ConfOut(Conf):
    """llama.cpp's draft-p-min: the unsure token itself is left out of the draft."""
    exclude = True

    def __init__(self, tau, cap):
        super().__init__(tau, cap)
        self.name = f"q_max>={tau} cap {cap} excl"


SHOW = ("q_max>=0.75 cap 8", "q_max>=0.75 cap 16", "q_max>=0.75 cap 8 excl", "q_max>=0.75 cap 16 excl",
        "q_max>=0.9 cap 16 excl", "q_max>=0.75 cap 4")
cats = collections.defaultdict(list)
for c in rec:
    cats[c["category"]].append(c)
    cats["all"].append(c)
rules = [Fixed(k) for k in (1, 2, 3, 4, 5, 6, 8)]
rules += [Conf(t, cap) for cap in (4, 6, 8, 16) for t in (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9)]
rules += [ConfOut(t, cap) for cap in (8, 16) for t in (0.5, 0.6, 0.75, 0.9)]
rules += [Cum(t, cap) for cap in (6, 8) for t in (0.2, 0.3, 0.4, 0.5, 0.6)]
print(f"C={C} V={V}")
for cat, cs in cats.items():
    qs = [(q, mm) for c in cs for q, mm in zip(c["q_max"], c["match"])]
    edges = [0, .2, .4, .6, .8, .9, .95, 1.01]
    cal = []
    for lo, hi in zip(edges, edges[1:]):
        b = [mm for q, mm in qs if lo <= q < hi]
        cal.append(f"[{lo:.2f},{hi:.2f}) {len(b) / len(qs):.2f} of tokens, match {sum(b) / max(1, len(b)):.2f}")
    print(f"\n## {cat}: {len(cs)} answers, {len(qs)} tokens, match {sum(mm for _, mm in qs) / len(qs):.3f}")
    print("   " + "\n   ".join(cal))
    res = []
    for r in rules:
        for mode in (("tf",) if isinstance(r, Fixed) else ("tf", "pess")):
            tok = st = 0
            cost = 0.0
            for c in cs:
                a, b, d = run(c, r, mode)
                tok, st, cost = tok + a, st + b, cost + d
            res.append((tok / cost, r.name, mode, tok / st))
    best_fixed = max(x for x in res if x[1].startswith("fixed"))
    shown = sorted(res, reverse=True)[:6] + [x for x in res if x[2] == "tf" and x[1] in SHOW] + [best_fixed]
    for s, name, mode, tps in shown:
        print(f"   {name:24s} {mode:4s} speed {s:.3f}x  tokens/step {tps:.2f}  /best fixed {s / best_fixed[0]:.3f}")
