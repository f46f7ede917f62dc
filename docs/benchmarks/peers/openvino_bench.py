"""OpenVINO GenAI beside specdec, in process, on the same prompts (issue 61): each engine as its users run it from
Python, greedy, 128 tokens, the chat template rendered once (specdec's tokenizer) and given to both, prompt i to
every engine before prompt i + 1, each request after the machine is idle.

    .venv/bin/python docs/benchmarks/peers/openvino_bench.py OV_PYTHON TARGET_IR DRAFT_IR OUT [--dataset builtin,long:4]
        [--rounds 1]

Engines: OpenVINO GenAI plain, with the 0.5B draft (draft_model), with prompt lookup (openvino_worker.py in OpenVINO's
venv, one process each); specdec `LLM()` with speculation off and with its defaults (auto, the shipped heads), one
`LLM` each. Writes
OUT/results.json and prints median decode tok/s by category, first-token times of the long prompts, e2e and greedy
text agreement.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import statistics
import subprocess
import sys

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.bench.idle import wait_until_idle

WORKER = pathlib.Path(__file__).with_name("openvino_worker.py")


class Worker:
    def __init__(self, python: str, mode: str, target: str, draft: str):
        self.proc = subprocess.Popen([python, str(WORKER), mode, target, draft], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        ready = self.proc.stdout.readline()
        if not ready:
            raise SystemExit(f"openvino worker {mode} did not start")

    def run(self, prompt: str, max_tokens: int) -> dict:
        self.proc.stdin.write(json.dumps({"prompt": prompt, "max_tokens": max_tokens}) + "\n")
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ov_python")
    ap.add_argument("target_ir")
    ap.add_argument("draft_ir")
    ap.add_argument("out")
    ap.add_argument("--dataset", default="builtin,long:4")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(args.dataset)
    # one LLM per mode and per round: in one LLM the second mode (or the next round) would find the prompt in the
    # prefix cache and, for auto, the earlier answer in its suffix tree of past answers (OpenVINO keeps neither across
    # generate calls); a first run of two rounds in one LLM gave auto 95 tok/s in its second round, 28 in its first
    def fresh() -> dict:
        return {"specdec-off": LLM(speculative="none", quantization="int4", progress=False),
                "specdec-auto": LLM(speculative="auto", quantization="int4", progress=False)}

    llms = fresh()
    tok = llms["specdec-off"].tokenizer
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    workers = {f"openvino-{m}": Worker(args.ov_python, m, args.target_ir, args.draft_ir)
               for m in ("plain", "draft", "lookup")}
    rows = []
    for r in range(args.rounds):
        if r:
            llms.clear()                        # the last round's models freed before the next are loaded
            llms.update(fresh())
        for i, p in enumerate(prompts):
            rendered = tok.apply_chat_template(p["messages"])
            for name in [*workers, "specdec-off", "specdec-auto"]:
                wait_until_idle()
                if name in workers:
                    res = workers[name].run(rendered, args.max_tokens)
                else:
                    o = llms[name].generate(p["messages"], greedy)[0]
                    s = o.stats
                    res = {"text": o.text, "output_tokens": s.completion_tokens, "ttft_s": s.ttft_s, "e2e_s": s.e2e_s,
                           "decode_tok_s": s.decode_tok_s, "prompt_tokens": s.prompt_tokens,
                           "cached_tokens": s.cached_tokens}
                res.update(engine=name, round=r, prompt_index=i, category=p.get("category", ""))
                rows.append(res)
                print(f"round {r} prompt {i} {name}: {res['prompt_tokens']} prompt tokens, ttft {res['ttft_s']:.2f} s, "
                      f"{res['decode_tok_s']:.2f} tok/s", flush=True)
    for w in workers.values():
        w.close()
    (out / "results.json").write_text(json.dumps({"dataset": args.dataset, "rounds": args.rounds, "rows": rows},
                                                 indent=1))
    summary = summarize(rows)
    (out / "compare.txt").write_text(summary)
    print(summary)


def summarize(rows: list[dict]) -> str:
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    cats = sorted({r["category"] for r in rows})
    lines = ["median decode tok/s by category", "category".ljust(16) + "".join(e.rjust(18) for e in engines)]
    for c in cats + ["all"]:
        vals = [statistics.median([r["decode_tok_s"] for r in rows if r["engine"] == e and c in (r["category"], "all")])
                for e in engines]
        lines.append(c.ljust(16) + "".join(f"{v:18.2f}" for v in vals))
    lines.append("first token (s) of prompts over 1k tokens, by prompt")
    for e in engines:
        long = [r for r in rows if r["engine"] == e and r["prompt_tokens"] > 1000]
        lines.append(f"  {e}: " + ", ".join(f"{r['ttft_s']:.2f}" for r in long)
                     + (f"; e2e median {statistics.median(r['e2e_s'] for r in long):.1f} s" if long else ""))
    texts = collections.defaultdict(dict)
    for r in rows:
        texts[(r["round"], r["prompt_index"])][r["engine"]] = r["text"].strip()
    for a in engines:
        for b in engines[engines.index(a) + 1:]:
            same = sum(t.get(a) == t.get(b) for t in texts.values())
            lines.append(f"identical text {a} / {b}: {same}/{len(texts)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
