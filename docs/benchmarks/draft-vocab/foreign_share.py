"""How much of a prompt is non-ASCII text the draft's cut head lacks (what draft_model.WHOLE_HEAD_SHARE is set
against), and how much is outside the cut at all: the built-in and long prompts, and the first turns of the first 400
ShareGPT conversations (the prompts over 0.5% printed).

    .venv/bin/python docs/benchmarks/draft-vocab/foreign_share.py
"""
from __future__ import annotations

from specdec import LLM
from specdec.bench.datasets import sharegpt_conversations
from specdec.bench.long_prompts import long_prompts
from specdec.bench.prompts import BUILTIN_PROMPTS
from specdec.proposers.draft_vocab import load_ranking, ranking_path


def main() -> None:
    llm = LLM(speculative="none")
    tok = llm.tokenizer
    cut = set(load_ranking(ranking_path(llm.target.name))[:32768].tolist())

    def shares(ids: list[int]) -> tuple[float, float]:
        outside = [t for t in ids if t not in cut]
        foreign = [t for t in outside if max(tok.token_bytes(t), default=0) >= 0x80]
        return len(foreign) / len(ids), len(outside) / len(ids)

    print("| prompt | tokens | non-ASCII outside the cut | outside the cut |")
    print("|---|---|---|---|")
    for p in BUILTIN_PROMPTS + long_prompts():
        ids = llm.encode(p["messages"])
        f, o = shares(ids)
        text = p["messages"][-1]["content"][:24].replace("\n", " ").replace("|", " ")
        print(f"| {p['category']} `{text}` | {len(ids)} | {f:.3f} | {o:.3f} |")
    rows = []
    for i, conv in enumerate(sharegpt_conversations()):
        if i >= 400:
            break
        turns = conv.get("conversations") or []
        if turns and isinstance(turns[0], dict) and turns[0].get("from") == "human" and turns[0].get("value"):
            ids = llm.encode([{"role": "user", "content": turns[0]["value"][:4000]}])
            rows.append((*shares(ids), turns[0]["value"][:40].replace("\n", " ").replace("|", " ")))
    rows.sort()
    q = [rows[int(x * (len(rows) - 1))][0] for x in (0.5, 0.9, 0.95, 0.99)]
    print(f"\nShareGPT first turns: {len(rows)}; non-ASCII outside the cut, quantiles 0.5 / 0.9 / 0.95 / 0.99: "
          + " / ".join(f"{v:.3f}" for v in q))
    for f, o, text in rows:
        if f > 0.005:
            print(f"  {f:.3f} (outside the cut {o:.3f}) `{text}`")


if __name__ == "__main__":
    main()
