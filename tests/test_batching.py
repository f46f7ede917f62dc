"""Continuous batching: many sequences in one target forward, each with its own method and k.

A request's greedy output must not depend on what shares its forward (fp32 and bf16), sampled rows inside a batch
are verified exactly, aborts free KV and draft state, more requests than the KV budget queue (or are preempted and
recomputed) and all finish, and sampling generators live on the model's device.
"""
import pytest
import torch
from model_cache import private_cache

from specdec.config import SpeculativeConfig
from specdec.engine import EngineConfig, LLMEngine, SchedulerConfig
from specdec.models.loader import load_model
from specdec.policy import CostModel, PolicyConfig, StepBudget
from specdec.policy.pools import SpeculationPolicy
from specdec.sampling.logits import probs_from_logits
from specdec.sampling.rejection import verify_ragged
from specdec.sampling_params import SamplingParams

PROMPTS = ["def add(a, b):\n    return a + b\n\nclass Cache:", "The quick brown fox jumps over",
           "class Cache:\n    def rollback(self, n):", "你好，世界！ Speculative decoding drafts tokens.",
           "def add(a, b):", "The lazy dog. The quick", "Cache rollback length", "brown fox 你好"]


def _policy():
    cost = CostModel(draft_step=0.2, verify=[1.0] * 9, verify_large=[[16, 1.2], [72, 3.0]])
    return SpeculationPolicy(cost, PolicyConfig(k_max=4, max_load=100), ("ngram", "draft"))


def _engine(target, draft=None, **sched):
    return LLMEngine(EngineConfig(target.model, target.tokenizer, None if draft is None else draft.model,
                     SchedulerConfig(**sched), policy_factory=_policy))


def _drain(engine, seqs, record=None):
    while not all(s.finished for s in seqs):
        outs = engine.step()
        assert all(o.error is None for o in outs), [o.error for o in outs]
        if record is not None:
            record.append(engine.last_step)
    return [list(s.output_ids) for s in seqs]


def _greedy(n=24):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def pair(request, tiny_dirs, tmp_path_factory):
    with private_cache(tmp_path_factory):
        target = load_model(str(tiny_dirs["target"]), dtype=request.param, device="cpu", progress=False)
        # the target as its own draft: drafts are accepted, so batches carry real multi-row verifications
        return target, load_model(str(tiny_dirs["target"]), dtype=request.param, device="cpu", progress=False)


def test_greedy_alone_equals_inside_a_mixed_batch(pair):
    target, draft = pair
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    alone = []
    for i, p in enumerate(ids):
        engine = _engine(target, draft)
        alone.append(_drain(engine, [engine.add_request(f"a{i}", p, _greedy())])[0])
    engine = _engine(target, draft, max_num_seqs=8)
    # draft_p_min 0: chains of k (the tiny draft is never 0.75 sure of a token)
    specs = ["none", SpeculativeConfig("ngram", 3), SpeculativeConfig("draft", 2, draft_p_min=0.0), "auto",
             SpeculativeConfig("draft", 4, draft_p_min=0.0), "none", SpeculativeConfig("ngram", 5), "auto"]
    seqs = []
    for i, (p, s) in enumerate(zip(ids, specs)):
        spec = SpeculativeConfig(s) if isinstance(s, str) else s
        seqs.append(engine.add_request(f"g{i}", p, _greedy(), spec))
        # a sampled neighbour beside every greedy request
        engine.add_request(f"s{i}", p, SamplingParams(max_tokens=24, temperature=1.0, seed=i), spec)
    steps = []
    batched = _drain(engine, seqs, steps)
    assert batched == alone
    assert max(s.num_seqs for s in steps) >= 8          # they really shared forwards
    assert any(s.num_draft_tokens > 0 and s.num_seqs > 1 for s in steps)
    drafted = {s.request_id: s.stats.draft_tokens for s in seqs}
    assert drafted["g2"] > 0 and drafted["g0"] == 0       # the draft drafted, plain decoding did not
    while engine.has_unfinished():                       # the sampled neighbours finish too
        assert all(o.error is None for o in engine.step())
    assert engine.kv.allocated == engine.kv.prefix.capacity and engine.proposers["draft"].kv.allocated == 0


def test_sampled_rows_inside_a_batch_equal_rows_verified_alone():
    """verify_ragged hands each sampled sequence its own generator: a row's draws do not depend on its neighbours
    (the same sequence verified alone, with the same seed, gives the same tokens)."""
    V = 24
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(k + 1, V, generator=g) for k in (3, 0, 2, 4)]
    params = [SamplingParams(temperature=0.9, top_k=10), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.2, top_p=0.8), SamplingParams(temperature=0.0)]
    drafts = [torch.randint(V, (k,), generator=g) for k in (3, 0, 2, 4)]
    qs = [torch.softmax(torch.randn(3, V, generator=g), -1), None, None, None]
    for seed in range(50):
        gens = [torch.Generator().manual_seed(seed * 10 + i) for i in range(4)]
        batch = verify_ragged(logits, drafts, qs, params, gens)
        for i in (0, 2):
            p = params[i]
            alone = verify_ragged([logits[i]], [drafts[i]], [qs[i]], [p],
                                  [torch.Generator().manual_seed(seed * 10 + i)])
            assert batch[i] == alone[0]
            assert 0 <= batch[i][0] <= len(drafts[i]) and len(batch[i][1]) == batch[i][0] + 1
            allowed = probs_from_logits(logits[i], p.temperature, p.top_k, p.top_p, p.min_p)[batch[i][0]] > 0
            assert bool(allowed[batch[i][1][-1]]) or batch[i][0] < len(drafts[i])
        for i in (1, 3):                                 # greedy rows: argmax, accepted while equal
            am = logits[i].argmax(-1).tolist()
            n = next((j for j, (d, a) in enumerate(zip(drafts[i].tolist(), am)) if d != a), len(drafts[i]))
            assert batch[i] == (n, am[: n + 1])


def test_sampled_batch_is_exact_statistically():
    """200k draws of position 1 through verify_ragged, 1000 sequences per call mixed with greedy rows, against the
    target's distribution; a sampler that ignores q (always accepts the draft) must fail the same bound."""
    V, calls, per_call = 16, 200, 1000
    g = torch.Generator().manual_seed(1)
    target_logits = torch.randn(V, generator=g) * 1.5
    draft_probs = torch.softmax(target_logits + torch.randn(V, generator=g), -1)
    p = SamplingParams(temperature=1.0)
    p_target = torch.softmax(target_logits, -1)
    counts = torch.zeros(V)
    bad = torch.zeros(V)
    for c in range(calls):
        draws = torch.multinomial(draft_probs, per_call, replacement=True, generator=g)
        logits = [target_logits[None].repeat(2, 1)] * per_call + [target_logits[None]]
        drafts = [draws[i: i + 1] for i in range(per_call)] + [torch.empty(0, dtype=torch.long)]
        qs = [draft_probs[None]] * per_call + [None]
        params = [p] * per_call + [SamplingParams(temperature=0.0)]
        gens = [torch.Generator().manual_seed(c * per_call + i) for i in range(per_call)] + [None]
        for _, emitted in verify_ragged(logits, drafts, qs, params, gens)[:per_call]:
            counts[emitted[0]] += 1
        bad += torch.bincount(draws, minlength=V)      # the negative control: the draft's tokens, all accepted
    tv = 0.5 * (counts / counts.sum() - p_target).abs().sum().item()
    tv_bad = 0.5 * (bad / bad.sum() - p_target).abs().sum().item()
    assert tv < 0.015, tv
    assert tv_bad > 0.015, tv_bad


def test_abort_mid_batch_frees_kv_and_draft_state(pair):
    target, draft = pair
    engine = _engine(target, draft)
    ids = [target.tokenizer.encode(p) for p in PROMPTS[:4]]
    seqs = [engine.add_request(f"r{i}", p, _greedy(40), SpeculativeConfig("draft", 3, draft_p_min=0.0))
            for i, p in enumerate(ids)]
    for _ in range(3):
        engine.step()
    assert engine.kv.num_seqs == 4 and engine.proposers["draft"].kv.num_seqs == 4
    victim = seqs[1]
    assert engine.abort("r1") is victim
    assert victim.seq_id not in engine.kv.caches and victim.seq_id not in engine.proposers["draft"].kv.caches
    others = _drain(engine, [s for s in seqs if s is not victim])
    assert all(len(o) == 40 for o in others)
    assert engine.kv.allocated == engine.kv.prefix.capacity and engine.proposers["draft"].kv.allocated == 0
    assert engine.abort("r1") is None                   # aborting twice is harmless


def test_more_requests_than_kv_capacity_wait_or_are_preempted_and_all_finish(pair):
    target, draft = pair
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    alone = []
    for i, p in enumerate(ids):
        engine = _engine(target)
        alone.append(_drain(engine, [engine.add_request(f"a{i}", p, _greedy(40))])[0])
    block = target.model.key_block
    # room for about two whole requests: admission makes the rest wait, growth preempts the newest
    engine = _engine(target, max_total_tokens=max(2 * 64, 4 * block) + 2 * block, max_num_seqs=8)
    seqs = [engine.add_request(f"r{i}", p, _greedy(40), SpeculativeConfig("ngram", 2)) for i, p in enumerate(ids)]
    waited, preempted = False, 0
    while not all(s.finished for s in seqs):
        batch_waiting = engine.num_waiting
        outs = engine.step()
        assert all(o.error is None for o in outs)
        waited |= batch_waiting > 0 and engine.num_running > 0
        assert engine.kv.allocated <= engine.kv.max_total_tokens
        preempted += sum(1 for s in seqs if not s.finished and s.num_computed == 0 and s.output_ids)
    assert waited and preempted > 0
    assert [list(s.output_ids) for s in seqs] == alone


def test_a_request_larger_than_the_kv_budget_is_refused(pair):
    from specdec.errors import SpecDecError

    target, _ = pair
    engine = _engine(target, max_total_tokens=128)
    with pytest.raises(SpecDecError, match="KV"):
        engine.add_request("big", target.tokenizer.encode(PROMPTS[0]), _greedy(200))


def test_long_prompt_prefills_in_chunks_and_aborts_between_them(pair):
    target, _ = pair
    engine = _engine(target, max_num_batched_tokens=16, max_num_seqs=2)
    ids = (target.tokenizer.encode(PROMPTS[0] * 4) * 2)[:150]
    seq = engine.add_request("long", ids, _greedy(4))
    engine.step()
    assert seq.num_computed == 16 and engine.last_step.num_prefill_tokens == 16
    engine.step()
    assert seq.num_computed == 32
    engine.abort("long")
    assert engine.kv.allocated == engine.kv.prefix.capacity and not engine.has_unfinished()
    engine.step()                                        # an empty step is harmless


def test_generators_live_on_the_model_device(pair, monkeypatch):
    """Sampling a request on CUDA needs its generator there (torch.rand(..., generator=cpu_gen, device=cuda)
    fails): the sequence's generator is created on the engine's device."""
    import specdec.engine.sequence as sequence_mod

    target, _ = pair
    made = []

    class FakeGenerator:
        def __init__(self, device="cpu"):
            made.append(torch.device(device))

        def manual_seed(self, seed):
            return self

    engine = _engine(target)
    engine.device = torch.device("cuda")                 # pretend: nothing runs, only the sequence is made
    monkeypatch.setattr(sequence_mod.torch, "Generator", FakeGenerator)
    engine.add_request("x", target.tokenizer.encode(PROMPTS[1]), SamplingParams(temperature=1.0, seed=3))
    assert made == [torch.device("cuda")]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sampled_batch_on_cuda(tiny_dirs):
    target = load_model(str(tiny_dirs["target"]), dtype="float32", device="cuda", progress=False)
    engine = LLMEngine(EngineConfig(target.model, target.tokenizer, target.model, SchedulerConfig()))
    ids = target.tokenizer.encode(PROMPTS[0])
    seqs = [engine.add_request(f"c{i}", ids, SamplingParams(max_tokens=16, temperature=0.8, seed=i),
                               SpeculativeConfig("draft", 3, draft_p_min=0.0)) for i in range(4)]
    seqs.append(engine.add_request("g", ids, _greedy(16), SpeculativeConfig("ngram", 3)))
    _drain(engine, seqs)
    assert all(s.generator.device.type == "cuda" for s in seqs)
    assert all(len(s.output_ids) == 16 for s in seqs)


def test_batch_aware_k_falls_as_rows_stop_being_free():
    cost = CostModel(draft_step=0.3, verify=[1.0, 1.0, 1.0, 1.0, 1.0, 1.02], verify_large=[[8, 1.3], [16, 2.2]])
    alone = StepBudget(cost).best("draft", 0.8, 4)[0]
    full = StepBudget(cost, rows=8, tokens=8.0).best("draft", 0.8, 4)[0]
    assert alone >= 3 and full == 0
    # lookup (no draft cost) still pays a little longer than the draft does
    assert StepBudget(cost, rows=4, tokens=4.0).best("ngram", 0.8, 4)[0] >= \
        StepBudget(cost, rows=4, tokens=4.0).best("draft", 0.8, 4)[0]


def test_a_short_prompt_is_not_queued_behind_a_long_one(pair):
    """Issue 38, 7: while a long prompt prefills chunk by chunk, a short one that arrives later is prefilled in the
    next step (prompts that finish this step go first), and its output is what it would be alone."""
    target, _ = pair
    engine = _engine(target, max_num_batched_tokens=32, max_num_seqs=4, itl_target_s=None)
    long_ids = (target.tokenizer.encode(PROMPTS[0] * 4) * 4)[:200]
    short_ids = target.tokenizer.encode(PROMPTS[1])
    assert len(short_ids) < 32
    long = engine.add_request("long", long_ids, _greedy(4))
    engine.step()
    short = engine.add_request("short", short_ids, _greedy(6))
    engine.step()
    assert short.num_computed == len(short_ids) and long.num_computed == 32 + (32 - len(short_ids))
    out = _drain(engine, [long, short])
    alone = _engine(target)
    assert _drain(alone, [alone.add_request("a", short_ids, _greedy(6))])[0] == out[1]


def test_prompt_chunks_shrink_to_the_itl_target_while_streams_decode():
    """With a stream decoding, a step's prompt tokens are what fits in itl_target_s at the measured cost of prompt
    tokens (at least MIN_CHUNK); with nothing decoding, the whole budget."""
    from specdec.engine.scheduler import MIN_CHUNK, Scheduler

    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=512, itl_target_s=0.5), kv=None)
    assert sched.prompt_budget(511, decoding=True) == 511          # nothing measured yet
    sched.observe([], 0.06)                                        # a decode step: 60 ms
    sched.observe([(0, 512)], 0.06 + 512 * 0.007)                  # a chunk: 7 ms a prompt token
    assert sched.chunk_cost.seconds(0, 512) == pytest.approx(512 * 0.007)
    assert sched.prompt_budget(511, decoding=True) == int((0.5 - 0.06) / 0.007)
    assert sched.prompt_budget(511, decoding=False) == 511
    sched.observe([(0, 512)], 512 * 10.0)                          # a very slow machine: still progress
    assert sched.prompt_budget(511, decoding=True) == MIN_CHUNK
    off = Scheduler(SchedulerConfig(itl_target_s=None), kv=None)
    off.observe([(0, 512)], 5.0)
    assert off.prompt_budget(511, decoding=True) == 511
    with pytest.raises(ValueError, match="itl_target_s"):
        SchedulerConfig(itl_target_s=0)


def test_chunks_are_priced_at_their_context():
    """Chunks of a long prompt, each costing a per token plus b per token and key before it: the fit recovers a and
    b, and a chunk at 4k tokens of context gets fewer tokens than one at the start, each within the step's room."""
    from specdec.engine.scheduler import ChunkCost, Scheduler

    a, b = 0.006, 0.5e-6                      # 6 ms a token, +0.5 us per key: a token at 4k costs 1.33x one at 0
    cost = ChunkCost()
    start = 0
    for n in (128, 96, 160, 128, 64, 128, 192, 128):
        cost.observe([(start, n)], n * (a + b * (start + n / 2)))
        start += n
    assert cost.a == pytest.approx(a, rel=1e-6) and cost.b == pytest.approx(b, rel=1e-6)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=512, itl_target_s=0.8), kv=None)
    sched.observe([], 0.1)
    sched.chunk_cost = cost
    room = 0.8 - 0.1
    near, far = sched.prompt_budget(511, True, start=0), sched.prompt_budget(511, True, start=4096)
    assert far < near
    for s, n in ((0, near), (4096, far)):
        assert cost.seconds(s, n) <= room < cost.seconds(s, n + 1)
    # chunks all at one context: the cost per token there, whatever the split
    flat = ChunkCost()
    for _ in range(4):
        flat.observe([(1000, 100)], 100 * 0.008)
    assert flat.seconds(1000, 100) == pytest.approx(0.8) and flat.b == 0.0


def test_a_long_prompt_does_not_stall_a_running_stream(pair):
    """In the engine: a stream decodes while a long prompt prefills; once the prefill speed is measured, the steps
    that carry prompt chunks beside the stream carry no more than the ITL target allows."""
    target, _ = pair
    engine = _engine(target, max_num_batched_tokens=64, max_num_seqs=4, itl_target_s=0.5)
    engine.scheduler.observe([], 0.1)
    engine.scheduler.observe([(0, 64)], 0.1 + 64 * 0.02)            # as if prompt tokens cost 20 ms each here
    stream = engine.add_request("stream", target.tokenizer.encode(PROMPTS[2]), _greedy(40))
    while not stream.output_ids:
        engine.step()
    from specdec.engine.scheduler import ChunkCost

    engine.scheduler.chunk_cost, engine.scheduler.decode_step_s = ChunkCost(), 0.1     # keep the pretend speed
    engine.scheduler.chunk_cost.observe([(0, 64)], 64 * 0.02)
    engine.scheduler.observe = lambda *a: None
    long = engine.add_request("long", (target.tokenizer.encode(PROMPTS[0] * 4) * 4)[:200], _greedy(2))
    chunks = []
    while long.prefilling or long.num_computed == 0:
        engine.step()
        chunks.append(engine.last_step.num_prefill_tokens)
    assert max(chunks) == int((0.5 - 0.1) / 0.02) and sum(chunks) == 200
    _drain(engine, [stream, long])
