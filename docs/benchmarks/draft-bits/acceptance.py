"""How much a 3-bit draft would give up: teacher-forced greedy acceptance of the 0.5B draft with its linears at the
bits `specdec serve` loads today (4: the GGUF's Q4_K blocks as they are, its Q5_0 / Q8_0 / Q6_K ones re-quantized to
4 bits) against linears re-quantized to 3 bits, simulated: the codes are dequantized into a bf16 copy of the draft,
so this needs no 3-bit kernel.

The target answers each prompt once (greedy, 96 tokens; cached in OUT); each draft variant then reads prompt +
answer in one forward, and at every answer position its argmax is compared with the target's token. A greedy chain
of k drafts from a position accepts the run of matches (at most k), then the target adds one token, so the matches
give the accepted tokens per step exactly as the engine would count them for greedy decoding.

    python docs/benchmarks/draft-bits/acceptance.py [VARIANT ...]
    # variants: 4, 3, 3-search, 3-search-mlp, 3-search-mlp-edgesN (the first and last N layers kept at 4 bits),
    # 3-imatrix-mlp (the search's error weighted per input by the mean square of the activations the draft's MLP
    # reads on 32 other ShareGPT prompts, as llama.cpp's importance matrix)
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

from specdec.bench.datasets import load_prompts
from specdec.models.quantization.blocks import dequantize, quantize_blocks
from specdec.models.quantization.gguf_blocks import codes_for_int4, dequantized
from specdec.models.runner import Span, forward_spans
from specdec.sampling_params import SamplingParams
from specdec.train.evaluate import chain_steps

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
PROMPTS = "builtin,sharegpt:8,humaneval:8"
OUT = Path("/tmp/draft-bits-target-answers.json")
K = 4


def target_answers() -> list[dict]:
    if OUT.exists():
        return json.loads(OUT.read_text())
    from specdec import LLM

    llm = LLM(target=TARGET, progress=False)
    data = []
    for p in load_prompts(PROMPTS):
        r = llm.generate(p["messages"], SamplingParams(temperature=0, max_tokens=96), spec="none")[0]
        data.append({"category": p.get("category", "?"), "prompt": r.prompt_token_ids, "output": r.token_ids})
    OUT.write_text(json.dumps(data))
    return data


def importance(model, tokenizer) -> dict[tuple[int, str], torch.Tensor]:
    """(layer, "gate_up" | "down") -> mean square of each input of that linear over 32 ShareGPT prompts (seed 1,
    not the evaluated ones), read with forward hooks on the bf16 draft."""
    sums: dict[tuple[int, str], list] = {}

    def hook(key):
        def record(_mod, args):
            x = args[0].float().reshape(-1, args[0].shape[-1])
            acc = sums.setdefault(key, [torch.zeros(x.shape[1]), 0])
            acc[0] += (x * x).sum(0)
            acc[1] += x.shape[0]
        return record

    handles = [m.register_forward_pre_hook(hook((i, name))) for i, layer in enumerate(model.layers)
               for name, m in (("gate_up", layer.mlp.gate_up_proj), ("down", layer.mlp.down_proj))]
    for p in load_prompts("sharegpt:32", seed=1):
        ids = tokenizer.encode_chat(p["messages"])[:512]
        kv = model.new_kv()
        kv.resize(-(-(len(ids) + 1) // model.key_block) * model.key_block)
        forward_spans(model, [Span(kv, 0, ids, "none")])
    for h in handles:
        h.remove()
    return {k: v[0] / max(v[1], 1) for k, v in sums.items()}


def draft_variant(variant: str):
    """The draft in bf16 with every q/k/v/o/gate/up/down weight replaced by its codes' dequantization."""
    from specdec.gguf_file import open_gguf
    from specdec.models.gguf_weights import gguf_config, iter_hf_tensors
    from specdec.models.loader import load_model, resolve_source

    bits = int(variant[0])
    loaded = load_model(DRAFT, quantization="none", pack=False, progress=False)
    model = loaded.model
    imp = importance(model, loaded.tokenizer) if "imatrix" in variant else {}
    reader = open_gguf(resolve_source(DRAFT, progress=False)[1])
    for name, t in iter_hf_tensors(reader, gguf_config(reader)):
        if not name.endswith("proj.weight"):
            continue
        layer = int(name.split(".")[2])
        b = bits if ("mlp" in name or "-mlp" not in variant) else 4
        edges = int(variant.rsplit("-edges", 1)[1]) if "-edges" in variant else 0
        if layer < edges or layer >= len(model.layers) - edges:     # the first and last layers kept at 4 bits
            b = 4
        weight_of = imp.get((layer, "down" if "down_proj" in name else "gate_up")) if "mlp" in name else None
        if b == 4:
            w = dequantize(codes_for_int4(t, exact=False))            # what the draft runs today
        else:
            w = dequantize(quantize_blocks(dequantized(t), b, search="search" in variant or "imatrix" in variant,
                                           importance=weight_of))
        _put(model, name, w)
    return model


def _put(model, name: str, w: torch.Tensor) -> None:
    """A GGUF projection's rows into the model's fused linear (q/k/v -> qkv_proj, gate/up -> gate_up_proj)."""
    i, part, which = re.match(r"model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)_proj\.weight", name).groups()
    layer, c = model.layers[int(i)], model.config
    if which in ("q", "k", "v"):
        lin = layer.self_attn.qkv_proj
        off = {"q": 0, "k": c.num_heads * c.head_dim, "v": (c.num_heads + c.num_kv_heads) * c.head_dim}[which]
    elif which in ("gate", "up"):
        lin = layer.mlp.gate_up_proj
        off = 0 if which == "gate" else lin.weight.shape[0] // 2
    else:
        lin, off = getattr(getattr(layer, part), which + "_proj"), 0
    with torch.no_grad():
        lin.weight[off: off + w.shape[0]] = w.to(lin.weight.dtype)


def answer_matches(model, d: dict) -> list[bool]:
    """Whether the draft's argmax after each prefix of prompt + answer is the target's next answer token."""
    ids = d["prompt"] + d["output"]
    kv = model.new_kv()
    kv.resize(-(-(len(ids) + 1) // model.key_block) * model.key_block)
    pred = forward_spans(model, [Span(kv, 0, ids, "all")])[0].argmax(-1)
    start = len(d["prompt"]) - 1
    return [int(pred[start + i]) == t for i, t in enumerate(d["output"])]


def acceptance(model, data: list[dict]) -> dict[str, list[int]]:
    """category -> [matches, answer tokens, accepted drafts, steps] over greedy chains of K."""
    out: dict[str, list[int]] = {}
    for d in data:
        match = answer_matches(model, d)
        accepted, steps = chain_steps(match, K)
        c = out.setdefault(d["category"], [0, 0, 0, 0])
        for i, v in enumerate((sum(match), len(match), accepted, steps)):
            c[i] += v
    return out


def main(variants: list[str]) -> None:
    torch.set_num_threads(2)
    data = target_answers()
    print(f"{len(data)} prompts ({PROMPTS}), {sum(len(d['output']) for d in data)} answer tokens; k = {K}")
    for v in variants:
        r = acceptance(draft_variant(v), data)
        tot = [sum(c[i] for c in r.values()) for i in range(4)]
        cats = " ".join(f"{c} {x[0] / x[1]:.3f}/{x[2] / x[3]:.2f}" for c, x in sorted(r.items()))
        print(f"{v:>13}: token match {tot[0] / tot[1]:.3f}, accepted per step {tot[2] / tot[3]:.2f} | {cats}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["4", "3", "3-search", "3-search-mlp"])
