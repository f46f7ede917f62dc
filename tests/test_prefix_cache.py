"""Prefix caching: a request that shares a prefix with a finished (or running) one starts after it, exactly.

Greedy outputs with a hit equal those without (fp32 and bf16, the draft model's cache reused too); where rows are
exact (bf16 on CPU: every row through the row-by-row attention) a finished request's generated tokens are reusable
bit for bit as they stand, with no settling pass; elsewhere (fp32) only K/V computed as prompt rows is reused until
settling recomputes the rest;
entries live inside the KV budget and are evicted LRU; two requests sharing a prompt prefix compute it once; the
server reports cached tokens in usage, counters in /metrics and the hit rate in /v1/speculative/status.
"""
import httpx
import pytest
import torch
from model_cache import private_cache

from specdec.config import SpeculativeConfig
from specdec.engine import EngineConfig, LLMEngine, SchedulerConfig
from specdec.models.loader import load_model
from specdec.models.prefix_cache import PrefixCache, common_prefix
from specdec.models.runner import Span, forward_spans
from specdec.sampling_params import SamplingParams

DRAFT3 = SpeculativeConfig(method="draft", num_speculative_tokens=3, draft_p_min=0.0)   # chains of 3: no stop


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def pair(request, tiny_dirs, tmp_path_factory):
    with private_cache(tmp_path_factory):
        target = load_model(str(tiny_dirs["target"]), dtype=request.param, device="cpu", progress=False)
        draft = load_model(str(tiny_dirs["draft"]), dtype=request.param, device="cpu", progress=False)
    return target, draft


def _engine(pair, cache=True, **sched):
    target, draft = pair
    return LLMEngine(EngineConfig(target.model, target.tokenizer, draft.model, SchedulerConfig(**sched),
                     enable_prefix_caching=cache))


def _run(engine, prompts, n=16, spec=DRAFT3):
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    seqs = [engine.add_request(f"r{next(_rid)}", p, params, spec) for p in prompts]
    while not all(s.finished for s in seqs):
        assert all(o.error is None for o in engine.step())
    return seqs


_rid = iter(range(10**9))


def _ids(pair, text):
    return pair[0].tokenizer.encode(text)


def test_conversation_turns_equal_a_fresh_engine_and_reuse_the_history(pair):
    """Six turns, each resending the history (prompt + previous answers) plus a new message."""
    on, off = _engine(pair), _engine(pair, cache=False)
    prompt = _ids(pair, "def fibonacci(n): return a cached value of the sequence")
    previous_prompt, previous_answer = 0, []
    for turn in range(6):
        a, b = _run(on, [prompt])[0], _run(off, [prompt])[0]
        assert a.output_ids == b.output_ids, turn
        if turn == 0:
            assert a.stats.cached_tokens == 0
        elif on.runner.exact_rows:
            # the whole previous turn is reused at once but its last token (sampled after the last forward)
            assert a.stats.cached_tokens == previous_prompt + len(previous_answer) - 1
            assert not on.has_background_work() and on.settle() == 0
        elif turn % 2 == 1:
            # not settled: only the previous prompt's rows are reused (its answer's K/V came from decode rows)
            assert a.stats.cached_tokens == previous_prompt
        else:
            # settled while idle: the whole previous turn (prompt + answer) is reused
            assert a.stats.cached_tokens == previous_prompt + len(previous_answer)
        assert b.stats.cached_tokens == 0
        if turn % 2 == 1:
            while on.settle():
                pass
        previous_prompt, previous_answer = len(prompt), a.output_ids
        prompt = prompt + a.output_ids + _ids(pair, f" and then turn {turn} asks more")
    stats = on.prefix_cache_stats()
    assert stats["hits"] > 0 and stats["queries"] > stats["hits"] and off.prefix_cache_stats() == {"enabled": False}
    # superseded entries are dropped: one conversation leaves one entry
    assert stats["entries"] == 1
    assert on.kv.num_seqs == 0 and on.proposers["draft"].kv.num_seqs == 0


@pytest.mark.parametrize("method", ["eagle3", "medusa"])
def test_learned_heads_resume_from_an_entry_and_draft_every_step(pair, method):
    """A head reads the target's hidden states at every prompt position; an entry keeps EAGLE's own cache rows (fed
    with those states) in their place, so a conversation's next turn resumes there and the head drafts from its
    first step; Medusa needs only the last row's state. Outputs equal a fresh engine's."""
    from test_heads import _eagle3, _medusa

    target = pair[0].model
    dtype = target.embed_tokens.weight.dtype
    make = (lambda: _eagle3(target).to(dtype)) if method == "eagle3" else (lambda: _medusa(target).to(dtype))
    on, off = (LLMEngine(EngineConfig(target, pair[0].tokenizer, heads={method: make()}, enable_prefix_caching=cache))
               for cache in (True, False))
    spec = SpeculativeConfig(method=method, num_speculative_tokens=3)
    prompt = _ids(pair, "class Stack: push and pop items in order, then peek at the top one")
    for turn in range(4):
        a, b = _run(on, [prompt], spec=spec)[0], _run(off, [prompt], spec=spec)[0]
        assert a.output_ids == b.output_ids, turn
        assert (a.stats.cached_tokens > 0) == (turn > 0)
        # the head drafted on every step it did without the cache (a head that lost its rows drafts nothing)
        assert a.stats.drafted_per_position == b.stats.drafted_per_position and b.stats.draft_steps > 10
        if turn == 1:
            while on.settle():
                pass
        prompt = prompt + a.output_ids + _ids(pair, f" then turn {turn} asks")
    assert on.prefix_cache_stats()["hits"] > 0


@pytest.mark.parametrize("spec", [SpeculativeConfig(), DRAFT3], ids=["plain", "draft"])
def test_an_answer_holds_the_same_kv_as_a_fresh_prefill_of_it(tiny_dirs, spec):
    """bf16 on CPU (the shipped path) is batch-invariant and every row takes the row-by-row attention: a token's K/V
    is the same whether a one-token step, a verification row or a prompt chunk of any size computed it. So a
    finished request's entry -- its answer's K/V from decode steps or verification rows -- equals a fresh prefill
    of prompt + answer bit for bit, however the prefill is chunked, with no settling pass. (fp32's GEMMs change
    rounding with the row count; there the conversation test checks greedy parity after settling.)"""
    target = load_model(str(tiny_dirs["target"]), dtype="bfloat16", device="cpu", progress=False)
    draft = load_model(str(tiny_dirs["draft"]), dtype="bfloat16", device="cpu", progress=False)
    # drafting with the target itself: every draft is accepted, so the answer's K/V comes from verification rows
    pair = (target, target if spec.method == "draft" else draft)
    engine = _engine(pair)
    assert engine.runner.exact_rows
    seq = _run(engine, [_ids(pair, "class Cache:\n    def rollback(self, n):")], n=40, spec=spec)[0]
    (entry,) = engine.kv.prefix.entries.values()
    n = len(seq.token_ids) - 1                      # the last token was sampled after the last forward
    assert entry.exact == n and len(entry.tokens) == n + 1 and not engine.has_background_work()
    if spec.method == "draft":
        assert seq.stats.accepted_tokens == sum(seq.stats.drafted_per_position) >= 20
    for cuts in ((n,), (5, 20, n - 25), (1,) * 7 + (n - 7,)):
        fresh, start = engine.kv.ensure(-7, n + 1), 0
        for c in cuts:
            forward_spans(target.model, [Span(fresh, start, seq.token_ids[start:start + c], "none", decode=True)])
            start += c
        assert torch.equal(entry.kv.k[:, :, :n], fresh.k[:, :, :n])
        assert torch.equal(entry.kv.v[:, :, :n], fresh.v[:, :, :n])
        engine.kv.free_seq(-7)


def test_a_shared_system_prompt_is_computed_once_in_a_batch(pair):
    system = _ids(pair, "You are a careful assistant. Answer in Python. " * 2)
    assert len(system) >= 80                                     # above SHARE_MIN
    prompts = [system + _ids(pair, q) for q in ("Reverse a list", "Sum a dict", "Parse a date", "Sort words")]
    off = _run(_engine(pair, cache=False, max_num_seqs=4), prompts)
    engine = _engine(pair, max_num_seqs=4)
    on = _run(engine, prompts)
    assert [s.output_ids for s in on] == [s.output_ids for s in off]
    # the first computes the shared part; the others wait for it and copy it (no cache entry existed yet)
    assert sorted(s.stats.cached_tokens for s in on)[1:] == [len(system)] * 3
    stats = engine.prefix_cache_stats()
    computed = stats["queries"] - stats["hits"]
    assert computed == sum(len(p) - 1 for p in prompts) - 3 * len(system)


def test_entries_live_inside_the_budget_and_are_evicted_lru(pair):
    target, _ = pair
    block = target.model.key_block
    engine = _engine(pair, max_total_tokens=max(96, 3 * block))
    prompts = [_ids(pair, f"{word} " * 6) for word in ("alpha", "beta", "gamma", "delta", "kappa", "omega")]
    for p in prompts:
        _run(engine, [p], n=8, spec=SpeculativeConfig())
        assert engine.kv.allocated <= engine.kv.max_total_tokens
        assert engine.kv.allocated == engine.kv.prefix.capacity
    kept = [e.tokens.tolist() for e in engine.kv.prefix.entries.values()]
    assert 0 < len(kept) < len(prompts)
    assert kept[-1][:len(prompts[-1])] == prompts[-1]             # the newest stays, the oldest went first
    assert all(k[:len(prompts[0])] != prompts[0] for k in kept)
    # a request that needs the whole budget evicts every entry and still runs
    big = _ids(pair, "zeta " * 8)
    _run(engine, [big], n=max(96, 3 * block) - len(big) - 8, spec=SpeculativeConfig())
    assert engine.kv.allocated <= engine.kv.max_total_tokens


def test_abort_keeps_a_usable_entry_and_failure_keeps_none(pair):
    engine = _engine(pair)
    prompt = _ids(pair, "def add(a, b):\n    return a + b\n")
    engine.add_request("a", prompt, SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True), DRAFT3)
    for _ in range(3):
        engine.step()
    engine.abort("a")
    assert len(engine.kv.prefix) == 1 and engine.kv.num_seqs == 0
    again = _run(engine, [prompt + _ids(pair, " more")])[0]
    assert again.stats.cached_tokens == len(prompt)
    engine.reset_prefix_cache()
    assert len(engine.kv.prefix) == 0 and engine.kv.allocated == 0


def test_common_prefix_and_lookup_limits():
    import numpy as np

    a, b = np.array([1, 2, 3, 4]), np.array([1, 2, 9])
    assert common_prefix(a, b) == 2 and common_prefix(a, a) == 4 and common_prefix(a, np.array([])) == 0
    assert PrefixCache().lookup([1, 2, 3], 2) is None


def test_server_reports_cached_tokens_and_hit_rate(tiny_dirs):
    from server_utils import running_server

    from specdec import LLM

    llm = LLM(target=str(tiny_dirs["target"]), dtype="float32", progress=False)
    with running_server(llm, SpeculativeConfig(method="none")) as (url, state):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Write a cache class " * 8}],
                "max_tokens": 8, "temperature": 0}
        first = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        body["messages"] += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                             {"role": "user", "content": "Now add eviction."}]
        second = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert 0 < cached < second["usage"]["prompt_tokens"]
        status = httpx.get(url + "/v1/speculative/status", timeout=10).json()["prefix_cache"]
        assert status["enabled"] and status["hits"] >= cached and 0 < status["hit_rate"] < 1
        metrics = httpx.get(url + "/metrics", timeout=10).text
        hits = next(line for line in metrics.splitlines() if line.startswith("specdec:prefix_cache_hits_total"))
        assert float(hits.split()[-1]) >= cached
        assert "specdec:prefix_cache_queries_total" in metrics
