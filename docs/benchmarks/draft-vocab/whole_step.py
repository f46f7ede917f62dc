"""A whole-head sequence's draft step: the cut head's logits computed and dropped (before) against not asked for
(after), in the same timed rounds; the real draft as `specdec serve` loads it, one row after 256 tokens."""
import statistics, time, torch
from specdec.models.loader import load_model
from specdec.models.runner import Span, forward_spans
from specdec.policy.measure import _primed_cache
from specdec.proposers.draft_vocab import draft_output_ids
torch.set_num_threads(2)
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
cut = draft_output_ids(TARGET, 32768, 151665)
m = load_model(DRAFT, quantization="int4", progress=False, int4_exact=False, output_ids=cut).model
whole = m.output_rows.whole()
last = m.config.num_layers
kv, ctx = _primed_cache(m, 256, 2)
def step(kind):
    lg, hid = forward_spans(m, [Span(kv, ctx, [5], kind, decode=True, hidden=True)], aux_layers=(last,))
    return whole(hid[0][last][-1:]).float()
def ms(kind, seconds=0.5):
    for _ in range(3): step(kind)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step(kind); n += 1
    return (time.perf_counter() - t0) / n * 1e3
r = {"last": [], "none": []}
for i in range(12):
    for k in (("last", "none") if i % 2 else ("none", "last")):
        r[k].append(ms(k))
ratio = [b / a for a, b in zip(r["last"], r["none"])]
print(f"before (cut head's logits too) {statistics.median(r['last']):.2f} ms, after {statistics.median(r['none']):.2f} ms;"
      f" after / before {statistics.median(ratio):.3f} [{min(ratio):.3f}-{max(ratio):.3f}] over 12 rounds")
