"""Teacher-forced record of the 0.5B draft's confidence against the target's greedy answers (issue 57: open prose).

    .venv/bin/python docs/benchmarks/draft-confidence/collect.py OUT.json [SHAREGPT_N]

For every answer position: the draft's greedy token given the target's own prefix (its cut head, as it drafts), the
probability it gives that token (q_max, over the cut head's rows) and whether the target's token equals it. The
answers: served r11's speculation-off texts for the built-in and long prompts, and the target's greedy 128 tokens
for SHAREGPT_N ShareGPT prompts (generated here with the fixed draft: greedy parity makes them the target's).
"""
import json
import sys

import torch

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.models.runner import Span, forward_spans

out_path = sys.argv[1]
n_share = int(sys.argv[2]) if len(sys.argv) > 2 else 12
llm = LLM(speculative="draft", progress=False)
tok = llm.tokenizer
cases = []
d = json.load(open("docs/benchmarks/auto-vs-fixed/served-intel-amx-r11/results.json"))
texts = {r["prompt_index"]: (r["category"], r["text"]) for r in d["requests"] if r["endpoint"] == "specdec-off"}
for i, p in enumerate(load_prompts("builtin,long:8")):
    cat, text = texts[i]
    cases.append((cat, tok.encode_chat(p["messages"]), tok.encode(text)))
if n_share:
    for p in load_prompts(f"sharegpt:{n_share}"):
        prompt = tok.encode_chat(p["messages"])[-1500:]
        o = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=128))[0]
        cases.append(("sharegpt", prompt, list(o.token_ids)))

draft = llm.engine.proposers["draft"]
model, kv = draft.model, draft.kv
records = []
with torch.inference_mode():
    for n, (cat, prompt, answer) in enumerate(cases):
        seq_id = 10_000 + n
        ids = prompt + answer
        kv.ensure(seq_id, len(ids))
        c = kv.get(seq_id)
        forward_spans(model, [Span(c, 0, prompt[:-1], "none")])
        c.length = len(prompt) - 1
        # the head's columns as the proposer drafts from them: the cut, the sequence's own tokens outside it, or the
        # whole head for a sequence in another script (its context rows from the whole sequence at once here)
        rows = draft.context_rows(seq_id, ids)
        last = model.config.num_layers
        logits, hidden = forward_spans(model, [Span(c, len(prompt) - 1, ids[len(prompt) - 1:-1], "all", hidden=True)],
                                       aux_layers=(last,))
        logits, token_ids = draft.columns(seq_id, None if rows is not None and rows.whole else logits[0],
                                          hidden[0][last], len(answer))
        q = torch.softmax(logits.float(), -1)
        qmax, j = q.max(-1)
        guess = token_ids[j] if token_ids is not None else j
        match = (guess == torch.tensor(answer)).tolist()
        records.append({"category": cat, "whole_head": bool(rows is not None and rows.whole),
                        "prompt_tokens": len(prompt), "q_max": [round(x, 4) for x in qmax.tolist()], "match": match})
        draft.release(seq_id)
        print(cat, len(prompt), len(answer), f"match {sum(match) / len(match):.2f}", flush=True)
json.dump({"cases": records}, open(out_path, "w"))
