"""A peers run's results.json (vllm.sh): per engine and mode, median decode tok/s by category and each round's,
TTFT P50/P90, the long prompts' end-to-end latency, and greedy text agreement (with each engine's own plain mode and
with specdec).

    .venv/bin/python docs/benchmarks/peers/compare.py docs/benchmarks/peers/vllm-amd-zen4/results.json
"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
by = {}
for r in d['requests']:
    by.setdefault(r['endpoint'], {})[(r['prompt_index'], r['round'])] = r
eps = list(by)
cats = sorted({r['category'] for r in d['requests']})


def med(ep, key='decode_tok_s', keep=lambda r: True):
    xs = [r[key] for r in by[ep].values() if r.get(key) is not None and keep(r)]
    return statistics.median(xs) if xs else float('nan')


def pct(ep, key, q):
    xs = sorted(r[key] for r in by[ep].values() if r.get(key) is not None)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float('nan')


print(f'median decode tok/s by category (and over {eps[0]})')
print(f"{'category':16s}" + ''.join(f'{e:>22s}' for e in eps))
for cat in cats + [None]:
    ref = med(eps[0], keep=lambda r: cat is None or r['category'] == cat)
    cells = []
    for e in eps:
        v = med(e, keep=lambda r: cat is None or r['category'] == cat)
        cells.append(f'{v:14.2f} {v / ref:5.2f}x')
    print(f"{cat or 'all':16s}" + ''.join(f'{c:>22s}' for c in cells))
rounds = sorted({r['round'] for r in d['requests']})
for e in eps:
    per = [med(e, keep=lambda r, k=k: r['round'] == k) for k in rounds]
    long_e2e = med(e, 'e2e_s', lambda r: r['prompt_tokens'] > 1000)
    print(f"{e}: rounds {', '.join(f'{x:.2f}' for x in per)} tok/s; TTFT P50 {pct(e, 'ttft_s', 0.5):.2f} s, "
          f"P90 {pct(e, 'ttft_s', 0.9):.2f} s; e2e of prompts over 1k tokens (median) {long_e2e:.1f} s")
for a, b in [(x, y) for i, x in enumerate(eps) for y in eps[i + 1:]]:
    same = sum(by[a][k]['text'] == by[b].get(k, {}).get('text') for k in by[a])
    print(f"identical text {a} / {b}: {same}/{len(by[a])}")
