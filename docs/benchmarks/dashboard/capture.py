"""A screenshot of the live page from a real run: sends a few requests (default method, then prompt lookup and
the draft model, in two speculation pools) to a running `specdec serve`, then opens /dashboard in headless
Chromium and saves what it draws.

    specdec serve --port 8125 &
    python docs/benchmarks/dashboard/capture.py --endpoint http://127.0.0.1:8125 --out docs/dashboard.png
"""
import argparse
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from browser_utils import browser, open_live_page  # noqa: E402

PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "Rewrite with type hints:\n\ndef mean(xs):\n    return sum(xs) / len(xs)",
           "Explain what a prefix cache is in two sentences."]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    url = args.endpoint.rstrip("/")
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    for _ in range(args.rounds):
        for pool, method in (("chat", None), ("code", "ngram"), ("code", "draft")):
            for prompt in PROMPTS:
                body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 96,
                        "temperature": 0, "spec_pool": pool, **({"speculative": {"method": method}} if method else {})}
                httpx.post(url + "/v1/chat/completions", json=body, timeout=600).raise_for_status()
    time.sleep(2.5)
    driver = browser()
    try:
        shown = open_live_page(driver, url, None)
        time.sleep(3)                                   # one more refresh with every chart drawn
        driver.save_screenshot(args.out)
    finally:
        driver.quit()
    status = httpx.get(url + "/v1/speculative/status").json()["speculation"]
    print(json.dumps({"page": shown, "status": status}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
