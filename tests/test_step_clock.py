"""auto's cost model re-priced by the engine's own step times (policy/clock.py)."""
import pytest

from specdec.policy import CostModel, PolicyConfig
from specdec.policy.clock import StepClock
from specdec.policy.cost_model import best_k, expected_speedup
from specdec.policy.pools import SpeculationPolicy

# as measured on a Zen 4 machine in a fast hour: a 23 ms plain step, each further row ~0.1-0.2 of it
ZEN4 = CostModel(draft_step=0.32, verify=[1.0, 1.14, 1.25, 1.47, 1.68, 1.77, 1.96, 2.16, 2.5], lookup=0.005,
                 target_step_s=0.023, heads={"eagle3": [0.08, 0.04]}, context=256,
                 by_context=[{"context": 1024, "verify": [1.0, 1.2, 1.33, 1.55, 1.8], "draft_step": 0.33,
                              "target_step_s": 0.025}])


def test_a_slower_plain_step_makes_rows_cheaper_not_the_draft():
    slow = ZEN4.slower(1.4)
    for n in (2, 5, 9, 12):
        assert slow.V(n) == pytest.approx(1 + (ZEN4.V(n) - 1) / 1.4)
    assert slow.at(1024).V(5) == pytest.approx(1 + 0.8 / 1.4)
    assert slow.target_step_s == pytest.approx(0.023 * 1.4) and slow.at(1024).target_step_s == pytest.approx(0.035)
    assert slow.draft_step == ZEN4.draft_step and slow.at(1024).draft_step == pytest.approx(0.33)
    assert slow.heads["eagle3"] == pytest.approx([0.08 / 1.4, 0.04 / 1.4])
    assert slow.lookup == pytest.approx(0.005 / 1.4)
    assert ZEN4.slower(1.0) is ZEN4
    # what it changes: with plain steps 40% slower, a chain of 4 drafts costs less of a step, and pays 7% more
    assert expected_speedup("draft", 0.85, 4, slow) > 1.05 * expected_speedup("draft", 0.85, 4, ZEN4)
    assert best_k("eagle3", 0.9, slow, 8)[0] > best_k("eagle3", 0.9, ZEN4, 8)[0]


def _step_s(plain_s: float, rows: int, context: int, noise: float = 0.0) -> float:
    ref = ZEN4.at(context)
    return plain_s * (1 + noise) + ref.target_step_s * (ref.V(rows) - 1)


def test_the_clock_reads_the_plain_step_from_steps_of_any_width():
    """Every step speculating (no one-row steps): the plain step is a step less its extra rows at their measured
    seconds."""
    clock = StepClock(ZEN4, window=32, every=8)
    got = []
    for i in range(48):        # plain steps 30% slower than measured; the extra rows as measured; +-2% noise
        rows, context = (2, 3, 5, 4)[i % 4], 256 + 10 * i
        got.append(clock.observe(rows, context, _step_s(0.0299 * (1 + 0.1 * context / 1024), rows, context,
                                                        (-0.02, 0.0, 0.02)[i % 3])))
    new = [c for c in got if c is not None]
    assert len(new) == 1 and got.index(new[0]) == 15       # once half the window is in, then only on a change
    assert clock.ratio == pytest.approx(1.3, abs=0.03) and clock.scales == []
    assert new[0].V(5) == pytest.approx(1 + 0.68 / clock.ratio)
    # a stall (a step 10x as long) is not a drift: not counted
    assert clock.observe(1, 256, 0.3) is None and clock.steps == 48
    # the machine recovers: the model comes back to the measured one
    for _ in range(64):
        c = clock.observe(5, 256, _step_s(0.023, 5, 256))
        if c is not None:
            last = c
    assert clock.ratio == pytest.approx(1.0) and last.V(5) == pytest.approx(1.68)


def test_rows_are_priced_by_their_own_steps_beside_plain_ones():
    """A host where a 5-row step takes its measured seconds whatever the plain step takes (compute-bound rows, a
    memory-bound plain step): the extra rows' seconds are not what they were measured at, so a step less them says
    nothing of the plain step. With one-row steps in the mix each is read from its own."""
    clock = StepClock(ZEN4, window=32, every=8)
    t5 = ZEN4.target_step_s * ZEN4.V(5)                    # 38.6 ms, as measured
    for i in range(64):        # plain steps 1.35x the measured (31 ms), 5-row steps as measured
        rows = (1, 5)[i % 2]
        clock.observe(rows, 256, (0.023 * 1.35 if rows == 1 else t5) * (1 + (-0.01, 0.0, 0.01)[i % 3]))
    model = clock.current
    assert clock.ratio == pytest.approx(1.35, rel=0.02)
    assert model.V(5) == pytest.approx(ZEN4.V(5) / 1.35, rel=0.02)        # 1.24, where a step less its rows said 1.5
    assert model.target_step_s == pytest.approx(0.023 * 1.35, rel=0.02)
    # a row count not seen scales its measured extra rows like the nearest one seen; a longer context likewise
    s5 = clock.scales[-1][1]
    assert [n for n, _ in clock.scales] == [5] and s5 == pytest.approx((1.68 - 1.35) / 0.68, rel=0.05)
    assert model.V(3) == pytest.approx(1 + s5 * 0.25 / clock.ratio)
    assert model.at(1024).V(5) == pytest.approx(1 + s5 * 0.8 / clock.ratio)
    assert clock.status()["row_scales"] == [[5, round(s5, 3)]] and clock.status()["rows_timed"] == {1: 32, 5: 32}
    # the other host (the fast state of this one): plain steps 0.7x, 5 rows again as measured -> V(5) 2.4
    for i in range(64):
        rows = (1, 5)[i % 2]
        clock.observe(rows, 256, 0.023 * 0.7 if rows == 1 else t5)
    assert clock.ratio == pytest.approx(0.7) and clock.current.V(5) == pytest.approx(1.68 / 0.7)
    # no one-row step for longer than the horizon: the rule of steps that all speculate again
    for _ in range(4 * 32):
        clock.observe(5, 256, _step_s(0.023, 5, 256))
    assert clock.scales == [] and clock.ratio == pytest.approx(1.0) and clock.current.V(5) == pytest.approx(1.68)


def test_the_draft_models_steps_reprice_c():
    clock = StepClock(ZEN4, window=32, every=8)
    for _ in range(32):        # plain steps as measured; the draft's chain of 4 at 1.25x its measured step
        clock.observe_draft(4, 256, 4 * 1.25 * 0.32 * 0.023)
        clock.observe(1, 256, 0.023)
    assert clock.current.draft_step == pytest.approx(0.4) and clock.current.at(1024).draft_step == pytest.approx(0.4125)
    assert clock.status()["draft_step_scale"] == pytest.approx(1.25) and clock.current.V(5) == pytest.approx(1.68)
    for _ in range(32):        # now plain steps 1.25x too: the draft's step is the same share of one
        clock.observe_draft(4, 256, 4 * 1.25 * 0.32 * 0.023)
        clock.observe(1, 256, 0.023 * 1.25)
    assert clock.current.draft_step == pytest.approx(0.32)
    # a chain of nonsense (a stall) is not read; nor is a model measured without a draft
    clock.observe_draft(4, 256, 10.0)
    assert len(clock.drafts) == 32
    bare = StepClock(CostModel(draft_step=float("inf"), verify=[1.0, 1.2], target_step_s=0.02))
    bare.observe_draft(4, 256, 0.02)
    assert not bare.drafts


def test_slower_with_row_scales():
    assert ZEN4.slower(1.0, []) is ZEN4
    m = ZEN4.slower(0.8, [(3, 2.0), (5, 1.0)])
    assert m.V(2) == pytest.approx(1 + 2.0 * 0.14 / 0.8)          # below the first point: its scale
    assert m.V(4) == pytest.approx(1 + 1.5 * 0.47 / 0.8)          # between: interpolated
    assert m.V(9) == pytest.approx(1 + 1.0 * 1.5 / 0.8)           # past the last: held
    assert m.draft_step == ZEN4.draft_step and m.target_step_s == pytest.approx(0.023 * 0.8)
    assert ZEN4.slower(1.0, [], 1.5).draft_step == pytest.approx(0.48)


def test_the_policy_prices_new_requests_with_the_clock_and_can_be_told_not_to():
    policy = SpeculationPolicy(ZEN4, PolicyConfig(clock_window=16))
    for _ in range(16):
        policy.observe_forward(1, 256, 0.023 * 1.5)
    assert policy.cost.V(5) == pytest.approx(1 + 0.68 / 1.5)
    status = policy.status()
    assert status["clock"]["plain_step_ratio"] == pytest.approx(1.5)
    assert status["measured_cost_model"]["verify"][4] == 1.68
    fixed = SpeculationPolicy(ZEN4, PolicyConfig(clock_window=0))
    fixed.observe_forward(1, 256, 0.023 * 1.5)
    assert fixed.cost is ZEN4 and fixed.status()["clock"] is None
    with pytest.raises(ValueError, match="clock_window"):
        PolicyConfig(clock_window=-1)


def test_the_engine_times_each_decode_steps_forward_for_the_policy(tiny_dirs, monkeypatch):
    """Decode steps only (a prompt chunk's forward is another shape of work), with the rows the step verified."""
    from specdec import LLM, SamplingParams, SpeculativeConfig

    llm = LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="float32", device="cpu",
              speculative=SpeculativeConfig(method="auto"), progress=False)
    policy = llm.policy(PolicyConfig(), CostModel(draft_step=0.1, verify=[1.0] * 9, target_step_s=0.01),
                        available=("draft",))
    seen, chains = [], []
    monkeypatch.setattr(policy, "observe_forward", lambda rows, context, s: seen.append((rows, context, s)))
    monkeypatch.setattr(policy, "observe_draft", lambda n, context, s: chains.append((n, context, s)))
    ids = llm.encode("def add(a, b):")
    out = llm.generate(ids, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), spec="auto")[0]
    st = out.stats
    # the draft model's chains: one per draft step but the first (it read the prompt), a forward per token drafted
    assert st.draft_steps > 1 and len(chains) == st.draft_steps - 1
    assert sum(n for n, _, _ in chains) < st.draft_tokens and all(1 <= n <= 8 and s > 0 for n, _, s in chains)
    assert all(len(ids) <= c < len(ids) + 24 for _, c, _ in chains)
    assert len(seen) == st.target_forwards                     # every decode forward, none of the prompt
    assert sum(r for r, _, _ in seen) == len(seen) + st.draft_tokens
    assert [c for _, c, _ in seen] == sorted(c for _, c, _ in seen) and seen[0][1] == len(ids)
    assert all(s > 0 for _, _, s in seen)
    # token trees are sized by the re-priced rows too
    policy.cost = ZEN4.slower(2.0)
    assert llm.row_cost(5) == pytest.approx(1.34)


def test_rows_and_the_draft_are_priced_against_plain_steps_of_the_same_moment():
    """A host that moves between a fast state (plain step 23 ms, 5 rows 38.6 ms) and a slow one (plain 33 ms, 5 rows
    40 ms, the draft's step 1.2x its measured one). Plain steps from a fast minute (another request's) and 5-row steps
    from a slow one, with a plain step every 16 steps: each row count over the plain steps of the same moment gives the
    slow state's V(5) and c, where medians over the window would pair the fast minute's plain steps with the slow
    minute's rows (V(5) 1.75, c 0.38)."""
    clock = StepClock(ZEN4, window=64, every=8)
    for _ in range(48):                                    # fast: a request decoding plainly
        clock.observe(1, 256, 0.023)
    for i in range(112):                                   # slow: every step speculating but a plain one in 16
        if i % 16 == 15:
            clock.observe(1, 256, 0.033)
        else:
            clock.observe_draft(4, 256, 4 * 1.2 * 0.32 * 0.023)
            clock.observe(5, 256, 0.040)
    model = clock.current
    assert model.V(5) == pytest.approx(0.040 / 0.033, rel=0.02)           # 1.21
    assert model.draft_step == pytest.approx(1.2 * 0.32 * 0.023 / 0.033, rel=0.02)     # 0.27
    # the plain step itself: the median of the recent one-row steps, fast and slow alike
    assert clock.ratio == pytest.approx(1.0)
    before = StepClock(ZEN4, window=64, every=8, pair_span=0)              # nothing paired: the window's medians
    for _ in range(48):
        before.observe(1, 256, 0.023)
    for i in range(112):
        if i % 16 == 15:
            before.observe(1, 256, 0.033)
        else:
            before.observe_draft(4, 256, 4 * 1.2 * 0.32 * 0.023)
            before.observe(5, 256, 0.040)
    assert before.current.V(5) == pytest.approx(0.040 / 0.023, rel=0.02) and before.current.draft_step > 0.37


def test_the_clock_asks_for_a_plain_step_when_it_has_none():
    clock = StepClock(ZEN4, window=32, probe_every=16)
    assert not clock.wants_plain()
    for _ in range(15):
        clock.observe(5, 256, 0.0386)
    assert not clock.wants_plain()
    clock.observe(3, 256, 0.03)
    assert clock.wants_plain()
    clock.observe(1, 256, 0.023)
    assert not clock.wants_plain()
    assert not StepClock(ZEN4, probe_every=0).wants_plain()
    policy = SpeculationPolicy(ZEN4, PolicyConfig(clock_window=0))
    assert not policy.wants_plain_step()                  # no clock, nothing to ask for


def test_a_lone_request_of_the_step_controller_takes_the_plain_step_asked_for(tiny_dirs, monkeypatch):
    """The step the clock asks for is plain (one row) for a request the step controller drafts for, and the text is
    plain decoding's; a fixed method's request keeps its k."""
    from specdec import LLM, SamplingParams, SpeculativeConfig

    llm = LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["target"]), dtype="float32", device="cpu",
              speculative=SpeculativeConfig(method="auto"), progress=False)
    policy = llm.policy(PolicyConfig(), CostModel(draft_step=0.01, verify=[1.0] * 9, target_step_s=0.01),
                        available=("draft",))
    asked, rows = [], []
    monkeypatch.setattr(policy, "wants_plain_step", lambda: asked.append(1) or len(asked) % 4 == 0)
    monkeypatch.setattr(policy, "observe_forward", lambda n, context, s: rows.append(n))
    ids = llm.encode("def add(a, b):")
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = llm.generate(ids, params, spec="none")[0]
    rows.clear()
    asked.clear()
    out = llm.generate(ids, params, spec=SpeculativeConfig(method="hybrid", num_speculative_tokens=3))[0]
    assert out.token_ids == plain.token_ids
    # the draft is the target: every other step drafts and is accepted whole; every 4th asked is plain
    assert len(asked) == len(rows) and rows.count(1) >= len(asked) // 4 and max(rows) > 1
    assert [r for i, r in enumerate(rows) if (i + 1) % 4 == 0] == [1] * (len(rows) // 4)
    rows.clear()
    fixed = llm.generate(ids, params, spec=SpeculativeConfig(method="draft", num_speculative_tokens=3))[0]
    assert fixed.token_ids == plain.token_ids and 1 not in rows[:-1]
