"""One OpenVINO GenAI pipeline as a worker of openvino_bench.py (run by OpenVINO's own venv, not specdec's): reads a
JSON request per line ({"prompt": chat-templated text, "max_tokens": N}) and answers one JSON line per request with
its text, tokens, first-token time and decode speed.

    python openvino_worker.py {plain,draft,lookup} TARGET_IR [DRAFT_IR]

plain: LLMPipeline on the target; draft: with draft_model(DRAFT_IR), 4 tokens a step; lookup: prompt_lookup=True,
4 tokens a step from n-grams of up to 3 (GenAI's own knobs). Greedy. `generate` takes a one-prompt list: GenAI
returns its perf metrics (TTFT) only for a list.
"""
import json
import sys
import time

import openvino_genai as ov

mode, target = sys.argv[1], sys.argv[2]
kwargs = {}
if mode == "draft":
    kwargs["draft_model"] = ov.draft_model(sys.argv[3], "CPU")
elif mode == "lookup":
    kwargs["prompt_lookup"] = True
pipe = ov.LLMPipeline(target, "CPU", **kwargs)
print(json.dumps({"ready": mode}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    cfg = ov.GenerationConfig()
    cfg.max_new_tokens = req["max_tokens"]
    cfg.do_sample = False
    cfg.apply_chat_template = False          # the prompt comes templated (the same template specdec renders)
    if mode in ("draft", "lookup"):
        cfg.num_assistant_tokens = 4
    if mode == "lookup":
        cfg.max_ngram_size = 3
    t0 = time.perf_counter()
    res = pipe.generate([req["prompt"]], cfg)
    e2e = time.perf_counter() - t0
    pm = res.perf_metrics
    n = int(pm.get_num_generated_tokens())
    ttft = float(pm.get_ttft().mean) / 1000.0
    decode = (n - 1) / (e2e - ttft) if n > 1 and e2e > ttft else 0.0
    print(json.dumps({"text": res.texts[0], "output_tokens": n, "ttft_s": ttft, "e2e_s": e2e,
                      "decode_tok_s": decode, "prompt_tokens": int(pm.get_num_input_tokens())}), flush=True)
