"""Structured outputs: the grammar's masks on every verification row keep speculative sampling exact, and the
tiny pair's constrained outputs parse and validate under every method."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import torch
from server_utils import running_server
from test_sampler import POSITIONS, TV_BOUND, N, V, _run, _tv

from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.sampling.grammar import StructuredOutputs
from specdec.sampling.logits import probs_from_logits

# -- exactness: a prefix-dependent mask (the toy grammar: which tokens may follow which), verified as the engine does:
# row j masked by the state after the draft's first j tokens, the draft itself unconstrained ----------------------


def _toy(seed):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(V, V, generator=g) * 1.5
    draft = target + torch.randn(V, V, generator=g)                  # unconstrained: proposes forbidden tokens
    allowed = torch.rand(V, V, generator=g) < 0.35                   # row: previous token -> tokens allowed next
    allowed[torch.arange(V), torch.randint(V, (V,), generator=g)] = True
    p_c = probs_from_logits(target.masked_fill(~allowed, float("-inf")), temperature=1.0)   # constrained target
    return p_c, probs_from_logits(draft, temperature=1.0), allowed


@pytest.mark.parametrize("k", [1, 3])
def test_constrained_speculative_sampling_is_exact(k):
    P_c, Q, allowed = _toy(seed=20 + k)
    seqs = _run(torch.log(P_c), Q, k, seed=200 + k, params=SamplingParams(temperature=1.0))
    assert all(tv < TV_BOUND for tv in _tv(seqs, P_c))
    prev = torch.zeros(N, dtype=torch.long)
    for i in range(POSITIONS):                                        # never a forbidden token
        assert allowed[prev, seqs[:, i]].all()
        prev = seqs[:, i]


def test_negative_control_stale_grammar_state_fails():
    P_c, Q, allowed = _toy(seed=23)
    target = torch.log(P_c.clamp_min(1e-30))

    def stale(prev0, x):       # the next row masked with the mask before the draft, not after x
        logits = target[x].masked_fill(~allowed[prev0], float("-inf"))
        bad = ~torch.isfinite(logits).any(-1)
        logits[bad] = 0.0
        return logits

    seqs = _run(torch.log(P_c), Q, 3, seed=203, params=SamplingParams(temperature=1.0), l_row=stale)
    assert max(_tv(seqs, P_c)) > TV_BOUND


# -- the tiny pair ---------------------------------------------------------------------------------------------------
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def self_draft(tiny_dirs):
    return LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["target"]), dtype="float32", device="cpu",
               # draft_p_min 0: chains of k (the tiny draft is never 0.75 sure of a token)
               speculative=SpeculativeConfig(method="draft", num_speculative_tokens=3, draft_p_min=0.0), progress=False)


def _gen(llm, method, temperature, seed=0, schema=SCHEMA):
    spec = "none" if method == "none" else SpeculativeConfig(method=method, num_speculative_tokens=3, draft_p_min=0.0)
    params = SamplingParams(max_tokens=120, temperature=temperature, seed=seed,
                            structured_outputs=StructuredOutputs(json=schema))
    return llm.generate("def add(a, b):", params, spec=spec)[0]


def test_schema_outputs_validate_and_greedy_agrees_across_methods(self_draft):
    outs = {m: _gen(self_draft, m, 0) for m in ("none", "draft", "ngram")}
    for m, o in outs.items():
        assert o.finish_reason == "stop", (m, o.text)
        jsonschema.validate(json.loads(o.text), SCHEMA)
    assert outs["draft"].token_ids == outs["none"].token_ids == outs["ngram"].token_ids
    assert outs["none"].stats.forced_tokens == 0                      # method none: plain constrained decoding
    assert outs["draft"].stats.forced_tokens > 5                      # keys, quotes and braces came forced
    for seed in range(4):
        for m in ("none", "draft", "ngram"):
            o = _gen(self_draft, m, 1.0, seed=seed)
            jsonschema.validate(json.loads(o.text), SCHEMA)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_draft_model_proposes_only_allowed_tokens(tiny_dirs, temperature):
    """The tiny random draft, left alone, proposes tokens the schema forbids; with the grammar it drafts from the
    masked distribution and leaves the grammar state as it found it."""
    from server_utils import draft_llm

    from specdec.proposers.base import ProposalContext
    from specdec.sampling.grammar import Constraint

    llm = draft_llm(tiny_dirs)
    tok = llm.tokenizer
    prompt = tok.encode("def add(a, b):")
    so = StructuredOutputs(json=SCHEMA)
    params = SamplingParams(temperature=temperature, seed=1)
    for prefix in ([], tok.encode('{"name": "ab')):
        c = Constraint(so, tok)
        c.commit(prefix)
        g = torch.Generator().manual_seed(0)
        draft = llm.engine.proposers["draft"]
        free = draft.propose([ProposalContext(10_000 + len(prefix), prompt + prefix, params, g)], [6])[0]
        masked = draft.propose([ProposalContext(20_000 + len(prefix), prompt + prefix, params, g, c)], [6])[0]
        assert len(masked) == 6 and c.valid_prefix(masked.token_ids.tolist()) == 6
        assert c.valid_prefix(free.token_ids.tolist()) < 6                  # the control: unmasked, it strays
        fresh = Constraint(so, tok)
        fresh.commit(prefix)
        assert torch.equal(c.mask(), fresh.mask())                          # the state rolled back
        if masked.q_draft is not None:                                      # q is the masked distribution
            for j, t in enumerate(masked.token_ids.tolist()):
                assert masked.q_draft[j, t] > 0


def test_an_end_token_in_a_draft_leaves_the_grammar_state_whole(self_draft):
    """Rows are masked by consuming the draft and rolling back; an end token is never consumed (a matcher rolled
    back from the stopped state it leads to no longer accepts the same tokens: found on the real pair)."""
    from specdec.sampling.grammar import Constraint

    tok = self_draft.tokenizer
    ids = tok.encode('{"name": "a", "age": 3, "tags": []}')
    eos = tok.eos_token_ids[0]
    c = Constraint(StructuredOutputs(json=SCHEMA), tok)
    c.commit(ids[:-1])
    before = c.mask()
    rows = c.row_masks([ids[-1], eos, eos, ids[0]])
    assert rows[1].nonzero().flatten().tolist() == [eos] and rows[0][ids[-1]]
    assert torch.equal(c.mask(), before)
    c.commit([ids[-1], eos])
    assert not c.matcher.is_error() and c.mask().nonzero().flatten().tolist() == [eos]


def test_bad_grammar_is_refused_at_add(self_draft):
    from specdec.errors import SpecDecError

    with pytest.raises(SpecDecError, match="invalid structured output"):
        _gen(self_draft, "none", 0, schema={"type": "nope"})


@pytest.fixture(scope="module")
def server(self_draft):
    with running_server(self_draft, SpeculativeConfig(method="draft", num_speculative_tokens=3,
                                                       draft_p_min=0.0)) as (url, state):
        yield url, state


def test_response_format_through_the_openai_client(server):
    from openai import OpenAI

    url, _ = server
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "Give me a person as JSON."}]
    out = client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=120, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    assert out.model_extra["speculative"]["forced_tokens"] > 0
    stream = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=120, temperature=0, stream=True,
                                            response_format={"type": "json_object"})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert isinstance(json.loads(text), dict)
    r = httpx.post(url + "/v1/completions", timeout=60, json={"prompt": "x", "max_tokens": 20, "temperature": 0,
                                                              "structured_outputs": {"regex": "[ab]{3}-[0-9]{2}"}})
    assert r.status_code == 200 and __import__("re").fullmatch(r"[ab]{3}-[0-9]{2}", r.json()["choices"][0]["text"])


def test_bench_serve_validates_structured_answers(server, tmp_path):
    from specdec.bench.serve import ServeBenchConfig, render_serve_report, run_serve_bench
    from specdec.bench.structured_prompts import schema_valid

    url, _ = server
    result = run_serve_bench(ServeBenchConfig(endpoints=[url], dataset="structured", concurrency=[2], max_tokens=120,
                                              temperature=0, out=str(tmp_path)), progress=False)
    row = result["summary"][0]
    assert row["errors"] == 0, [r["error"] for r in result["requests"] if r["error"]][:2]
    valid, total = map(int, row["schema_valid"].split("/"))
    assert total == 20
    recs = [r for r in result["requests"] if r["prompt_index"] >= 0]
    # what the bench counts as valid is exactly what parses and validates (answers cut by max_tokens do not)
    assert valid == sum(r["schema_valid"] for r in recs)
    assert all(r["schema_valid"] == (r["finish_reason"] == "stop") for r in recs)
    assert row["forced_share"] > 0.1
    assert "| valid | forced share |" in render_serve_report(result, [])
    rf = {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    assert schema_valid('{"name": "a", "age": 3, "tags": []}', rf) is True
    assert schema_valid('{"name": "a", "age": 300, "tags": []}', rf) is False
    assert schema_valid('{"name": "a"', rf) is False and schema_valid("x", {"type": "text"}) is None
