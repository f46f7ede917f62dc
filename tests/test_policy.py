"""The speculation policy: cost model and choice as pure functions, adaptive k, pools with fallback, rollout."""
import dataclasses
import math
import os

import pytest

from specdec.policy import CostModel, PolicyConfig, RequestFeatures, choose, expected_speedup, expected_tokens
from specdec.policy.cost_model import best_k
from specdec.policy.decide import LOOKUP, MODEL, StepController, effective_alpha, steps_alpha
from specdec.policy.pools import SpeculationPolicy, rollout_arm, size_class

# Shaped like this CPU: verifying 9 tokens costs 1.16 steps; a draft step 0.4 of a target step.
CPU = CostModel(draft_step=0.4, verify=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16], lookup=0.01)
# Shaped like a compute-bound device: every verified token costs nearly a step.
FLAT = CostModel(draft_step=0.4, verify=[1.0 + 0.5 * i for i in range(9)])


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(0.8, 0) == 1.0
    assert expected_speedup("draft", 0.8, 4, CPU) == pytest.approx(expected_tokens(0.8, 4) / (4 * 0.4 + 1.08))
    assert expected_speedup("ngram", 0.8, 4, CPU) == pytest.approx(expected_tokens(0.8, 4) / (1.08 + 0.01))
    assert CPU.V(12) == pytest.approx(1.16 + 0.02 * 3)          # linear extrapolation past the measured range
    for a in (0.1, 0.5, 0.9):
        assert effective_alpha(expected_tokens(a, 6), 6) == pytest.approx(a, abs=1e-6)


@pytest.mark.parametrize("features, alphas, cost, expect", [
    # high acceptance on a bandwidth-bound machine: draft, larger k than at moderate acceptance
    (RequestFeatures(max_tokens=256), {"draft": 0.9, "ngram": 0.05}, CPU, ("draft", 4)),
    (RequestFeatures(max_tokens=256), {"draft": 0.6, "ngram": 0.05}, CPU, ("draft", 1)),
    # high temperature with the low acceptance it brings: plain decoding
    (RequestFeatures(temperature=1.2, max_tokens=256), {"draft": 0.3, "ngram": 0.02}, CPU, ("none", 0)),
    # short outputs: plain, whatever the acceptance
    (RequestFeatures(max_tokens=8), {"draft": 0.95, "ngram": 0.9}, CPU, ("none", 0)),
    # high load: plain
    (RequestFeatures(max_tokens=256, load=9), {"draft": 0.95, "ngram": 0.9}, CPU, ("none", 0)),
    # copy-heavy prompts but a draft that pays too: lookup first, the draft when the request's own steps say it pays
    (RequestFeatures(max_tokens=256), {"draft": 0.7, "ngram": 0.8}, CPU, ("ngram", 8)),
    # a useless draft, copy-heavy prompts: n-gram with a long draft (free to propose, cheap to verify)
    (RequestFeatures(max_tokens=256), {"draft": 0.2, "ngram": 0.8}, CPU, ("ngram", 8)),
    # compute-bound verification: only very high acceptance pays, with a short draft
    (RequestFeatures(max_tokens=256), {"draft": 0.7, "ngram": 0.3}, FLAT, ("none", 0)),
    (RequestFeatures(max_tokens=256), {"draft": 0.3, "ngram": 0.97}, FLAT,
     ("ngram", best_k("ngram", 0.97, FLAT, 8)[0])),
])
def test_choice_table(features, alphas, cost, expect):
    d = choose(features, alphas, cost, PolicyConfig())
    assert (d.method, d.k) == expect, d.reason
    assert d.reason
    if d.method != "none":
        assert d.expected_speedup >= PolicyConfig().min_speedup
        assert d.expected_speedup == pytest.approx(expected_speedup(d.method, alphas[d.method], d.k, cost))


def test_flat_costs_need_shorter_drafts():
    assert best_k("draft", 0.9, FLAT, 8)[0] < best_k("draft", 0.9, CPU, 8)[0]


def test_larger_alpha_means_larger_k():
    ks = [best_k("draft", a, CPU, 8)[0] for a in (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)]
    assert ks == sorted(ks) and ks[0] < ks[-1]


def test_step_controller_adapts_k_within_a_request():
    ctl = StepController("draft", 4, 0.9, CPU, PolicyConfig())
    assert ctl.plan(0, 0) == ("model", 4)
    for _ in range(6):                       # everything rejected: k shrinks to 0 (plain steps)
        ctl.observe("draft", ctl.k or 1, 0)
    assert ctl.k == 0 and ctl.plan(0, 0) == ("model", 0)
    good = StepController("draft", 1, 0.6, CPU, PolicyConfig())
    for _ in range(20):                      # everything accepted: k grows
        good.observe("draft", max(good.k, 1), max(good.k, 1))
    assert good.k >= 4


def test_a_lone_draft_chain_under_p_min_gets_the_room():
    """With draft_p_min the draft model ends its own chain where it is unsure, so a lone sequence's step that drafts
    with it is given the whole room; the plan's k stays the length without the stop, in a batch (its budget counted
    the planned rows for the other sequences), for a plain step, and for a head."""
    from specdec.policy.cost_model import StepBudget

    ids = list(range(40))
    ctl = StepController("draft", 2, 0.7, CPU, PolicyConfig())
    planned = ctl.choose_step(ids, 8, None, None)
    assert planned[0] == "draft" and 0 < planned[1] < 8
    assert ctl.choose_step(ids, 8, None, None, p_min=0.75) == ("draft", 8, None)
    assert ctl.choose_step(ids, 8, None, StepBudget(CPU), p_min=0.75) == ("draft", 8, None)
    batch = StepBudget(CPU, rows=3, tokens=3.0)
    assert ctl.choose_step(ids, 8, None, batch, p_min=0.75)[1] < 8
    hopeless = StepController("draft", 2, 0.01, CPU, PolicyConfig())
    assert hopeless.choose_step(ids, 8, None, None, p_min=0.75) == ("draft", 0, None)
    head = StepController("eagle3", 2, 0.7, dataclasses.replace(CPU, heads={"eagle3": (0.05, 0.05)}), PolicyConfig())
    assert head.choose_step(ids, 8, None, None, p_min=0.75)[1] < 8


def test_a_requests_alpha_prices_each_step_at_its_own_k():
    # steps of 3 and 4 drafts, as a controller alternates them: the α that reproduces their tokens with each step
    # at its own k, not at one k for the rounded mean (which moved by 0.05-0.09 as the mean crossed 3.5)
    assert steps_alpha(sum(expected_tokens(0.85, k) for k in (3, 4, 4)), {3: 1, 4: 2}) == pytest.approx(0.85,
                                                                                                        abs=1e-6)
    mixed = 2 * expected_tokens(0.6, 1) + expected_tokens(0.6, 6)
    assert steps_alpha(mixed, {1: 2, 6: 1}) == pytest.approx(0.6, abs=1e-6)
    assert effective_alpha(mixed / 3, round((2 * 1 + 6) / 3)) != pytest.approx(0.6, abs=0.02)   # the rounded mean's
    assert steps_alpha(2.0, {2: 2}) == pytest.approx(0.0, abs=1e-6)             # nothing accepted
    assert steps_alpha(99.0, {2: 1, 3: 1}) == pytest.approx(1.0, abs=1e-6)      # everything, and more, accepted
    cfg = PolicyConfig(prior_alpha={"draft": 0.85})
    ctl = StepController("draft", 4, 0.85, CPU, cfg)
    seen = []
    for k, acc in [(3, 3), (3, 1), (4, 4), (3, 3), (4, 3), (3, 2), (4, 4), (4, 4), (3, 3), (4, 3)]:
        ctl.observe("draft", k, acc)
        seen.append(ctl.alpha)
    steps = [b - a for a, b in zip(seen, seen[1:])]
    # one more step moves the blended α by what it adds, never by the mean draft length crossing a rounding
    assert max(abs(s) for s in steps[4:]) < 0.03, seen
    own = steps_alpha(10 + 30, {3: 5, 4: 5})
    assert ctl.alpha == pytest.approx((0.85 * ctl.prior_steps + own * 10) / (ctl.prior_steps + 10))


def test_step_controller_takes_lookup_where_it_beats_the_draft():
    ctl = StepController("draft", 4, 0.9, CPU, PolicyConfig())
    # before any record: a lookup guess is worth less than a good draft
    assert ctl.plan(4, 8)[0] == "model"
    # shadow record: long matches' guesses agreed with what the target committed; single-token matches did not
    for _ in range(6):
        ctl.observe("draft", 4, 4, n=4, lookup_len=8, lookup_matched=4)
        ctl.observe("draft", 4, 4, n=1, lookup_len=8, lookup_matched=0)
    assert ctl.plan(4, 8)[0] == "lookup"     # copying: verify the guess, no draft steps spent
    assert ctl.plan(1, 8) == ("model", ctl.k)
    assert ctl.plan(0, 0) == ("model", ctl.k)
    # verified lookup steps update the record the same way: a run of rejections sends the steps back to the draft
    for _ in range(12):
        ctl.observe("lookup", 8, 0, n=4, lookup_len=8, lookup_matched=0)
    assert ctl.plan(4, 8)[0] == "model" and ctl.lookup_steps == 12
    # without a useful draft (k = 0) any guess beats a plain step on a machine where verification is free
    lone = StepController("ngram", 0, 0.3, CPU, PolicyConfig())
    assert lone.plan(1, 3)[0] == "lookup" and lone.plan(0, 0) == ("model", 0)


def test_a_guess_is_charged_only_for_the_tokens_put_to_the_test():
    """A lookup guess verified 2 tokens deep says nothing of its other 6: charged for all 8, guesses that always
    held kept α low and the plan at 1 token a step (the measured costs of a Zen 4 machine at 256 tokens: every
    verification row costs ~0.15 of a step)."""
    zen4 = CostModel(draft_step=0.31, verify=[1.0, 1.15, 1.31, 1.46, 1.65, 2.23, 2.23, 2.74, 2.74], lookup=0.005)
    copy = list(range(100, 108))
    ctl = StepController("draft", 2, 0.35, zen4, PolicyConfig(), guesser=lambda ids, room, c: (24, copy[:room]))
    ks = []
    for _ in range(8):
        source, k, guess = ctl.choose_step([0] * 40, 8, None, None)
        assert source == "ngram"
        ks.append(k)
        ctl.observe_step(k, k, copy[:k + 1])       # every verified token held, and the bonus token went on
    assert ks[0] <= 2 and ks[-1] >= 4, ks
    # shadowed by a draft step: the guess is compared with the tokens that step committed, no further
    shadow = StepController("draft", 4, 0.9, zen4, PolicyConfig(), guesser=lambda ids, room, c: (1, copy[:room]))
    shadow.choose_step([0] * 40, 8, None, None)
    shadow.observe_step(4, 1, copy[:2])             # the draft's step committed 2 tokens; the guess agreed on both
    assert shadow.by_n[1] == [1.0, 1.0, 1.0, 1.0] and shadow.lookup_proposed == 2   # held, then held again


@pytest.mark.parametrize("copies", [True, False])
def test_a_copys_later_tokens_are_priced_apart_from_its_first(copies):
    """Guesses from 1-token matches (long retrieval prompts): the first token holds 1 time in 3. Where the copy
    then goes on (the bonus token agrees with the guess), verifying 4 pays although one α for every token would
    verify 1; where it stops after the first token, 1 stays the best. Rows cost 0.075 of a step each, as at 2k tokens
    of context on the 2-core machines."""
    long = CostModel(draft_step=0.5, verify=[1.0, 1.08, 1.15, 1.22, 1.3, 1.37, 1.45, 1.52, 1.6], lookup=0.01)
    copy = list(range(100, 108))
    ctl = StepController("ngram", 0, 0.3, long, PolicyConfig(), lookup_alpha=0.3,
                         guesser=lambda ids, room, c: (1, copy[:room]))
    for i in range(20):
        source, k, guess = ctl.choose_step([0] * 2000, 8, None, None)
        assert source == "ngram" and guess == copy[:k]
        held = i % 3 == 2
        after = copy[:k + 1] if copies else copy[:k] + [7]         # the target's tokens: the guess's, or not past k
        ctl.observe_step(k, k if held else 0, after if held else [7])
    first, rest = ctl.lookup_acceptance(1)
    assert 0.2 < first < 0.45
    assert (rest > 0.8) if copies else (rest < 0.2)
    # one α for every token, a record of guesses verified 1 deep: the first token's odds
    assert best_k("ngram", first, long, 8)[0] == 1
    source, k = ctl.plan(1, 8)
    assert source == LOOKUP and (k >= 4 if copies else k == 1), k


class _Stats:
    """What the pool reads from a RequestStats: every decode forward verified a draft."""
    def __init__(self, drafted, accepted, steps, e2e=2.0, ttft=0.1):
        self.draft_tokens, self.accepted_tokens, self.draft_steps = drafted, accepted, steps
        self.target_forwards = steps
        self.completion_tokens = 1 + steps + accepted
        self.e2e_s, self.ttft_s = e2e, ttft
        self.prompt_tokens = 0


def test_pool_falls_back_warns_once_and_probes(caplog):
    changes = []
    pol = SpeculationPolicy(CPU, PolicyConfig(probe_fraction=0.2), ("draft",),
                            on_pool_change=lambda name, on: changes.append((name, on)))
    f = RequestFeatures(max_tokens=128)
    d = pol.decide("r0", "code", f)
    assert d.method == "draft"                      # the prior says it pays
    with caplog.at_level("WARNING", logger="specdec.policy"):
        pol.record("code", d, 0.0, _Stats(drafted=40, accepted=2, steps=10))
        pol.record("code", d, 0.0, _Stats(drafted=40, accepted=2, steps=10))
    assert not pol.pools["code"].enabled and changes[-1] == ("code", False)
    assert sum("falls back" in r.message for r in caplog.records) == 1
    decisions = [pol.decide(f"r{i}", "code", f) for i in range(1, 201)]
    probes = [x for x in decisions if x.probe]
    assert all(x.method == "none" for x in decisions if not x.probe)
    assert 20 <= len(probes) <= 60                  # ~20% probes
    assert pol.pools["other"].enabled if pol.pool("other") else True   # pools are independent
    for p in probes[:3]:                            # good probes re-enable it
        pol.record("code", p, 0.0, _Stats(drafted=40, accepted=38, steps=10))
    assert pol.pools["code"].enabled and changes[-1] == ("code", True)
    assert pol.decide("r-next", "code", f).method == "draft"
    st = pol.status()["pools"]
    assert {p["pool"] for p in st} == {"code", "other"} and all("acceptance" in p for p in st)


def test_draft_is_explored_and_lookup_is_scored_for_free():
    pol = SpeculationPolicy(CPU, PolicyConfig(), ("ngram", "draft"))
    f = RequestFeatures(max_tokens=128)
    first = pol.decide("a", "edit", f)
    assert first.method == "draft" and first.explore and first.alpha == pol.cfg.prior_alpha["draft"]
    # the request: the draft's tokens are all rejected, lookup's guesses (verified or shadowed) mostly agree
    ctl = pol.controller(first, "edit", 0.0)
    for _ in range(12):
        source, k = ctl.plan(4, 8)
        ctl.observe(source, k, 0 if source == "model" else 6, n=4, lookup_len=8, lookup_matched=6)
    assert ctl.lookup_steps > 0 and ctl.steps > 0
    pol.record("edit", first, 0.0, _Stats(drafted=40, accepted=20, steps=12), ctl)
    pool = pol.pools["edit"]
    assert pool.count("ngram") == 1 and pool.count("draft") == 1
    lookup = next(o for o in pool.observations() if o.method == "ngram")
    assert (lookup.steps, lookup.forwards, lookup.k) == (12, 12, 8)    # every guess counted once, as tested
    assert pool.alpha("ngram", "greedy") > 0.7 > 0.3 > pool.alpha("draft", "greedy")
    # one rejected draft step (2 token slots) lowers the draft's estimate from its prior, weighed by that evidence
    # (PolicyConfig.prior_tokens), without ruling it out: it runs beside lookup, which takes the steps it wins
    prior = pol.cfg.prior_alpha["draft"]
    drafted = pool.estimate("draft", "greedy", prior, pol.cfg.prior_tokens)
    assert 0.0 < drafted < prior
    second = pol.decide("b", "edit", f)
    # lookup pays on this pool: the next request starts on it, with the draft (at its pool α) to move to
    assert second.method == "ngram" and "observed" in second.reason and "exploring" not in second.reason
    ctl = pol.controller(second, "edit", 0.0, max_tokens=128)
    assert ctl.lookup_prior and ctl.k == 0 and ctl.fallback[0] == "draft"
    assert ctl.fallback[1] == pytest.approx(drafted)              # the next request starts from the pool's record
    # the evidence grows: after rejected draft steps over 80 more slots, lookup alone is the pool's choice
    for _ in range(2):
        pol.record("edit", first, 0.0, _Stats(drafted=40, accepted=0, steps=10))
    third = pol.decide("c", "edit", f)
    assert third.method == "ngram" and "observed" in third.reason and "the matches first" not in third.reason
    # a new temperature bucket borrows the greedy bucket's estimates (lowered) instead of exploring again
    hot = pol.decide("d", "edit", RequestFeatures(temperature=1.0, max_tokens=128))
    assert hot.method == "ngram" and "exploring" not in hot.reason
    assert hot.alpha < pool.estimate("ngram", "greedy", pol.cfg.prior_alpha["ngram"], pol.cfg.prior_tokens)
    # where the prior says the draft cannot pay, it still gets one request per pool to show it
    flat = SpeculationPolicy(FLAT, PolicyConfig(), ("ngram", "draft"))
    first = flat.decide("a", "copy", f)
    assert first.method == "draft" and "exploring" in first.reason
    # short outputs never explore
    assert pol.decide("e", "fresh", RequestFeatures(max_tokens=4)).method == "none"


@pytest.mark.parametrize("pair_margin", [1.1, math.inf])
def test_lookups_record_is_read_from_prompts_of_the_requests_size(pair_margin):
    # one pool: edits of ~150-token prompts that lookup copies, then an instruction of ~50 tokens with nothing to copy
    pol = SpeculationPolicy(CPU, PolicyConfig(pair_margin=pair_margin), ("ngram", "draft"))
    assert [size_class(n) for n in (0, 1, 47, 63, 64, 150, 2000)] == [0, 1, 6, 6, 7, 8, 11]

    def run(rid, prompt, matched, draft_acc):    # matched: how many of each guess's 8 tokens held, step by step
        d = pol.decide(rid, "chat", RequestFeatures(max_tokens=128, context=prompt))
        ctl = pol.controller(d, "chat", 0.0, prompt, max_tokens=128)
        for i in range(12):
            m = matched[i % len(matched)]
            source, k = ctl.plan(4, 8)
            ctl.observe(source, k, min(k, m) if source == "lookup" else min(k, draft_acc), n=4, lookup_len=8,
                        lookup_matched=m)
        pol.record("chat", d, 0.0, _Stats(drafted=40, accepted=30, steps=12), ctl)
        return d

    assert run("e1", 150, [7], 3).explore                  # the draft's first try in the pool
    edit = run("e2", 150, [7], 3)
    assert edit.method == "ngram" and "the matches first" in edit.reason
    pool = pol.pools["chat"]
    # a smaller prompt than any seen borrows the nearest size's record: as one pooled record did
    first = pol.decide("g1", "chat", RequestFeatures(max_tokens=128, context=50))
    assert first.method == "ngram" and first.alpha == pytest.approx(
        pool.estimate("ngram", "greedy", pol.cfg.prior_alpha["ngram"], pol.cfg.prior_tokens, size_class(150)))
    run("g1", 50, [0, 0, 1], 3)                            # lookup had little to offer an instruction
    gen = pol.decide("g2", "chat", RequestFeatures(max_tokens=128, context=47))
    # lookup alone is still expected to pay a little, but the draft by more than the margin that would move the
    # request to it after its first steps: the pair from the first step, lookup beside the draft
    alone = pool.estimate("ngram", "greedy", pol.cfg.prior_alpha["ngram"], pol.cfg.prior_tokens, size_class(47))
    assert best_k("ngram", alone, CPU, 8)[1] > pol.cfg.min_speedup
    if pair_margin == math.inf:                            # as it was: the matches first wherever they pay
        assert gen.method == "ngram" and "the matches first" in gen.reason
        return
    assert gen.method == "draft" and gen.alpha > 0.7 and "alone it is expected" in gen.reason
    assert pool.alpha("ngram", "greedy", size=size_class(47)) < 0.4 < 0.6 < pool.alpha("ngram", "greedy",
                                                                                           size=size_class(150))
    ctl = pol.controller(gen, "chat", 0.0, 47, max_tokens=128)
    assert ctl.lookup_prior == pool.lookup_prior("greedy", size_class(47)) != pool.lookup_prior("greedy")
    # the edits' size still reads their own record
    assert pol.decide("e3", "chat", RequestFeatures(max_tokens=128, context=140)).method == "ngram"


def test_an_exploring_request_drafts_with_the_model_even_where_lookup_or_the_prior_would_not():
    # FLAT prices the draft out at any k, and lookup's guesses here are long and right: re-planned each step, the
    # draft would never run, the pool would never see it and would explore it again on every request
    pol = SpeculationPolicy(FLAT, PolicyConfig(), ("ngram", "draft"))
    f = RequestFeatures(max_tokens=128)
    first = pol.decide("a", "copy", f)
    assert first.explore and first.method == "draft" and first.k >= 1
    ctl = pol.controller(first, "copy", 0.0)
    sources = []
    for _ in range(10):
        source, k = ctl.plan(4, 8)
        sources.append(source)
        ctl.observe(source, k, k if source == "model" else 8, n=4, lookup_len=8, lookup_matched=8)
    explored = StepController.explore_steps
    assert sources[:explored] == ["model"] * explored
    assert ctl.steps == explored and "lookup" in sources[explored:]     # then the plan is the cost model's again
    pol.record("copy", first, 0.0, _Stats(drafted=4, accepted=4, steps=explored), ctl)
    assert pol.pools["copy"].count("draft") == 1
    assert not pol.decide("b", "copy", f).explore                      # explored once, not again


def test_rollout_fraction_split_and_stability():
    n, frac = 4000, 0.3
    arms = [rollout_arm(f"req-{i}", frac) for i in range(n)]
    share = arms.count("spec") / n
    assert abs(share - frac) < 4 * math.sqrt(frac * (1 - frac) / n)      # binomial tolerance
    assert arms == [rollout_arm(f"req-{i}", frac) for i in range(n)]     # stable per request id
    assert all(rollout_arm(f"x{i}", 1.0) == "spec" for i in range(100))
    assert all(rollout_arm(f"x{i}", 0.0) == "plain" for i in range(100))


def test_pool_with_useless_draft_falls_back_keeps_parity_and_recovers(tiny_dirs):
    """End to end on tiny models: a random draft is useless; the pool falls back within its window; every
    output stays the target's greedy output; when the draft is replaced by a good one, probes re-enable it."""
    from specdec import LLM, SamplingParams, SpeculativeConfig

    llm = LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="float32", device="cpu",
              speculative=SpeculativeConfig(method="auto"), progress=False)
    cost = CostModel(draft_step=0.1, verify=[1.0] * 9)       # speculation looks cheap: only acceptance decides
    llm.policy(PolicyConfig(probe_fraction=0.5), cost, available=("draft",))
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompts = [llm.encode(p) for p in ["def add(a, b):", "class Cache:", "The quick brown fox", "你好，世界"]]
    plain = {tuple(p): llm.generate(p, params, spec="none")[0].token_ids for p in prompts}
    pool = llm.policy().pool("p")
    methods = []
    # chains of the planned k: the random draft is never sure of a token, and with draft_p_min each of its chains
    # would stop after one, so its window of drafted tokens would fill over more requests than this test sends
    auto = SpeculativeConfig(method="auto", draft_p_min=0.0)
    for i in range(8):
        ids = prompts[i % len(prompts)]
        out = llm.generate(ids, params, spec=auto, pool="p", request_id=f"bad-{i}")[0]
        assert out.token_ids == plain[tuple(ids)]
        methods.append(out.stats.method)
        if not pool.enabled:
            break
    assert not pool.enabled and methods[0] == "draft"
    # a good draft returns (the target drafting for itself: acceptance 1)
    from specdec.models.kv_manager import KVManager
    from specdec.proposers import DraftModelProposer

    llm.engine.proposers["draft"] = DraftModelProposer(llm.target.model, llm.tokenizer.vocab_size,
                                                       KVManager(llm.target.model, 4096))
    for i in range(40):
        ids = prompts[i % len(prompts)]
        out = llm.generate(ids, params, spec="auto", pool="p", request_id=f"good-{i}")[0]
        assert out.token_ids == plain[tuple(ids)]
        if pool.enabled:
            break
    assert pool.enabled
    out = llm.generate(prompts[0], params, spec="auto", pool="p", request_id="after")[0]
    assert out.stats.method == "draft" and out.stats.acceptance_rate == 1.0 and "draft k=" in out.stats.policy_reason


def test_pool_is_not_judged_before_every_method_was_tried():
    pol = SpeculationPolicy(CPU, PolicyConfig(), ("ngram", "draft"))
    f = RequestFeatures(max_tokens=128)
    first = pol.decide("a", "chat", f)
    pol.record("chat", first, 0.0, _Stats(drafted=40, accepted=1, steps=10))      # a poor first method
    assert pol.pools["chat"].enabled
    second = pol.decide("b", "chat", f)
    assert second.method != first.method
    pol.record("chat", second, 0.0, _Stats(drafted=40, accepted=36, steps=10))    # the other one works
    assert pol.pools["chat"].enabled and pol.decide("c", "chat", f).method == second.method


def test_a_head_is_chosen_by_its_own_step_cost():
    """The head competes with the draft model on expected speedup, each priced by its own measured step cost."""
    cheap_head = CostModel(draft_step=0.4, verify=CPU.verify, lookup=0.01, heads={"eagle3": [0.08, 0.05]})
    alphas = {"draft": 0.8, "eagle3": 0.6, "ngram": 0.02}              # lookup does not pay: no free-first
    d = choose(RequestFeatures(max_tokens=256), alphas, cheap_head, PolicyConfig(), ("ngram", "draft", "eagle3"))
    s_head = best_k("eagle3", 0.6, cheap_head, 8)[1]
    s_draft = best_k("draft", 0.8, cheap_head, 8)[1]
    assert d.method == ("eagle3" if s_head > s_draft else "draft")
    assert d.method == "eagle3"                               # 0.6 at ~0.05 a token beats 0.8 at 0.4
    costly_head = CostModel(draft_step=0.4, verify=CPU.verify, lookup=0.01, heads={"eagle3": [0.6, 0.6]})
    assert choose(RequestFeatures(max_tokens=256), alphas, costly_head, PolicyConfig(),
                  ("ngram", "draft", "eagle3")).method == "draft"
    # the step controller drafts with the head it was given, priced as the head
    ctl = StepController("eagle3", 4, 0.6, cheap_head, PolicyConfig())
    assert ctl.model == "eagle3" and ctl.plan(0, 0)[0] == "model" and ctl.plan(0, 0)[1] > 0


def test_a_head_starts_a_request_in_place_of_the_draft_only_by_a_margin():
    """A head's estimate is its pool's α (every kind of prompt); the draft's becomes the request's own within a step
    or two. A head expected a little faster than the draft does not start the request; one expected well ahead
    does; PolicyConfig(head_margin=1.0) weighs them as equals."""
    cheap_head = CostModel(draft_step=0.4, verify=CPU.verify, lookup=0.01, heads={"eagle3": [0.08, 0.05]})
    s_draft = best_k("draft", 0.8, cheap_head, 8)[1]
    s_head = lambda a: best_k("eagle3", a, cheap_head, 8)[1]           # noqa: E731
    near = next(a / 100 for a in range(20, 100) if s_head(a / 100) > 1.03 * s_draft)
    far = next(a / 100 for a in range(20, 100) if s_head(a / 100) > 1.2 * s_draft)
    assert s_head(near) < 1.1 * s_draft
    methods, f = ("ngram", "draft", "eagle3"), RequestFeatures(max_tokens=256)
    alphas = lambda a: {"draft": 0.8, "eagle3": a, "ngram": 0.02}    # noqa: E731  (lookup does not pay)
    d = choose(f, alphas(near), cheap_head, PolicyConfig(), methods)
    assert d.method == "draft" and "eagle3 expected" in d.reason and "within 1.10x" in d.reason
    assert choose(f, alphas(near), cheap_head, PolicyConfig(head_margin=1.0), methods).method == "eagle3"
    assert choose(f, alphas(far), cheap_head, PolicyConfig(), methods).method == "eagle3"
    # without a draft model to weigh, the head runs
    assert choose(f, alphas(near), cheap_head, PolicyConfig(), ("ngram", "eagle3")).method == "eagle3"
    with pytest.raises(ValueError, match="head_margin"):
        PolicyConfig(head_margin=0)


def test_a_head_is_left_out_of_prompts_longer_than_it_was_trained_on():
    """max_context: a head that would win on a short prompt is not weighed past the context it was trained at (the
    next best method runs), nor explored there; a prompt with nothing left to weigh is gated."""
    cheap_head = CostModel(draft_step=0.4, verify=CPU.verify, lookup=0.01, heads={"eagle3": [0.08, 0.05]})
    alphas = {"draft": 0.8, "eagle3": 0.6, "ngram": 0.02}
    methods, limits = ("ngram", "draft", "eagle3"), {"eagle3": 1024}
    assert choose(RequestFeatures(max_tokens=256, context=1024), alphas, cheap_head, PolicyConfig(), methods,
                  limits).method == "eagle3"
    d = choose(RequestFeatures(max_tokens=256, context=1025), alphas, cheap_head, PolicyConfig(), methods, limits)
    assert d.method == "draft"
    alone = choose(RequestFeatures(max_tokens=256, context=2000), alphas, cheap_head, PolicyConfig(), ("eagle3",),
                   limits)
    # a head the cost model has no price for (a cost model given by hand) is not weighed, never a crash
    assert choose(RequestFeatures(max_tokens=256), alphas, CPU, PolicyConfig(), methods).method == "draft"
    assert alone.method == "none" and alone.gated and "trained on contexts up to 1024" in alone.reason
    # a fresh pool explores the head on short prompts only
    no_lookup = PolicyConfig(prior_alpha={**PolicyConfig().prior_alpha, "ngram": 0.02})    # lookup does not pay
    policy = SpeculationPolicy(cheap_head, no_lookup, methods, max_context=limits)
    first = policy.decide("r0", "p", RequestFeatures(max_tokens=256, context=3000))
    assert first.method == "draft"
    policy.record("p", first, 0.0, _Stats(drafted=40, accepted=32, steps=10))
    long = policy.decide("r1", "p", RequestFeatures(max_tokens=256, context=3000))
    assert long.method == "draft" and "exploring" not in long.reason
    short = policy.decide("r2", "p", RequestFeatures(max_tokens=256, context=300))
    assert short.method == "eagle3" and "observed" not in short.reason     # its first request: its prior or exploring


def test_a_head_is_timed_after_a_target_step_as_in_the_engine(tiny_dirs, monkeypatch):
    """The cost model times each of a head's proposals right after a target forward (the engine's order, which
    evicts the head's weights from the caches), never back to back; the forward itself is not timed."""
    from specdec import LLM
    from specdec.policy import measure

    llm = LLM(target=str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False)
    events = []

    class Head:
        target_hidden = (0,)

        def accept_hidden(self, seq_id, start, hidden):
            events.append("states")

        def propose(self, ctxs, ks):
            events.append(f"propose {ks[0]}")

        def release(self, seq_id):
            events.append("release")

    clock = iter(range(10_000))
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    real_step = measure.one_target_step

    def one_step(model, context):
        step = real_step(model, context)
        return lambda: (events.append("target"), [next(clock) for _ in range(100)], step())    # 100 ticks long
    monkeypatch.setattr(measure, "one_target_step", one_step)
    cost = measure.measure_cost_model(llm.target.model, k_max=4, context=16, repeats=2, heads={"eagle3": Head()})
    timed = [i for i, e in enumerate(events) if e.startswith("propose")][1:]     # the first feeds the prompt
    assert len(timed) == 2 * 3                                                   # (1 + repeats) x (1 and k tokens)
    assert all(events[i - 1] == "target" and events[i - 2] == "states" for i in timed)
    # each timed proposal took one clock tick: the target forward before it is outside the timing
    assert cost.target_step_s == 1 and cost.heads["eagle3"] == [1.0, 0.0]


def _auto_with_a_random_eagle3(tiny_dirs, tmp_path, monkeypatch):
    """An LLM of the tiny pair, method auto, with a random EAGLE-3 head saved for its target (trained context 512)."""
    from test_heads import _eagle3

    from specdec import LLM, SpeculativeConfig
    from specdec.models.heads import save_head, target_fingerprint

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    probe = LLM(target=str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False)
    save_head(_eagle3(probe.target.model), "eagle3", tmp_path / "e3",
              {"specdec_target_fingerprint": target_fingerprint(probe.target.model), "specdec_trained_context": 512})
    return LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="float32", device="cpu",
               progress=False, speculative=SpeculativeConfig(method="auto"), heads={"eagle3": str(tmp_path / "e3")})


def test_auto_runs_a_learned_head_with_parity(tiny_dirs, tmp_path, monkeypatch):
    """End to end: auto with a head loaded measures the head's step cost, picks the head, drafts with it (the
    head reads the target's states at every step, lookup steps included) and keeps the target's greedy output."""
    from specdec import SamplingParams

    llm = _auto_with_a_random_eagle3(tiny_dirs, tmp_path, monkeypatch)
    measured = llm.cost_model(4)
    assert set(measured.heads) == {"eagle3"} and all(x > 0 for x in measured.heads["eagle3"])
    cost = CostModel(draft_step=1.0, verify=[1.0] * 9, heads={"eagle3": [0.05, 0.05]})
    llm.policy(PolicyConfig(prior_alpha={"eagle3": 0.7, "ngram": 0.0}, min_acceptance=0.0), cost,
               available=("ngram", "eagle3"))      # a random head: the pool must not fall back mid-test
    assert llm.heads["eagle3"].trained_context == 512 and llm.policy().max_context == {"eagle3": 512}
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    ids = llm.encode("def add(a, b):")
    plain = llm.generate(ids, params, spec="none")[0].token_ids
    out = llm.generate(ids, params, spec="auto", pool="p", request_id="a0")[0]
    assert out.token_ids == plain
    assert out.stats.method == "eagle3" and out.stats.draft_tokens > 0
    assert llm.policy().pool("p").count("eagle3") == 1            # its acceptance went to the pool
    # a random head is rarely right: as its observed acceptance outweighs its prior (PolicyConfig.prior_tokens),
    # the policy turns speculation off; every request keeps the plain text
    runs = [out]
    while len(runs) < 16 and runs[-1].stats.method != "none":
        runs.append(llm.generate(ids, params, spec="auto", pool="p", request_id=f"a{len(runs)}")[0])
        assert runs[-1].token_ids == plain
    headed = [r.stats for r in runs if r.stats.method == "eagle3"]
    rate = sum(s.accepted_tokens for s in headed) / sum(s.draft_tokens for s in headed)
    assert (runs[-1].stats.method == "none") == (rate < 0.2)


BUCKETS = [{"context": 2048, "verify": [1.0, 1.20, 1.35, 1.50], "draft_step": 0.40, "target_step_s": 0.07},
           {"context": 4096, "verify": [1.0, 1.40, 1.60, 1.80], "draft_step": 0.50, "target_step_s": 0.08}]


def test_cost_model_by_context_interpolates_between_buckets_and_round_trips():
    cm = CostModel(draft_step=0.30, verify=[1.0, 1.05, 1.10, 1.15, 1.20], verify_large=[[10, 1.5]], context=256,
                   target_step_s=0.06, by_context=list(reversed(BUCKETS)) + [{"context": 128, "verify": [1, 9]}])
    assert cm.contexts() == [256, 2048, 4096]                     # sorted; a bucket below the short one dropped
    assert cm.at(100) is cm and cm.at(256) is cm
    long = cm.at(2048)
    assert long.verify[:4] == pytest.approx([1.0, 1.20, 1.35, 1.50]) and long.draft_step == pytest.approx(0.40)
    assert long.verify[4] == pytest.approx(1.50 + 0.05)          # past the long rows: the short context's growth
    mid = cm.at(1152)
    assert mid.verify[1] == pytest.approx(1.125) and mid.draft_step == pytest.approx(0.35)
    assert mid.target_step_s == pytest.approx(0.065)
    between = cm.at(3072)                                        # between the two long buckets
    assert between.verify[1] == pytest.approx(1.30) and between.draft_step == pytest.approx(0.45)
    far = cm.at(100_000)                          # along the last segment up to twice the longest context, no further
    assert far.verify[1] == pytest.approx(1.80) and far.draft_step == pytest.approx(0.70)
    assert far.verify_large[0][1] > 1.5
    back = CostModel.from_dict(cm.to_dict())
    assert back.at(3072).verify == between.verify and back.contexts() == [256, 2048, 4096]
    inf = CostModel(draft_step=float("inf"), verify=[1.0, 1.1],
                    by_context=[{"context": 2048, "verify": [1.0, 1.3], "draft_step": float("inf"),
                                 "target_step_s": 0}])
    assert inf.at(4096).draft_step == float("inf")


def test_measured_cost_model_has_a_bucket_per_context_the_window_holds(tmp_path):
    """V(n) and c at each context bucket, measured on one cache a prefill extends; buckets past the model's
    window are cut to it; V(1) = 1 at every context."""
    from conftest import make_tiny_model

    from specdec.models.loader import load_model
    from specdec.policy import measure

    big = make_tiny_model(tmp_path / "t", max_position_embeddings=1200)
    target = load_model(str(big), dtype="float32", device="cpu", progress=False)
    cost = measure.measure_cost_model(target.model, target.model, k_max=3, context=64, repeats=1,
                                      contexts=(512, 1024, 4096))
    assert cost.contexts() == [64, 512, 1024, 1200 - 3 - 4]
    for b in cost.by_context:
        assert len(b["verify"]) == 4 and b["verify"][0] == 1.0 and b["target_step_s"] > 0
        assert 0 < b["draft_step"] < float("inf")                  # the draft (here the target itself) timed too
    assert cost.at(800).context == 832                            # rounded up to 64 tokens, between two buckets
    # the draft's read timed on one engine chunk and on a longer prompt the window holds (1193 tokens, in chunks)
    assert [n for n, _ in cost.draft_read] == [512, 1200 - 8] and all(r > 0 for _, r in cost.draft_read)
    assert cost.draft_prefill_s == cost.draft_read[0][1] and cost.at(800).draft_read == cost.draft_read
    assert CostModel.from_dict(cost.to_dict()).draft_read == cost.draft_read


def test_rows_are_timed_with_every_rows_logits_and_the_draft_in_the_same_rounds(tmp_path, monkeypatch):
    """As the engine runs them: a verification forward computes logits for every row (its output head over each is
    part of what a row costs), a draft step its newest row's; each round times a chain of draft steps right after
    the target's forwards, at the short context and at every longer one."""
    from conftest import make_tiny_model

    from specdec.models import runner
    from specdec.models.loader import load_model
    from specdec.policy import measure

    dirs = [make_tiny_model(tmp_path / "t", max_position_embeddings=1200),
            make_tiny_model(tmp_path / "d", seed=1, num_hidden_layers=1, max_position_embeddings=1200)]
    target, draft = (load_model(str(d), dtype="float32", device="cpu", progress=False).model for d in dirs)
    calls, real = [], runner.forward_spans

    def spy(model, spans, *a, **kw):
        if len(spans) == 1 and spans[0].decode:
            calls.append(("target" if model is target else "draft", len(spans[0].token_ids), spans[0].logits,
                          spans[0].start))
        return real(model, spans, *a, **kw)
    monkeypatch.setattr(runner, "forward_spans", spy)
    measure.measure_cost_model(target, draft, k_max=2, context=64, repeats=2, contexts=(512,))
    per = 3 + measure.DRAFT_CHAIN
    rounds = [calls[i:i + per] for i in range(0, 3 * per * 2, per)]   # (warm-up + 2) rounds, at 64 then 512 tokens
    for r in rounds:
        assert [(w, n, m) for w, n, m, _ in r] == [("target", 1, "all"), ("target", 2, "all"), ("target", 3, "all"),
                                                   *[("draft", 1, "last")] * measure.DRAFT_CHAIN]
        assert len({start for *_, start in r}) == 1                   # both after the same context
    assert [r[0][3] for r in rounds] == [64] * 3 + [512] * 3


def test_a_ratio_is_taken_within_each_round():
    """V(n) and c are medians of each round's own ratio; the step's seconds are the fastest round's. A one-row
    forward that ran fast in one round (the machine between two speeds) does not make every wider row look dear."""
    from specdec.policy.measure import ratios

    rounds = [{1: 0.030, 5: 0.036, "draft_step": 0.009}, {1: 0.031, 5: 0.037, "draft_step": 0.0093},
              {1: 0.020, 5: 0.034, "draft_step": 0.0068}]
    v, c, step = ratios(rounds, [1, 5])
    assert v[1] == 1.0 and v[5] == pytest.approx(0.036 / 0.030)      # not 0.034 / 0.020 = 1.7
    assert c == pytest.approx(0.3) and step == 0.020
    assert ratios([{1: 0.02, 2: 0.021}], [1, 2])[1] == math.inf      # no draft timed


def test_a_long_prompts_read_is_priced_at_its_length():
    """A token of a long prompt costs the draft more to read than one of a 512-token prompt (it attends to more before
    it): the price per token is interpolated between the lengths measured and extrapolated along the last segment up
    to twice the longest; where that makes the pair lose to lookup on a 2k prompt, lookup runs alone, though one
    chunk's price alone would have sent the draft."""
    from specdec.policy.cost_model import read_seconds

    flat = CostModel(draft_step=0.25, verify=[1.0, 1.05, 1.09, 1.13, 1.17, 1.21], target_step_s=0.055,
                     draft_prefill_s=0.0006)
    grows = dataclasses.replace(flat, draft_read=[[512, 0.0006], [2048, 0.0010]])
    assert read_seconds(flat, 2000) == pytest.approx(2000 * 0.0006)
    assert read_seconds(grows, 256) == pytest.approx(256 * 0.0006)
    assert read_seconds(grows, 1280) == pytest.approx(1280 * 0.0008)
    assert read_seconds(grows, 4096) == pytest.approx(4096 * (0.0006 + 0.0004 * 3584 / 1536))
    assert read_seconds(grows, 8192) == pytest.approx(8192 * (0.0006 + 0.0004 * 3584 / 1536))   # no further out
    alphas = {"draft": 0.9, "ngram": 0.55}
    f = RequestFeatures(max_tokens=128, context=2000)
    paired = choose(f, alphas, flat, PolicyConfig())     # the pair pays: the matches first, then the draft
    assert paired.method == "ngram" and "the matches first, the draft" in paired.reason
    alone = choose(f, alphas, grows, PolicyConfig())
    assert alone.method == "ngram" and "prompt read" in alone.reason


def test_a_cost_model_file_of_another_version_is_measured_again(tiny_dirs, tmp_path, monkeypatch):
    import json

    from specdec import LLM
    from specdec.llm import COST_MODEL_REVISION

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    llm = LLM(target=str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False)
    llm.cost_model(3)
    (path,) = (tmp_path / "cache" / "cost_models").glob("*.json")
    saved = json.loads(path.read_text())
    assert saved["revision"] == COST_MODEL_REVISION and saved["verify"][0] == 1.0
    saved.update(revision=COST_MODEL_REVISION - 1, verify=[7.0, 7.0, 7.0, 7.0])   # an older file at the same place
    path.write_text(json.dumps(saved))
    again = LLM(target=str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False).cost_model(3)
    assert again.verify[0] == 1.0
    assert json.loads(path.read_text())["revision"] == COST_MODEL_REVISION


def test_other_processes_load_is_told_apart_from_this_ones():
    """ForeignLoad counts the CPU time of other processes only: a measurement keeping this process busy reads less
    than one taken while another process spins."""
    import subprocess
    import sys
    import time

    from specdec.policy.quiet import ForeignLoad, own_jiffies

    if own_jiffies() is None:
        pytest.skip("no /proc here: ForeignLoad cannot tell and every measurement counts as quiet")
    with ForeignLoad() as mine:
        end = time.perf_counter() + 0.6
        while time.perf_counter() < end:
            pass
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        with ForeignLoad() as theirs:
            time.sleep(0.6)
    finally:
        spin.kill()
        spin.wait()
    assert theirs.fraction > mine.fraction
    assert theirs.fraction >= 0.3 / (os.cpu_count() or 1)        # one spinning core of the machine's


def _measured(v2: float, step_s: float = 0.05) -> CostModel:
    return CostModel(draft_step=0.3, verify=[1.0, 1.1, 1.2], target_step_s=step_s, context=256,
                     by_context=[{"context": 1024, "verify": [1.0, v2, 1.3], "draft_step": 0.35,
                                  "target_step_s": 1.2 * step_s}])


def test_a_disturbed_cost_measurement_is_measured_again_and_not_kept(monkeypatch):
    """A measurement other processes disturbed, or whose figures a quiet machine never gives (two rows cheaper than
    one), is taken again; when every attempt is disturbed the last one is used and reported unclean (not cached)."""
    from specdec.policy import measure, quiet

    assert measure.plausible(_measured(1.1)) and not measure.plausible(_measured(0.66))
    falling = _measured(1.1)
    falling.by_context[0]["target_step_s"] = 0.5 * falling.target_step_s     # a longer context, a cheaper step
    assert not measure.plausible(falling)

    monkeypatch.setattr(quiet, "wait_for_quiet", lambda timeout_s=0, window_s=0: 0.0)

    class Quiet(quiet.ForeignLoad):      # the machine's own load during a microsecond lambda is a jiffy's chance
        def __exit__(self, *exc):
            self.fraction = 0.0
    monkeypatch.setattr(quiet, "ForeignLoad", Quiet)
    results = iter([_measured(0.66), _measured(1.1)])
    cost, clean = measure.measure_quietly(lambda: next(results))
    assert clean and cost.by_context[0]["verify"][1] == 1.1

    class Busy(quiet.ForeignLoad):
        def __exit__(self, *exc):
            self.fraction = 0.5
    monkeypatch.setattr(quiet, "ForeignLoad", Busy)
    calls = []
    cost, clean = measure.measure_quietly(lambda: calls.append(1) or _measured(1.1), attempts=3)
    assert not clean and len(calls) == 3
    # a forward too short to time (a tiny model) is taken as it is: waiting would not make its ratios mean more
    cost, clean = measure.measure_quietly(lambda: _measured(0.66, step_s=0.0005))
    assert clean


def test_an_unclean_cost_model_is_not_cached(tiny_dirs, tmp_path, monkeypatch):
    from specdec import LLM
    from specdec import llm as llm_module

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(llm_module, "measure_quietly", lambda measure: (measure(), False))
    llm = LLM(target=str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False)
    assert llm.cost_model(3).verify[0] == 1.0
    assert not list((tmp_path / "cache" / "cost_models").glob("*.json"))


def test_choose_drafts_less_after_a_long_prompt():
    """The same acceptance pays at a short context and not at a long one, where each verified row and each draft
    step costs more relative to a plain step."""
    cm = CostModel(draft_step=0.30, verify=[1.0, 1.05, 1.09, 1.13, 1.17, 1.21, 1.25, 1.29, 1.33], context=256,
                   by_context=[{"context": 2048, "verify": [1.0, 1.18, 1.30, 1.42, 1.54, 1.66], "draft_step": 0.40,
                                "target_step_s": 0.0}])
    short = choose(RequestFeatures(max_tokens=256, context=200), {"draft": 0.6}, cm, PolicyConfig(), ("draft",))
    long = choose(RequestFeatures(max_tokens=256, context=3000), {"draft": 0.6}, cm, PolicyConfig(), ("draft",))
    assert short.method == "draft" and short.k >= 1
    assert long.method == "none" or long.k < short.k
    assert long.expected_speedup < short.expected_speedup


def test_lookup_runs_alone_where_the_drafts_prompt_read_costs_more_than_the_pair_gains_over_it():
    """A long question over a pasted document: prompt lookup copies well (1.6x), the draft would do 1.9x a step but
    must read 2k tokens first (2k x 1.4 ms: 0.38 of a 128-token plain decode), so the pair would finish later than
    lookup alone; with a short prompt the read is small and the pair runs."""
    cm = CostModel(draft_step=0.25, verify=[1.0, 1.05, 1.09, 1.13, 1.17, 1.21], target_step_s=0.058,
                   draft_prefill_s=0.0014)
    alphas = {"draft": 0.9, "ngram": 0.7}
    long = choose(RequestFeatures(max_tokens=128, context=2000), alphas, cm, PolicyConfig())
    assert long.method == "ngram" and "prompt read" in long.reason
    short = choose(RequestFeatures(max_tokens=128, context=150), alphas, cm, PolicyConfig())
    assert short.method == "ngram" and "the matches first, the draft" in short.reason
    # the draft alone still pays for its read over plain decoding: without lookup it runs
    alone = choose(RequestFeatures(max_tokens=128, context=2000), {"draft": 0.9}, cm, PolicyConfig(), ("draft",))
    assert alone.method == "draft"
    # nor is the draft explored on such a prompt (its read would land in that request's decode): on a short one
    policy = SpeculationPolicy(cm, PolicyConfig(), ("ngram", "draft"))
    first = policy.decide("r1", "chat", RequestFeatures(max_tokens=128, context=2000))
    assert not first.explore and first.method != "draft"
    later = policy.decide("r2", "chat", RequestFeatures(max_tokens=128, context=150))
    assert later.method == "draft"


def test_a_cache_runs_alone_only_where_the_draft_does_not_pay_or_its_read_leaves_the_pair_behind():
    """Suffix decoding expected above every other proposer: where the draft pays, the request starts on the free
    proposers' matches under a step controller (suffix decoding's among them), the draft to move to; where the draft's
    read of a long prompt leaves the pair behind the cache, or the draft does not pay at all, the cache runs alone."""
    cm = CostModel(draft_step=0.25, verify=[1.0, 1.05, 1.09, 1.13, 1.17, 1.21], target_step_s=0.058,
                   draft_prefill_s=0.0014)
    available = ("ngram", "suffix", "draft")
    alphas = {"draft": 0.9, "ngram": 0.3, "suffix": 0.8}
    short = choose(RequestFeatures(max_tokens=128, context=150), alphas, cm, PolicyConfig(), available)
    assert short.method == "ngram" and "the matches first, the draft" in short.reason
    # prompt lookup alone would not pay, suffix decoding's matches would: the request still starts on the matches
    # (the controller's guesses are the longest of both)
    cache = choose(RequestFeatures(max_tokens=128, context=150), {**alphas, "ngram": 0.02}, cm, PolicyConfig(),
                   available)
    assert cache.method == "ngram" and "the matches of suffix" in cache.reason and "first" in cache.reason
    long = choose(RequestFeatures(max_tokens=128, context=2000), alphas, cm, PolicyConfig(), available)
    assert long.method == "suffix" and "prompt read" in long.reason
    useless = choose(RequestFeatures(max_tokens=128, context=150), {**alphas, "draft": 0.1}, cm, PolicyConfig(),
                     available)
    assert useless.method == "suffix"
    # no free proposer expected to pay at all, with min_speedup set at 1.0: nothing to start on, the pair at once
    none_free = choose(RequestFeatures(max_tokens=128, context=150), {"draft": 0.9, "ngram": 0.0, "suffix": 0.0}, cm,
                       PolicyConfig(min_speedup=1.0), available)
    assert none_free.method == "draft" and "lookup where it beats" in none_free.reason


def test_the_draft_is_not_chosen_when_reading_a_long_prompt_costs_more_than_it_saves():
    """The draft reads the prompt before the first token: with 128 tokens to write after a 2.5k-token prompt its
    read (2.5k x 1.4 ms) outweighs what 1.3x saves (128 x 58 ms x 0.23); with 2,048 tokens to write and 1.45x it
    pays."""
    cm = CostModel(draft_step=0.30, verify=[1.0, 1.05, 1.09, 1.13, 1.17], target_step_s=0.058, draft_prefill_s=0.0014)
    few = choose(RequestFeatures(max_tokens=128, context=2500), {"draft": 0.7, "ngram": 0.3}, cm, PolicyConfig())
    many = choose(RequestFeatures(max_tokens=2048, context=2500), {"draft": 0.8, "ngram": 0.3}, cm, PolicyConfig())
    short = choose(RequestFeatures(max_tokens=128, context=100), {"draft": 0.7, "ngram": 0.3}, cm, PolicyConfig())
    assert few.method != "draft" and "the matches first" not in few.reason
    assert "the matches first, the draft" in many.reason and "the matches first, the draft" in short.reason
    alone = choose(RequestFeatures(max_tokens=128, context=2500), {"draft": 0.7}, cm, PolicyConfig(), ("draft",))
    assert alone.method == "none" and "prompt read" in alone.reason
    policy = SpeculationPolicy(cm, PolicyConfig(), ("ngram", "draft"))
    d = policy.decide("r1", "chat", RequestFeatures(max_tokens=128, context=2500))
    assert d.method != "draft"                   # not explored either: it cannot pay for this prompt


def test_a_heads_request_moves_to_the_draft_where_the_heads_own_record_falls_short():
    """One pool holds every prompt: a head's pooled α can be far from what it does on one request. After a few of
    its own steps, a request whose head is expected to do worse than the draft model (at the draft's pool α, its
    read of the context paid) moves to the draft, once; the head's record goes to the pool beside the draft's."""
    cost = CostModel(draft_step=0.3, verify=[1.0] * 9, lookup=0.01, heads={"eagle3": [0.05, 0.05]},
                     target_step_s=0.03)

    def controller(**kw):
        kw = {"fallback": ("draft", 0.8), "prompt_len": 50, "max_tokens": 128, **kw}
        return StepController("eagle3", 4, 0.7, cost, PolicyConfig(), **kw)

    bad = controller()
    for step in range(4):
        assert bad.model == "eagle3"
        source, k, _ = bad.choose_step([0] * (50 + step), 8, None, None)
        bad.observe_step(k, 0, [1])                  # nothing accepted
    assert bad.model == "draft" and bad.k > 0 and bad.fallback is None and bad.steps == 0
    (model, drafted, accepted, steps), = bad.retired
    assert (model, accepted, steps) == ("eagle3", 0, 4) and drafted >= 4
    assert bad.switched.startswith("eagle3 after 4 steps") and bad.switched.endswith("moved to draft")
    good = controller()
    for step in range(8):
        source, k, _ = good.choose_step([0] * (50 + step), 8, None, None)
        good.observe_step(k, k, [1] * (k + 1))      # every draft accepted
    assert good.model == "eagle3" and not good.retired
    # near the end of the request, or where the draft's read of the context costs more than it would save: stay
    late = controller(max_tokens=60)
    for step in range(4):
        _, k, _ = late.choose_step([0] * (100 + step), 8, None, None)     # 50 of 60 tokens generated
        late.observe_step(k, 0, [1])
    assert late.model == "eagle3" and late.fallback is None
    slow_read = dataclasses.replace(cost, draft_prefill_s=0.01)    # 10 ms a token: 1.5 s for the context
    costly = StepController("eagle3", 4, 0.7, slow_read, PolicyConfig(), fallback=("draft", 0.8), prompt_len=150,
                            max_tokens=128)
    for step in range(4):
        _, k, _ = costly.choose_step([0] * (150 + step), 8, None, None)
        costly.observe_step(k, 0, [1])
    assert costly.model == "eagle3"
    # prompt lookup (or suffix decoding) running alone: its guesses fail, and the draft takes over; guesses that hold
    # keep it
    copy = list(range(100, 108))
    for held, moves in ((0, True), (8, False)):
        alone = StepController("ngram", 0, 0.5, cost, PolicyConfig(), guesser=lambda ids, room, c: (3, copy[:room]),
                               fallback=("draft", 0.8), prompt_len=50, max_tokens=128)
        for step in range(8):
            source, k, guess = alone.choose_step([0] * (50 + step), 8, None, None)
            alone.observe_step(k, min(k, held), (guess or [])[:held] + [7])
        assert (alone.model, alone.k > 0, not alone.retired) == ("draft", moves, True), alone.switched
        assert alone.switched.startswith("lookup alone after 8 steps") == moves
    # judged by what the request's steps gave: a head whose own guesses fail while prompt lookup copies the answer
    # (a summary) stays; the same head without lookup's steps moves
    for copies, moves in ((8, False), (0, True)):
        ctl = controller()
        for _ in range(4):
            ctl.observe(MODEL, 2, 0)
            for _ in range(copies // 4):
                ctl.observe(LOOKUP, 8, 8, n=3, lookup_len=8, lookup_matched=8)
        assert (ctl.model == "draft") == moves and ctl.made == 4 + copies * 9
    # an exploring head's request moves after its exploring steps, and the draft then runs on its merits
    exploring = controller(explore=True)
    for step in range(4):
        _, k, _ = exploring.choose_step([0] * (50 + step), 8, None, None)
        exploring.observe_step(k, 0, [1])
    assert exploring.model == "draft" and not exploring.explore
    # a request that chose the draft has nothing to move to
    assert StepController("draft", 4, 0.7, cost, PolicyConfig(), fallback=("draft", 0.8)).fallback is None
    # the pool hears of both
    policy = SpeculationPolicy(cost, PolicyConfig(), ("ngram", "draft", "eagle3"))
    from specdec.policy.decide import Decision
    policy.record("p", Decision("eagle3", 4, 2.0, "test", 0.7), 0.0, _Stats(drafted=20, accepted=5, steps=8), bad)
    assert policy.pool("p").count("eagle3") == 1 and policy.pool("p").count("draft") == 0
    bad.observe_step(3, 3, [1, 1, 1, 1])
    policy.record("p", Decision("eagle3", 4, 2.0, "test", 0.7), 0.0, _Stats(drafted=20, accepted=5, steps=8), bad)
    assert policy.pool("p").count("eagle3") == 2 and policy.pool("p").count("draft") == 1


def test_auto_moves_a_request_from_a_useless_head_to_the_draft_with_parity(tiny_dirs, tmp_path, monkeypatch):
    """End to end: a random head is chosen on its prior, fails its first steps, and the request finishes with the
    draft model (here the target itself: every draft accepted), which reads the context when first asked; the text
    stays the target's greedy output and the reason says what happened."""
    from specdec import SamplingParams
    from specdec.models.kv_manager import KVManager
    from specdec.proposers import DraftModelProposer

    llm = _auto_with_a_random_eagle3(tiny_dirs, tmp_path, monkeypatch)
    llm.engine.proposers["draft"] = DraftModelProposer(llm.target.model, llm.tokenizer.vocab_size,
                                                       KVManager(llm.target.model, 4096))
    cost = CostModel(draft_step=0.3, verify=[1.0] * 9, heads={"eagle3": [0.05, 0.05]})
    llm.policy(PolicyConfig(prior_alpha={"eagle3": 0.7, "draft": 0.8, "ngram": 0.0}, min_acceptance=0.0), cost,
               available=("ngram", "draft", "eagle3"))
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    ids = llm.encode("def add(a, b):")
    plain = llm.generate(ids, params, spec="none")[0].token_ids
    out = llm.generate(ids, params, spec="auto", pool="p", request_id="a0")[0]
    assert out.token_ids == plain
    st = out.stats
    assert st.method == "eagle3" and "eagle3 after" in st.policy_reason and "moved to draft" in st.policy_reason
    pool = llm.policy().pool("p")
    assert pool.count("eagle3") == 1 and pool.count("draft") == 1
    assert st.accepted_tokens >= st.draft_tokens // 2         # the draft's steps (the target itself) all held


def test_suffix_decoding_is_not_explored_alone_and_the_pool_is_judged_without_it():
    """Its matches are weighed beside the model at every step (kept as prompt lookup's record): a request of its own
    would only cost that request the model proposer's speed."""
    def first_request(pol, pool, model_accepts):
        first = pol.decide("a", pool, RequestFeatures(max_tokens=128))
        assert first.method == "draft" and first.explore
        ctl = pol.controller(first, pool, 0.0)
        for _ in range(10):
            source, k = ctl.plan(4, 8)
            ctl.observe(source, k, model_accepts if source == "model" else 0, n=4, lookup_len=4, lookup_matched=0)
        pol.record(pool, first, 0.0, _Stats(drafted=40, accepted=10 * model_accepts, steps=10), ctl)
        return pol.pools[pool]

    pol = SpeculationPolicy(CPU, PolicyConfig(), ("ngram", "suffix", "draft"), matched=("suffix",))
    pool = first_request(pol, "chat", 3)
    assert pool.count("suffix") == 0 and pool.count("draft") == 1 and pool.count("ngram") == 1
    second = pol.decide("b", "chat", RequestFeatures(max_tokens=128))
    # the draft runs on its record; suffix decoding is priced by the matches' record (none matched), not its prior
    assert second.method == "draft" and not second.explore and "exploring" not in second.reason
    # every proposer that needs a record has one after a single request: the pool is judged from then on, and
    # turned off once its window is poor (it waited for a request of suffix decoding alone before)
    prose = first_request(pol, "prose", 0)
    for _ in range(2):
        pol.record("prose", second, 0.0, _Stats(drafted=40, accepted=1, steps=10))
    assert prose.count("suffix") == 0 and not prose.enabled
    # what the engine passes: the free proposers that offer matches; one that does not (a plugin's without match())
    # is learned only by running alone, so it is still explored
    from specdec.proposers.ngram import NgramProposer
    from specdec.proposers.suffix import SuffixProposer
    assert NgramProposer().matches and SuffixProposer().matches
    unmatched = SpeculationPolicy(CPU, PolicyConfig(), ("ngram", "suffix", "draft"))
    assert unmatched.decide("a", "chat", RequestFeatures(max_tokens=128)).method == "suffix"
