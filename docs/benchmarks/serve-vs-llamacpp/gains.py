"""From a c1 results.json of run.sh: specdec's own speculation gain (specdec / specdec-off median decode tok/s) by
category and by round, against llama-server plain and its best speculation in each category, the time to first
token of prompts over 1k tokens (specdec / specdec-off, per request), and greedy parity with speculation off.

    .venv/bin/python docs/benchmarks/serve-vs-llamacpp/gains.py docs/benchmarks/serve-vs-llamacpp/amd-zen4/c1/results.json
"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
by = {}
for r in d['requests']:
    by.setdefault(r['endpoint'], {})[r['prompt_index']] = r
eps = list(by)
spec, off = by['specdec'], by['specdec-off']
long = [i for i, r in off.items() if r['prompt_tokens'] > 1000]
print('long prompts', len(long), 'TTFT specdec/off per request:',
      [round(spec[i]['ttft_s'] / off[i]['ttft_s'], 3) for i in sorted(long)])
print('  median', round(statistics.median(spec[i]['ttft_s'] / off[i]['ttft_s'] for i in long), 3),
      'max', round(max(spec[i]['ttft_s'] / off[i]['ttft_s'] for i in long), 3),
      'sum ratio', round(sum(spec[i]['ttft_s'] for i in long) / sum(off[i]['ttft_s'] for i in long), 3))
print('identical specdec vs specdec-off text:', sum(spec[i]['text'] == off[i]['text'] for i in off), '/', len(off))
cats = sorted({r['category'] for r in off.values()})
def med(ep, cat=None):
    return statistics.median(r['decode_tok_s'] for r in by[ep].values() if cat is None or r['category'] == cat)
llama_spec = [e for e in eps if e.startswith('llama-server-')]
for cat in cats + [None]:
    best = max(llama_spec, key=lambda e: med(e, cat))
    print(f"{cat or 'all':15s} own gain {med('specdec', cat) / med('specdec-off', cat):.2f}x; vs llama plain "
          f"{med('specdec', cat) / med('llama-server', cat):.2f}x; vs llama best spec ({best}) "
          f"{med('specdec', cat) / med(best, cat):.2f}x")
# per round own gain
for rnd in sorted({r['round'] for r in d['requests']}):
    s = statistics.median(r['decode_tok_s'] for r in spec.values() if r['round'] == rnd)
    o = statistics.median(r['decode_tok_s'] for r in off.values() if r['round'] == rnd)
    bests = {e: statistics.median(r['decode_tok_s'] for r in by[e].values() if r['round'] == rnd) for e in llama_spec}
    b = max(bests, key=bests.get)
    print(f"round {rnd}: own gain {s / o:.2f}x, vs best llama spec ({b}) {s / bests[b]:.2f}x")
methods = {}
for r in spec.values():
    m = (r.get('speculative') or {}).get('method')
    methods[m] = methods.get(m, 0) + 1
print('specdec methods chosen', methods)
