"""Rank the target's vocabulary by how often the target emits each token, for the draft model's cut output head
(FR-Spec, Zhao et al. 2025; EAGLE-3's draft vocabulary): specdec/heads/<target>/draft-vocab.safetensors.

    .venv/bin/python tools/draft_vocab.py [--target qwen2.5-coder-1.5b-instruct] [--sharegpt-mb 48] [--code-mb 24]

The order: the special tokens (the end tokens and every control token: a draft must be able to end a turn), then
the tokens of the EAGLE-3 head shipped for the target (its draft vocabulary was counted on the target's own
answers, `train-head --regenerate`), then every other token by its count in text like what the target writes:
ShareGPT's assistant turns (conversations 2,000 onward; the benchmarks' ShareGPT text and prompts come from the
first 2,000 and from the human turns) and Python source (the standard library's own files). Tokens never seen
come last, by id. The file holds the first 65,536 (`--keep`); `draft_vocab_size` keeps its first N.
"""
from __future__ import annotations

import argparse
import sys
import sysconfig
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def sharegpt_answers(megabytes: float, skip: int = 2000):
    from specdec.bench.datasets import sharegpt_conversations

    size, limit = 0, megabytes * 1e6
    for i, conv in enumerate(sharegpt_conversations()):
        if i < skip:
            continue
        for turn in conv.get("conversations") or []:
            if isinstance(turn, dict) and turn.get("from") == "gpt" and turn.get("value"):
                yield turn["value"]
                size += len(turn["value"])
        if size >= limit:
            return


def python_sources(megabytes: float):
    size, limit = 0, megabytes * 1e6
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        yield text
        size += len(text)
        if size >= limit:
            return


def count(tokenizer, texts, batch: int = 256) -> Counter:
    counts: Counter = Counter()
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == batch:
            for ids in tokenizer.encode_texts(chunk):
                counts.update(ids)
            chunk = []
    for ids in tokenizer.encode_texts(chunk) if chunk else []:
        counts.update(ids)
    return counts


def main(argv: list[str] | None = None) -> None:
    from safetensors import safe_open

    from specdec.models.heads import SHIPPED
    from specdec.models.loader import load_model
    from specdec.proposers.draft_vocab import save_ranking

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--sharegpt-mb", type=float, default=48.0)
    ap.add_argument("--code-mb", type=float, default=24.0)
    ap.add_argument("--keep", type=int, default=65536, help="tokens of the ranking to write")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    tok = load_model(args.target, quantization="int4", progress=False).tokenizer
    vocab = tok.vocab_size
    # text as the model writes it: no BOS or chat template, control-token text read as plain characters
    counts = count(tok, sharegpt_answers(args.sharegpt_mb)) + count(tok, python_sources(args.code_mb))
    specials = sorted(set(tok.eos_token_ids) | set(tok.control_token_ids()))
    eagle = SHIPPED / args.target / "eagle3" / "model.safetensors"
    head_vocab: set[int] = set()
    if eagle.is_file():
        with safe_open(str(eagle), "pt") as f:
            if "d2t" in f.keys():
                d2t = f.get_tensor("d2t").long()
                head_vocab = set((torch.arange(len(d2t)) + d2t).tolist())
    seen = set(specials)
    ranked = list(specials)
    for group in (sorted(head_vocab, key=lambda t: (-counts[t], t)),
                  sorted((t for t in counts if t not in head_vocab), key=lambda t: (-counts[t], t)),
                  range(vocab)):
        for t in group:
            if t < vocab and t not in seen:
                seen.add(t)
                ranked.append(t)
    total = sum(counts.values())
    out = SHIPPED / args.target / "draft-vocab.safetensors"
    sources = (f"specials, eagle3 d2t ({len(head_vocab)}), sharegpt answers {args.sharegpt_mb} MB (conversations "
               f"2000+), python stdlib {args.code_mb} MB")
    save_ranking(out, torch.tensor(ranked[: args.keep], dtype=torch.int32),
                 {"target": args.target, "sources": sources, "tokens_counted": str(total)})
    cover = {n: sum(counts[t] for t in ranked[:n]) / total for n in (4096, 8192, 16384, 32768, 65536)}
    print(f"{out}: {min(len(ranked), args.keep)} tokens ranked from {total} counted in "
          f"{time.perf_counter() - t0:.0f} s; share of counted tokens in the first N: "
          + ", ".join(f"{n} {c:.4f}" for n, c in cover.items()))


if __name__ == "__main__":
    main()
