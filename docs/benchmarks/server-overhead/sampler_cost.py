"""What the live page's sampler costs the engine beside it: a 2k-token prompt's first token (the default target, int4,
speculation off, one process) with a thread doing what `specdec serve`'s sampler does once a second (render the
server's Prometheus exposition, read the counters the page plots: `dashboard.read_sample`), the same with the whole
exposition parsed (the sampler before it kept only its lines), and with no such thread; the three in rotation.

    python docs/benchmarks/server-overhead/sampler_cost.py [ROUNDS]
"""
import json
import pathlib
import statistics
import sys
import threading
import time

from prometheus_client.parser import text_string_to_metric_families

from specdec import LLM, SamplingParams
from specdec.server.dashboard import read_sample
from specdec.server.metrics import ServerMetrics

PROMPT = pathlib.Path(__file__).resolve().parents[1] / "ttft-2k" / "prompt.jsonl"
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
words = json.loads(PROMPT.read_text().splitlines()[0])["messages"][0]["content"].split()
llm = LLM(speculative="none", progress=False)
greedy = SamplingParams(max_tokens=1, temperature=0)
metrics = ServerMetrics(llm.target.name)
for _ in range(20):                                   # an exposition with values, as a server's after some requests
    metrics.observe_first_token(0.3), metrics.observe_token_gap(0.05)
mode, stop = ["off"], threading.Event()


def sampler():
    while not stop.is_set():
        if mode[0] == "sampler":
            read_sample(metrics.render().decode())
        elif mode[0] == "whole parse":
            list(text_string_to_metric_families(metrics.render().decode()))
        time.sleep(1.0)


threading.Thread(target=sampler, daemon=True).start()
llm.generate("warm-up " + " ".join(words[:300]), greedy)
modes = ["off", "sampler", "whole parse"]
times = {m: [] for m in modes}
for r in range(rounds):
    for m in modes[r % 3:] + modes[:r % 3]:
        mode[0] = m
        time.sleep(0.5)
        t0 = time.perf_counter()
        llm.generate(f"[round {r}, {m}]\n" + " ".join(words[:1400]), greedy)
        times[m].append(time.perf_counter() - t0)
stop.set()
for m in modes:
    ratio = statistics.median(a / b for a, b in zip(times[m], times["off"]))
    print(f"{m:12s} median {statistics.median(times[m]):.3f} s, over off per round {ratio:.3f}; "
          + " ".join(f"{t:.2f}" for t in times[m]))
