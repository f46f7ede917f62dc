"""Predicted outputs (OpenAI's `prediction`, method predicted_outputs): the proposer follows the prediction and
re-syncs after a divergence; greedy answers are the same with any prediction, right, wrong or edited; the server
takes the field, reports accepted and rejected prediction tokens, and refuses what it cannot honour."""
from __future__ import annotations

import httpx
import pytest
from server_utils import draft_llm, running_server

from specdec import SpeculativeConfig
from specdec.proposers.base import ProposalContext
from specdec.proposers.prediction import METHOD, PredictionProposer, resync
from specdec.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


def _ctx(ids, prediction, seq_id=1):
    return ProposalContext(seq_id, list(ids), GREEDY, None, prediction=list(prediction))


def test_it_follows_the_prediction_and_resyncs_after_an_edit():
    p = PredictionProposer()
    pred = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    prompt = [1, 2, 3]
    # the first decode step: the answer's first token opens the prediction
    assert p.propose([_ctx(prompt + [10], pred)], [3])[0].token_ids.tolist() == [11, 12, 13]
    # two accepted, then the target wrote 13 as predicted: still in step
    assert p.propose([_ctx(prompt + [10, 11, 12, 13], pred)], [4])[0].token_ids.tolist() == [14, 15, 16, 17]
    # an edit: 99 instead of 14 -- nothing of the prediction follows "13 99" ...
    assert p.propose([_ctx(prompt + [10, 11, 12, 13, 99], pred)], [4])[0].token_ids.tolist() == []
    # ... until the answer is back on it: "15 16" occurs, so 17 onwards is proposed
    assert p.propose([_ctx(prompt + [10, 11, 12, 13, 99, 15, 16], pred)], [2])[0].token_ids.tolist() == [17, 18]
    # the end of the prediction: nothing more to propose
    assert p.propose([_ctx(prompt + [10, 11, 12, 13, 99, 15, 16, 17, 18, 19], pred)], [4])[0].token_ids.tolist() == []
    p.release(1)
    assert not p.at and p.status() == {"requests": 1, "proposed_tokens": 9}


def test_resync_takes_the_longest_tail_nearest_after_where_it_was():
    pred = [5, 6, 7, 1, 2, 5, 6, 8, 5, 6, 7, 9]
    assert resync(pred, [0, 5, 6, 7], None) == 3          # the longest tail "5 6 7", first occurrence
    assert resync(pred, [0, 5, 6, 7], 4) == 11            # the occurrence after position 4
    assert resync(pred, [0, 5, 6], 4) == 7                # "5 6" nearest after 4 ends at 7
    assert resync(pred, [4, 3], 0) is None                # no tail of two or more occurs


def test_a_request_without_a_prediction_drafts_nothing_and_auto_never_picks_it(tiny_dirs):
    p = PredictionProposer()
    assert p.propose([ProposalContext(1, [1, 2, 3], GREEDY, None)], [4])[0].token_ids.numel() == 0
    assert not METHOD.auto_candidate


@pytest.fixture(scope="module")
def llm(tiny_dirs):
    return draft_llm(tiny_dirs)


def _run(llm, prompt, prediction=None, k=None):
    spec = SpeculativeConfig(method=METHOD.name, num_speculative_tokens=k, prediction=prediction) \
        if prediction is not None else SpeculativeConfig(method="none")
    return llm.generate(prompt, GREEDY, spec=spec)[0]


def test_greedy_answers_do_not_depend_on_the_prediction(llm):
    prompt = "class Cache:\n    def rollback(self, n):"
    plain = _run(llm, prompt)
    exact = _run(llm, prompt, plain.token_ids)
    assert exact.token_ids == plain.token_ids
    assert exact.stats.accepted_tokens >= len(plain.token_ids) - 1 - exact.stats.target_forwards   # all but bonuses
    assert exact.stats.target_forwards <= len(plain.token_ids) // 4
    edited = plain.token_ids[:12] + [7, 7, 7] + plain.token_ids[15:]       # a prediction with an edit inside
    run = _run(llm, prompt, edited, k=6)
    assert run.token_ids == plain.token_ids
    assert run.stats.accepted_tokens > 20                                     # it found its way back after the edit
    wrong = _run(llm, prompt, plain.token_ids[:1] + [3] * 50)                 # right first token, then wrong
    assert wrong.token_ids == plain.token_ids and wrong.stats.accepted_tokens < wrong.stats.draft_tokens


def test_the_server_takes_a_prediction_and_reports_its_tokens(llm):
    msgs = [{"role": "user", "content": "class Cache:\n    def rollback(self, n):"}]
    with running_server(llm, SpeculativeConfig(method="auto")) as (url, _):
        def ask(**extra):
            r = httpx.post(url + "/v1/chat/completions", timeout=60,
                           json={"messages": msgs, "max_tokens": 32, "temperature": 0, "ignore_eos": True, **extra})
            assert r.status_code == 200, r.text
            return r.json()
        plain = ask(speculative={"method": "none"})
        text = plain["choices"][0]["message"]["content"]
        assert "completion_tokens_details" not in plain["usage"]
        got = ask(prediction={"type": "content", "content": text})
        assert got["choices"][0]["message"]["content"] == text
        assert got["speculative"]["method"] == METHOD.name
        details = got["usage"]["completion_tokens_details"]
        # the random model's text holds broken UTF-8, so re-encoding it does not give back every token; the engine
        # test above checks near-total acceptance of an exact token-level prediction
        assert details["accepted_prediction_tokens"] > 4, details
        # every predicted token verified is either accepted or rejected
        spec = got["speculative"]
        assert details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"] == spec["draft_tokens"]
        parts = ask(prediction={"type": "content", "content": [{"type": "text", "text": text[:20]},
                                                                {"type": "text", "text": text[20:]}]})
        assert parts["choices"][0]["message"]["content"] == text
        # streamed, with usage in the last chunk
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                          json={"messages": msgs, "max_tokens": 32, "temperature": 0, "ignore_eos": True,
                                "stream": True, "stream_options": {"include_usage": True},
                                "prediction": {"type": "content", "content": "unrelated words " * 8}}) as r:
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: {")]
        import json
        chunks = [json.loads(ln[6:]) for ln in lines]
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert streamed == text
        assert "rejected_prediction_tokens" in chunks[-1]["usage"]["completion_tokens_details"]
        # a prediction is drafted by its method: another one named beside it is refused
        r = httpx.post(url + "/v1/chat/completions", timeout=30,
                       json={"messages": msgs, "prediction": {"type": "content", "content": text},
                             "speculative": {"method": "ngram"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prediction"


def test_bench_serve_sends_predictions_to_the_labelled_endpoint_only(llm, tmp_path, capsys):
    """`bench serve --prediction LABEL`: the labelled endpoint gets each request's prediction (a JSONL
    `prediction`, as the edits dataset carries), the other the same requests without it; greedy answers agree. The
    machine is idle-gated before every round."""
    import json

    from specdec.bench.edits import load_edits
    from specdec.cli import main

    edits = load_edits(2)
    assert len(edits) == 2 and all(e["prediction"].startswith("```python\n") for e in edits)
    data = tmp_path / "edits.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"def f{i}(a):\n    return a"}],
                                          "category": "code-edit", "prediction": f"def f{i}(a):\n    return a"})
                              for i in range(2)) + "\n")
    with running_server(llm, SpeculativeConfig(method="none")) as (url, _):
        out = tmp_path / "bench"
        rc = main(["bench", "serve", "--endpoint", url, "--endpoint", url, "--label", "plain", "--label", "predicted",
                   "--prediction", "predicted", "--dataset", str(data), "--max-tokens", "24", "--out", str(out)])
        assert rc == 0, capsys.readouterr().err
    result = json.loads((out / "results.json").read_text())
    by: dict[str, set] = {}
    for r in result["requests"]:
        by.setdefault(r["endpoint"], set()).add((r["speculative"] or {}).get("method"))
    assert by == {"plain": {"none"}, "predicted": {METHOD.name}}, by
    rows = {r["endpoint"]: r for r in result["summary"]}
    assert rows["predicted"]["identical_to_first"] == 1.0 and rows["predicted"]["errors"] == 0
    assert rows["predicted"]["identical_to"] == {"plain": 1.0} and rows["plain"]["identical_to"] == {"predicted": 1.0}
    assert isinstance(result["config"]["idle_wait_s"], float)     # the gate ran (bench/idle.py: test_bench.py)
    assert main(["bench", "serve", "--endpoint", "http://127.0.0.1:9", "--prediction", "nope"]) == 1
    assert "--prediction 'nope' is not an endpoint label" in capsys.readouterr().err
