"""Clients nobody here wrote, against a live `specdec serve` on the tiny pair: langchain-openai's ChatOpenAI (invoke,
stream, bind_tools, with_structured_output) and lm-evaluation-harness (`local-completions` on a log-likelihood task,
`local-chat-completions` on a generation task, with task files shipped in tests/lm_eval_tasks: no hub is reachable).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.models.runner import forward_once

TASKS = Path(__file__).parent / "lm_eval_tasks"
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def served(draft_server):
    return draft_server[:2]


def test_langchain_chat_openai_invoke_stream_tools_and_structured_output(served):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    llm = ChatOpenAI(base_url=served[0] + "/v1", api_key="unused", model="tiny", temperature=0, max_tokens=16,
                     max_retries=0)
    whole = llm.invoke(PROMPT)
    assert isinstance(whole.content, str) and whole.content
    assert "".join(chunk.content for chunk in llm.stream(PROMPT)) == whole.content

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    called = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?", max_tokens=120)
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
    assert isinstance(called.tool_calls[0]["args"].get("city"), str)

    class Digit(BaseModel):
        n: int = Field(ge=0, le=9)

    out = llm.with_structured_output(Digit).invoke("A digit:", max_tokens=40)
    assert isinstance(out, Digit) and 0 <= out.n <= 9


def _lm_eval(tmp_path, args: list[str]) -> dict:
    tasks = tmp_path / "tasks"
    shutil.copytree(TASKS, tasks)
    for yaml in tasks.glob("*.yaml"):             # the data files by absolute path (lm-eval reads them from the cwd)
        text = yaml.read_text()
        for data in tasks.glob("*.jsonl"):
            text = text.replace(f"test: {data.name}", f"test: {data}")
        yaml.write_text(text)
    out = tmp_path / "out"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "OPENAI_API_KEY": "unused"}
    proc = subprocess.run([sys.executable, "-m", "lm_eval", *args, "--include_path", str(tasks), "--output_path",
                           str(out), "--log_samples"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = sorted(out.rglob("results_*.json"))
    assert results, proc.stderr[-2000:]
    samples = [json.loads(line) for f in out.rglob("samples_*.jsonl") for line in f.read_text().splitlines()]
    return json.loads(results[-1].read_text()) | {"samples": samples}


def test_lm_eval_local_completions_scores_a_loglikelihood_task(served, tmp_path, tiny_dirs):
    url, llm = served
    r = _lm_eval(tmp_path, ["--model", "local-completions", "--tasks", "specdec_tiny_choice", "--model_args",
                            f"model=tiny,base_url={url}/v1/completions,tokenizer_backend=huggingface,"
                            f"tokenizer={tiny_dirs['target']},tokenized_requests=True,num_concurrent=1,"
                            "max_retries=1"])
    acc = r["results"]["specdec_tiny_choice"]["acc,none"]
    assert 0.0 <= acc <= 1.0
    assert r["n-samples"]["specdec_tiny_choice"]["effective"] == 4
    # each choice's score is the sum of the continuation's logprobs in a plain forward of the fp32 target, over the
    # token ids lm-eval sent (its tokenizer's: it splits the echoed logprobs where its context's tokens end)
    from transformers import AutoTokenizer

    hf, V = AutoTokenizer.from_pretrained(str(tiny_dirs["target"])), llm.tokenizer.vocab_size
    for sample in r["samples"]:
        for arg, resp in zip(sample["arguments"].values(), sample["resps"]):
            context, continuation = arg["arg_0"], arg["arg_1"]
            n_ctx = len(hf(context)["input_ids"])
            ids = hf(context)["input_ids"] + hf(continuation)["input_ids"]
            lp = torch.log_softmax(forward_once(llm.target.model, ids).float()[:, :V], -1)
            want = sum(lp[i - 1, ids[i]].item() for i in range(n_ctx, len(ids)))
            assert abs(float(resp[0][0]) - want) < 1e-3, (context, continuation)


def test_lm_eval_local_chat_completions_runs_a_generation_task(served, tmp_path):
    r = _lm_eval(tmp_path, ["--model", "local-chat-completions", "--tasks", "specdec_tiny_gen", "--apply_chat_template",
                            "--model_args", f"model=tiny,base_url={served[0]}/v1/chat/completions,num_concurrent=1,"
                                            "max_retries=1"])
    assert "exact_match,none" in r["results"]["specdec_tiny_gen"]
    assert r["n-samples"]["specdec_tiny_gen"]["effective"] == 3
