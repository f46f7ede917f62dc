"""How much the draft gives up when it reads only the start and the end of a long prompt: teacher-forced greedy
acceptance of the draft `specdec serve` loads (the 0.5B at 4 bits, its head cut to the target's tokens) reading the
whole prompt against reading its first S tokens (the chat template's system turn) and its last W, at positions
0..S+W-1 (the cut joined up, as if the middle had never been there).

The target answers each long prompt once (greedy, 96 tokens; cached in OUT); each variant then reads its view of the
prompt + the answer in one forward, and at every answer position its argmax is compared with the target's token.
Greedy chains of k = 4 give the accepted tokens per step as the engine would count them.

    python docs/benchmarks/draft-window/acceptance.py [full S:W ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from specdec.bench.datasets import load_prompts
from specdec.models.runner import Span, forward_spans
from specdec.sampling_params import SamplingParams
from specdec.train.evaluate import chain_steps

PROMPTS = "long:8,builtin"
OUT = Path("/tmp/draft-window-target-answers.json")
K = 4


def target_answers(llm) -> list[dict]:
    if OUT.exists():
        return json.loads(OUT.read_text())
    data = []
    for p in load_prompts(PROMPTS):
        r = llm.generate(p["messages"], SamplingParams(temperature=0, max_tokens=96), spec="none")[0]
        data.append({"category": p.get("category", "?"), "prompt": r.prompt_token_ids, "output": r.token_ids})
        print(p.get("category"), len(r.prompt_token_ids), flush=True)
    OUT.write_text(json.dumps(data))
    return data


def view(prompt: list[int], variant: str) -> list[int]:
    if variant == "full":
        return prompt
    s, w = map(int, variant.split(":"))
    return prompt if len(prompt) <= s + w else prompt[:s] + prompt[len(prompt) - w:]


def answer_matches(model, prompt: list[int], output: list[int]) -> list[bool]:
    ids = prompt + output
    kv = model.new_kv()
    kv.resize(-(-(len(ids) + 1) // model.key_block) * model.key_block)
    logits = forward_spans(model, [Span(kv, 0, ids, "all")])[0]
    pred = logits.argmax(-1)
    if model.output_ids is not None:
        pred = model.output_ids[pred]
    start = len(prompt) - 1
    return [int(pred[start + i]) == t for i, t in enumerate(output)]


def main(variants: list[str]) -> None:
    from specdec import LLM, SpeculativeConfig

    torch.set_num_threads(2)
    llm = LLM(target="qwen2.5-coder-1.5b-instruct", speculative=SpeculativeConfig(method="auto"), progress=False)
    data = target_answers(llm)
    model = llm.draft.model
    print(f"{len(data)} prompts ({PROMPTS}), prompt tokens {[len(d['prompt']) for d in data]}; k = {K}")
    for v in variants:
        by: dict[str, list[int]] = {}
        for d in data:
            match = answer_matches(model, view(d["prompt"], v), d["output"])
            accepted, steps = chain_steps(match, K)
            c = by.setdefault(d["category"] + ("-long" if len(d["prompt"]) > 800 else ""), [0, 0, 0, 0])
            for i, x in enumerate((sum(match), len(match), accepted, steps)):
                c[i] += x
        cats = " ".join(f"{c} {x[0] / x[1]:.3f}/{x[2] / x[3]:.2f}" for c, x in sorted(by.items()))
        print(f"{v:>9}: {cats}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["full", "32:1024", "32:512", "32:256", "0:512", "4:512"])
