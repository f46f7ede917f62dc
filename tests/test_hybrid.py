"""The hybrid method: per step the step controller weighs the longest prompt-lookup or suffix match against the
draft model; greedy output stays plain decoding's, and the match it is offered is the longest of the two."""
from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.errors import SpecDecError
from specdec.policy import CostModel
from specdec.proposers.registry import get_method


@pytest.fixture(scope="module")
def llm(tiny_dirs, tmp_path_factory):
    from model_cache import private_cache

    with private_cache(tmp_path_factory):
        llm = LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="float32", device="cpu",
                  progress=False)
    # A fixed cost model: the measured one times sub-millisecond tiny-model steps, and where the draft's step and a
    # lookup's come out close the controller's choice between them (asserted below) would follow the machine's load.
    llm.policy(cost=CostModel(draft_step=0.2, verify=[1.0] * 9, lookup=0.02))
    return llm


def test_hybrid_is_declared_and_runs_where_its_draft_model_is_loaded(llm, tiny_dirs, tmp_path_factory):
    m = get_method("hybrid")
    assert m.combines == ("draft", "ngram", "suffix") and m.needs == "draft_model" and not m.auto_candidate
    assert "hybrid" in llm.method_names()
    from model_cache import private_cache

    with private_cache(tmp_path_factory):
        alone = LLM(target=str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False)
    assert "hybrid" not in alone.method_names()
    with pytest.raises(SpecDecError, match="needs a draft model"):
        alone.generate("def f(x):", SamplingParams(max_tokens=4), spec="hybrid")


def test_hybrid_keeps_greedy_parity(llm):
    """A prompt that repeats itself (lookup has matches to offer): output is plain decoding's, and the draft model
    drafted at some steps."""
    block = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    ids = llm.encode(block * 3 + "def add(a, b):", chat=False)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = llm.generate(ids, params, spec="none")[0].token_ids
    out = llm.generate(ids, params, spec=SpeculativeConfig("hybrid", 4))[0]
    assert out.token_ids == plain
    assert out.stats.method == "hybrid" and out.stats.draft_tokens > 0
    assert out.stats.draft_steps > out.stats.lookup_steps


def test_hybrid_is_offered_the_longest_match_of_lookup_and_suffix(llm):
    """The step controller's guess: prompt lookup's n-gram match or the suffix pool's, whichever is longer."""
    engine = llm.engine
    pool_out = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    engine.proposers["suffix"].learn("p", [], [40, 41, 42] + pool_out)
    seq = engine.add_request("h", [40, 41, 42, 50, 51, 52, 40, 41, 42], SamplingParams(max_tokens=4),
                             SpeculativeConfig("hybrid", 4), pool="p")
    try:
        n, guess = seq.spec.controller.guess([50, 51, 52, 40, 41, 42], 6, None)
        assert n >= 3 and guess == pool_out[:6]            # the pool continues 40 41 42 further than the prompt
        n, guess = seq.spec.controller.guess([1, 2, 3, 4, 1, 2, 3], 3, None)
        assert guess == [4, 1, 2]                           # no pool match: prompt lookup's
    finally:
        engine.abort("h")


def test_hybrid_drafts_through_the_step_choice_proposer(llm):
    """One drafting path: auto's and hybrid's requests draft through the step-choice proposer, which asks the
    request's controller before each step and tells it how every step it planned went."""
    from specdec.proposers.step_choice import StepChoiceProposer

    engine = llm.engine
    drafter = engine.drafting.drafter_of("hybrid")
    assert isinstance(drafter, StepChoiceProposer) and engine.drafting.drafter_of("auto") is drafter
    assert engine.drafting.drafter_of("draft") is engine.proposers["draft"]
    block = "def add(a, b):\n    return a + b\n\n"
    ids = llm.encode(block * 3 + "def add(a, b):", chat=False)
    seq = engine.add_request("one-path", ids, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
                             SpeculativeConfig("hybrid", 4))
    ctl, calls = seq.spec.controller, {"choose": 0, "observe": 0}
    choose, observe = ctl.choose_step, ctl.observe_step

    def counted_choose(*a):
        calls["choose"] += 1
        return choose(*a)

    def counted_observe(*a):
        calls["observe"] += 1
        return observe(*a)

    ctl.choose_step, ctl.observe_step = counted_choose, counted_observe
    while not seq.finished:
        assert all(out.error is None for out in engine.step())
    assert calls["choose"] > 0 and calls["observe"] == seq.stats.target_forwards
