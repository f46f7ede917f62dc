"""Engine behaviour on tiny models: greedy parity for every proposer, termination inside accepted runs,
seeded determinism, draft/target compatibility."""
import pytest
import torch

from specdec.config import SpeculativeConfig
from specdec.engine import EngineConfig, LLMEngine, RequestOutput, SchedulerConfig
from specdec.errors import SpecDecError
from specdec.models.loader import load_model
from specdec.policy import CostModel, PolicyConfig
from specdec.policy.decide import StepController
from specdec.proposers import check_compatible
from specdec.proposers.base import Draft, Proposer
from specdec.sampling_params import SamplingParams

PROMPT = "def add(a, b):\n    return a + b\n\nclass Cache:"


def _engine(target, draft=None, **sched):
    return LLMEngine(EngineConfig(target.model, target.tokenizer, None if draft is None else draft.model,
                     SchedulerConfig(**sched) if sched else None))


def _spec(method="none", k=None, p_min=0.0):
    """A chain of k: the tiny random draft gives no token 0.75 (the default draft_p_min would end every chain after
    its first token), so these tests ask for chains of the k they name unless they test p_min."""
    return SpeculativeConfig(method, k, draft_p_min=p_min)


def run(engine, ids, params, spec=None, request_id="r", on_step=None):
    seq = engine.add_request(request_id, ids, params, spec)
    while not seq.finished:
        for out in engine.step():
            if out.error is not None:
                raise out.error
        if on_step:
            on_step(seq)
    return RequestOutput(seq.prompt_ids, list(seq.output_ids), seq.text, seq.finish_reason, seq.stats)


def stream(engine, ids, params, spec=None):
    engine.add_request("s", ids, params, spec)
    while engine.has_unfinished():
        for out in engine.step():
            yield out.delta


def _ids(target, text=PROMPT):
    return target.tokenizer.encode(text)


class OracleProposer(Proposer):
    """Proposes the known greedy continuation (full acceptance), to drive multi-token commits."""
    name = "oracle"

    def __init__(self, prompt_len, continuation):
        self.prompt_len, self.continuation = prompt_len, continuation

    def propose(self, ctxs, ks):
        return [Draft(torch.tensor(self.continuation[len(c.token_ids) - self.prompt_len:][:k], dtype=torch.long))
                for c, k in zip(ctxs, ks)]


def _oracle_engine(target, cont, k=5):
    """An engine whose 'draft' proposer is the oracle (method draft)."""
    engine = _engine(target)
    engine.proposers["draft"] = OracleProposer(len(_ids(target)), cont)
    return engine, _spec("draft", k)


def _greedy(max_tokens=40, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_parity_of_the_draft_and_lookup_at_each_k(tiny_models, k):
    """k = 1, 3, 5 and the all-accepted path (every declared method: test_methods.py)."""
    target, draft = tiny_models
    ids = _ids(target)
    base = run(_engine(target), ids, _greedy())
    assert len(base.token_ids) == 40
    engines = {
        "ngram": (_engine(target), SpeculativeConfig("ngram", k, prompt_lookup_max=3)),
        "draft": (_engine(target, draft), _spec("draft", k)),    # an unrelated random draft
        "self": (_engine(target, target), _spec("draft", k)),    # draft == target: all accepted
    }
    for name, (engine, spec) in engines.items():
        out = run(engine, ids, _greedy(), spec)
        assert out.token_ids == base.token_ids, name
        assert out.text == base.text, name
    # the self-draft exercised the all-accepted path (bonus + consuming the last draft token)
    out = run(_engine(target, target), ids, _greedy(), _spec("draft", k))
    assert out.stats.acceptance_rate == 1.0
    assert out.stats.mean_accepted_length == pytest.approx(1 + k, abs=0.5)


def test_draft_p_min_ends_a_chain_after_an_unsure_token(tiny_models):
    """draft_p_min (llama.cpp's --draft-p-min): the draft model's chain stops after a token it gave less than p_min.
    The target drafting for itself is always right, so the chain's length is the rule's alone: every chain one token
    long where no token is that sure, k long where every token is; the output is plain decoding's either way."""
    target, _ = tiny_models
    ids = _ids(target)
    base = run(_engine(target), ids, _greedy())
    lengths = {}
    for p_min in (0.999, 1e-6):
        out = run(_engine(target, target), ids, _greedy(), _spec("draft", 4, p_min))
        assert out.token_ids == base.token_ids, p_min
        s = out.stats
        assert s.acceptance_rate == 1.0 and s.draft_steps > 0
        lengths[p_min] = s.draft_tokens / s.draft_steps
    assert lengths[0.999] == 1.0 and lengths[1e-6] > 3.5      # (the last steps' room is under 4)
    # a sampled request stops by its own q: the draws differ from plain decoding's, its chains stay short
    out = run(_engine(target, target), ids, SamplingParams(max_tokens=40, temperature=1.0, seed=3, ignore_eos=True),
              _spec("draft", 4, 0.999))
    assert out.stats.draft_tokens == out.stats.draft_steps > 0


def test_unsure_reads_the_drafts_own_distribution():
    from specdec.proposers.draft_model import unsure

    class Ctx:
        p_min = 0.5
    sure, flat = torch.tensor([[4.0, 0.0, 0.0]]), torch.zeros(1, 3)
    assert not unsure(sure, Ctx, []) and unsure(flat, Ctx, [])           # greedy: the softmax of the logits
    assert unsure(sure, Ctx, [torch.tensor([0.4, 0.3, 0.3])])            # sampled: the q the token was drawn from
    assert not unsure(flat, Ctx, [torch.tensor([0.6, 0.2, 0.2])])
    Ctx.p_min = 0.0
    assert not unsure(flat, Ctx, [])                                     # off


def _continuation(target, n=30):
    return run(_engine(target), _ids(target), _greedy(n)).token_ids


def test_eos_inside_accepted_run_ends_output(tiny_models):
    target, _ = tiny_models
    cont = _continuation(target)
    eos_pos = 6
    eos = cont[eos_pos]
    engine, spec = _oracle_engine(target, cont)
    engine.eos_ids = frozenset({eos})
    out = run(engine, _ids(target), SamplingParams(max_tokens=30, temperature=0), spec)
    first = cont.index(eos)
    assert out.token_ids == cont[: first + 1]
    assert out.finish_reason == "stop"
    assert out.stats.completion_tokens == first + 1


def test_stop_string_spanning_tokens_cuts_text(tiny_models):
    target, _ = tiny_models
    cont = _continuation(target)
    tok = target.tokenizer
    full = tok.decode(cont)
    # a stop string made of the end of token 4's text and the start of token 5's
    a, b = tok.decode(cont[:5]), tok.decode(cont[:6])
    stop = a[-2:] + b[len(a): len(a) + 2] if len(b) > len(a) + 1 else a[-3:]
    assert stop
    engine, spec = _oracle_engine(target, cont)
    out = run(engine, _ids(target), _greedy(30, stop=[stop]), spec)
    assert out.finish_reason == "stop"
    assert stop not in out.text
    assert out.text == full[: full.index(stop)]
    streamed = "".join(d.text for d in stream(engine, _ids(target), _greedy(30, stop=[stop]), spec))
    assert streamed == out.text


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 13])
def test_exact_max_tokens(tiny_models, max_tokens):
    target, _ = tiny_models
    cont = _continuation(target)
    engine, spec = _oracle_engine(target, cont)
    out = run(engine, _ids(target), _greedy(max_tokens), spec)
    assert len(out.token_ids) == max_tokens == out.stats.completion_tokens
    assert out.token_ids == cont[:max_tokens]
    assert out.finish_reason == "length"


def test_seeded_sampling_is_reproducible(tiny_models):
    target, draft = tiny_models
    ids = _ids(target)
    params = SamplingParams(max_tokens=30, temperature=0.9, top_p=0.95, seed=123, ignore_eos=True)
    runs = [run(_engine(target, draft), ids, params, _spec("draft", 3)) for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids
    other = run(_engine(target, draft), ids, SamplingParams(max_tokens=30, temperature=0.9, top_p=0.95, seed=124,
                                                             ignore_eos=True), _spec("draft", 3))
    assert other.token_ids != runs[0].token_ids


def test_draft_cache_follows_committed_tokens(tiny_models):
    target, draft = tiny_models
    engine = _engine(target, draft)
    lengths = []

    def check(seq):
        kv = engine.proposers["draft"].kv.caches.get(seq.seq_id)
        if kv is not None and not seq.finished:
            # the draft cache never holds a token that was not committed
            assert kv.length <= len(seq.token_ids)
            lengths.append(kv.length)

    run(engine, _ids(target), _greedy(20), _spec("draft", 4), on_step=check)
    assert lengths
    draft_kv = engine.proposers["draft"].kv
    assert draft_kv.num_seqs == 0 and draft_kv.allocated == 0       # released at the end
    assert engine.kv.num_seqs == 0 and engine.kv.allocated == engine.kv.prefix.capacity


@pytest.mark.parametrize("method", ["draft", "none"])
def test_the_draft_reads_the_prompt_in_the_steps_that_prefill_the_target(tiny_models, method):
    """A long prompt, prefilled in chunks: each chunk reaches the draft's cache in the step that prefills it in the
    target, so the first decode step feeds the draft one token (not the prompt); a request that does not draft
    with the model leaves the draft alone. Greedy output unchanged."""
    target, draft = tiny_models
    engine = _engine(target, draft, max_num_batched_tokens=16)
    ids = _ids(target, PROMPT * 4)
    assert len(ids) > 3 * 16
    seq = engine.add_request("r", ids, _greedy(12), _spec(method, 3))
    seen = []
    while seq.num_computed < len(ids):
        engine.step()
        kv = engine.proposers["draft"].kv.caches.get(seq.seq_id)
        seen.append((seq.num_computed, kv.length if kv is not None else 0))
    assert len(seen) >= 4
    assert all(d == (n if method == "draft" else 0) for n, d in seen), seen
    fed = []
    forward = engine.proposers["draft"].model.forward

    def counting(*a, **kw):
        fed.append(a[0].shape[-1] if a and hasattr(a[0], "shape") else None)
        return forward(*a, **kw)
    engine.proposers["draft"].model.forward = counting
    while not seq.finished:
        engine.step()
    engine.proposers["draft"].model.forward = forward
    if method == "draft":
        assert fed and max(x for x in fed if x is not None) <= 4     # the newest tokens only, never a prompt chunk
    plain = run(_engine(target), ids, _greedy(12), _spec("none"))
    assert seq.output_ids == plain.token_ids


def test_mismatched_draft_refused(tiny_dirs, tiny_models):
    target, _ = tiny_models
    other = load_model(str(tiny_dirs["other_vocab"]), dtype="float32", device="cpu", progress=False)
    with pytest.raises(SpecDecError, match="vocabular"):
        check_compatible(target.tokenizer, other.tokenizer, target.config.vocab_size, other.config.vocab_size)
    check_compatible(target.tokenizer, tiny_models[1].tokenizer, target.config.vocab_size,
                     tiny_models[1].config.vocab_size)


def test_prompt_longer_than_context_is_refused(tiny_models):
    target, _ = tiny_models
    with pytest.raises(SpecDecError, match="context window"):
        run(_engine(target), list(range(5, 5 + 300)), _greedy(4))


def test_ngram_lookup_prefers_longest_then_most_recent():
    from specdec.proposers.ngram import find_ngram_continuation

    assert find_ngram_continuation([1, 2, 3, 9, 1, 2], 2, 3, 1) == [3, 9]
    assert find_ngram_continuation([7, 1, 5, 8, 1, 6, 1], 2, 3, 1) == [6, 1]   # most recent "1"
    assert find_ngram_continuation([4, 5, 6, 4, 5, 7, 9, 4, 5], 3, 3, 2) == [7, 9, 4]
    assert find_ngram_continuation([1, 2, 3], 3, 3, 1) == []


def test_int8_draft_keeps_greedy_parity(tiny_dirs, tiny_models):
    target, _ = tiny_models
    draft = load_model(str(tiny_dirs["target"]), dtype="bfloat16", device="cpu", progress=False, quantize="int8")
    ids = _ids(target)
    base = run(_engine(target), ids, _greedy())
    out = run(_engine(target, draft), ids, _greedy(), _spec("draft", 4))
    assert out.token_ids == base.token_ids
    # an int8 copy of the target itself still agrees with it most of the time
    assert out.stats.acceptance_rate > 0.5


def test_int8_linear_close_to_float():
    from specdec.models.quant import Int8Linear

    torch.manual_seed(0)
    w, b, x = torch.randn(96, 64), torch.randn(96), torch.randn(5, 64)
    ref = torch.nn.functional.linear(x, w, b)
    out = Int8Linear(w, b, torch.float32)(x)
    assert (out - ref).abs().max() / ref.abs().max() < 0.02


def test_draft_with_same_size_but_different_token_text_refused(tiny_dirs, tiny_models, tmp_path):
    import json
    import shutil

    from specdec.tokenizer import Tokenizer

    target = tiny_models[0]
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(tiny_dirs["target"] / name, tmp_path / name)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]          # same size, two ids swapped
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    swapped = Tokenizer.from_hf_dir(tmp_path)
    assert swapped.vocab_size == target.tokenizer.vocab_size
    with pytest.raises(SpecDecError, match="token text differs"):
        check_compatible(target.tokenizer, swapped, target.config.vocab_size, target.config.vocab_size)


class _AlternatingController(StepController):
    """A scripted step controller (through the real one's choose_step / observe_step): lookup's guess on every
    other step (when there is one), the draft otherwise; the guess is the known continuation, every third one wrong
    from its second token on (partial acceptance); keeps what the engine reports."""

    def __init__(self, k, prompt_len, continuation):
        super().__init__("draft", k, 0.8, CostModel(draft_step=0.1, verify=[1.0] * 10), PolicyConfig())
        self.prompt_len, self.continuation, self.calls, self.i, self.seen = prompt_len, continuation, 0, 0, []

    def guess(self, token_ids, room, constraint):
        self.calls += 1
        done = len(token_ids) - self.prompt_len
        guess = list(self.continuation[done: done + room])
        if self.calls % 3 == 0 and len(guess) > 1:
            guess[1:] = [(t + 1) % 100 for t in guess[1:]]
        return 2, guess

    def plan(self, n, lookup_len, budget=None):
        self.i += 1
        return ("lookup", lookup_len) if self.i % 2 and lookup_len else ("draft", self.k)

    def observe(self, source, num_draft, num_accepted, n=0, lookup_len=0, lookup_matched=0):
        super().observe(source, num_draft, num_accepted, n, lookup_len, lookup_matched)
        self.k = 3                                      # keep drafting whatever the record says
        self.seen.append((source, num_draft, num_accepted, lookup_len, lookup_matched))


def test_draft_and_lookup_side_by_side_keep_parity_and_the_draft_cache_in_step(tiny_models):
    """Method auto's engine: lookup steps in between draft steps. A draft equal to the target must still have
    every token accepted (its cache catches up on the tokens lookup committed), and greedy output is unchanged."""
    target, _ = tiny_models
    ids = _ids(target)
    base = run(_engine(target), ids, _greedy(48))
    engine = _engine(target, target)
    seq = engine.add_request("auto", ids, _greedy(48), _spec("draft", 3))
    seq.spec.method, seq.spec.controller = "auto", (ctl := _AlternatingController(3, len(ids), base.token_ids))
    while not seq.finished:
        assert all(out.error is None for out in engine.step())
    assert seq.output_ids == base.token_ids
    lookups = [s for s in ctl.seen if s[0] == "lookup"]
    drafts = [s for s in ctl.seen if s[0] == "draft" and s[1]]
    assert lookups and drafts and seq.stats.lookup_steps == len(lookups)
    assert all(acc == nd for _, nd, acc, _, _ in drafts)            # self-draft: all accepted after catch-up
    assert all(acc == matched for _, _, acc, _, matched in lookups)  # a verified guess is scored by what was accepted
    assert any(acc < nd for _, nd, acc, _, _ in lookups)            # some guesses were partly rejected
    # a guess shadowed during a draft step is scored by its agreement with the committed tokens
    assert all(matched <= min(length, nd + 1) for s, nd, _, length, matched in ctl.seen if s == "draft")
