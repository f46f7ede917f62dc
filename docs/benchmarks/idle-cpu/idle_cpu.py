"""CPU a server uses once it has answered: send a request, then read the server process's CPU time (user + system,
all threads, from /proc) over the next IDLE seconds with nothing sent.

Run: .venv/bin/python docs/benchmarks/idle-cpu/idle_cpu.py --pid PID --url http://127.0.0.1:PORT [--requests N]
(Linux; the server already started and warmed by one request). Prints one line per request: the answer's length,
then the CPU seconds the server spent in each of the IDLE seconds after it.
"""
import argparse
import json
import os
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")
PROMPTS = [
    "Write a Python function that merges two sorted lists, with a docstring and two doctests.",
    "Explain what a Python context manager is, with a short example using a file.",
    "Write a class Stack with push, pop and peek, raising IndexError on an empty stack.",
]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK        # utime + stime of every thread


def ask(url: str, model: str, prompt: str, max_tokens: int) -> int:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)["usage"]["completion_tokens"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--idle", type=int, default=5, help="seconds watched after each answer")
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    with urllib.request.urlopen(a.url + "/v1/models", timeout=60) as r:
        model = json.load(r)["data"][0]["id"]
    worst = 0.0
    for i in range(a.requests):
        n = ask(a.url, model, PROMPTS[i % len(PROMPTS)], a.max_tokens)
        base, per = cpu_seconds(a.pid), []
        for _ in range(a.idle):
            time.sleep(1.0)
            now = cpu_seconds(a.pid)
            per.append(now - base)
            base = now
        worst = max(worst, sum(per))
        print(f"request {i}: {n} tokens; CPU s in each of the next {a.idle} s: "
              f"{' '.join(f'{x:.2f}' for x in per)} (total {sum(per):.2f})", flush=True)
    print(f"most CPU in {a.idle} s after an answer: {worst:.2f} s")


if __name__ == "__main__":
    main()
