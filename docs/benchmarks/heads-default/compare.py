"""From a results.json of run.sh: each specdec label's gain over speculation off (median decode tok/s) by category
and by round, against llama-server plain, the time to first token of prompts over 1k tokens (per request, over
speculation off's), greedy parity with speculation off, and the methods auto ran.

    .venv/bin/python docs/benchmarks/heads-default/compare.py docs/benchmarks/heads-default/amd-zen4/results.json
"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
by = {}
for r in d['requests']:
    by.setdefault(r['endpoint'], {})[r['prompt_index']] = r
off = by['specdec-off']
specs = [e for e in by if e.startswith('specdec') and e != 'specdec-off']
cats = sorted({r['category'] for r in off.values()})


def med(ep, cat=None, rnd=None):
    return statistics.median(r['decode_tok_s'] for r in by[ep].values()
                             if (cat is None or r['category'] == cat) and (rnd is None or r['round'] == rnd))


print('median decode tok/s, and over specdec-off')
print(f"{'category':16s}" + ''.join(f'{e:>26s}' for e in ['llama-server', 'specdec-off', *specs]))
for cat in cats + [None]:
    o = med('specdec-off', cat)
    cells = [f"{med('llama-server', cat):26.2f}", f'{o:26.2f}']
    cells += [f'{med(e, cat):19.2f} {med(e, cat) / o:5.2f}x' for e in specs]
    print(f"{cat or 'all':16s}" + ''.join(cells))
for rnd in sorted({r['round'] for r in off.values()}):
    o = med('specdec-off', rnd=rnd)
    print(f'round {rnd}: ' + ', '.join(f'{e} {med(e, rnd=rnd) / o:.2f}x over off, '
                                      f'{med(e, rnd=rnd) / med("llama-server", rnd=rnd):.2f}x over llama'
                                      for e in specs))
long = sorted(i for i, r in off.items() if r['prompt_tokens'] > 1000)
for e in specs:
    ratios = [by[e][i]['ttft_s'] / off[i]['ttft_s'] for i in long]
    same = sum(by[e][i]['text'] == off[i]['text'] for i in off)
    methods = {}
    for _, r in sorted(by[e].items()):
        m = (r.get('speculative') or {}).get('method')
        methods.setdefault(m, []).append(r['category'])
    print(f'{e}: {len(long)} prompts over 1k tokens, TTFT over off median {statistics.median(ratios):.3f} '
          f'(max {max(ratios):.3f}); text identical to off {same}/{len(off)}')
    for m, c in methods.items():
        print(f'    ran {m}: {len(c)} ({", ".join(sorted(set(c)))})')
