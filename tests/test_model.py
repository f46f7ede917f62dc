"""Our Qwen2 forward vs the transformers reference; KV cache truncation; multi-token and multi-sequence forwards."""
import pytest
import torch

from specdec.models.kv_manager import KVManager
from specdec.models.loader import load_model
from specdec.models.runner import Span, forward_once, forward_spans


class _Cache:
    """One sequence's cache through the KV manager, as the engine uses it."""

    def __init__(self, model, seq_id=0, manager=None):
        self.model, self.id = model, seq_id
        self.mgr = manager or KVManager(model, 4096)

    @property
    def kv(self):
        return self.mgr.get(self.id)

    @property
    def length(self):
        return self.kv.length

    def rollback(self, n):
        self.mgr.truncate(self.id, n)

    def span(self, tokens):
        kv = self.mgr.ensure(self.id, self.kv.length + len(tokens))
        return Span(kv, kv.length, list(tokens), "all")


def _hf_logits(directory, ids):
    from transformers import Qwen2ForCausalLM

    ref = Qwen2ForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0]


def test_logits_match_transformers_tiny(tiny_dirs, tiny_models):
    target, _ = tiny_models
    ids = target.tokenizer.encode("def add(a, b):\n    return a + b  你好")
    ours = forward_once(target.model, ids)
    ref = _hf_logits(tiny_dirs["target"], ids)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= 1e-4


def test_logits_match_transformers_unpacked(tiny_dirs):
    # the plain nn.Linear path (used on CUDA) must agree too
    lm = load_model(str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False, pack=False)
    ids = lm.tokenizer.encode("The quick brown fox")
    ours = forward_once(lm.model, ids)
    assert (ours - _hf_logits(tiny_dirs["target"], ids)).abs().max().item() <= 1e-4


def _step(model, cache, tokens):
    span = cache.span(tokens)
    logits = forward_spans(model, [span])[0]
    cache.mgr.commit(cache.id, span.start + len(tokens))
    return logits


def test_rollback_regenerates_identical_logits_without_copying(tiny_models):
    model = tiny_models[0].model
    cache = _Cache(model)
    prompt = [5, 17, 42, 8, 99, 3]
    _step(model, cache, prompt)
    first = _step(model, cache, [7, 11, 13])
    assert cache.length == len(prompt) + 3
    kv = cache.kv
    k_ptr, v_ptr, k_version = kv.k.data_ptr(), kv.v.data_ptr(), kv.k._version
    cache.rollback(len(prompt))
    assert cache.length == len(prompt)
    # rollback moved the length only: same storage, no write to it
    assert (kv.k.data_ptr(), kv.v.data_ptr(), kv.k._version) == (k_ptr, v_ptr, k_version)
    again = _step(model, cache, [7, 11, 13])
    assert torch.equal(first, again)
    # a different continuation after rollback must not see the stale entries
    cache.rollback(len(prompt))
    other = _step(model, cache, [21, 11, 13])
    fresh = _Cache(model)
    _step(model, fresh, prompt)
    assert torch.allclose(other, _step(model, fresh, [21, 11, 13]), atol=1e-5)


def test_rollback_rejects_bad_lengths(tiny_models):
    cache = _Cache(tiny_models[0].model)
    _step(tiny_models[0].model, cache, [1, 2, 3])
    with pytest.raises(ValueError):
        cache.rollback(4)
    with pytest.raises(ValueError):
        cache.rollback(-1)


def test_multi_token_forward_equals_one_at_a_time(tiny_models):
    model = tiny_models[0].model
    tokens = [5, 17, 42, 8, 99, 3, 61, 2]
    batched = _step(model, _Cache(model), tokens)
    cache = _Cache(model)
    single = torch.cat([_step(model, cache, [t]) for t in tokens])
    assert torch.allclose(batched, single, atol=1e-4)
    # and a multi-token forward on top of an existing prefix (what verification does)
    cache = _Cache(model)
    _step(model, cache, tokens[:3])
    assert torch.allclose(_step(model, cache, tokens[3:]), batched[3:], atol=1e-4)


def test_bf16_verification_forward_is_bit_identical_to_one_token_steps(tiny_dirs):
    """On CPU (packed weights) every row of a multi-token forward equals the one-token step exactly."""
    lm = load_model(str(tiny_dirs["target"]), dtype="bfloat16", device="cpu", progress=False)
    model = lm.model
    assert model.min_query_rows > 1 and model.key_block > 1   # batch-invariant mode is on
    torch.manual_seed(0)
    for prefix_len in (5, 40, 61, 62, 63, 64, 100):
        prefix = torch.randint(0, 300, (prefix_len,)).tolist()
        tokens = torch.randint(0, 300, (9,)).tolist()
        cache = _Cache(model)
        _step(model, cache, prefix)
        single = torch.cat([_step(model, cache, [t]) for t in tokens])
        for T in range(2, 10):
            cache.rollback(prefix_len)
            assert torch.equal(_step(model, cache, tokens[:T]), single[:T]), (prefix_len, T)


def test_bf16_prompt_rows_do_not_depend_on_where_the_prompt_was_cut(tiny_dirs):
    """Chunked prefill: a prompt run in one forward or cut into chunks (as the scheduler's token budget cuts it)
    gives bit-identical rows; each row attends over its own key block, whatever else is in its chunk."""
    lm = load_model(str(tiny_dirs["target"]), dtype="bfloat16", device="cpu", progress=False)
    model = lm.model
    torch.manual_seed(3)
    tokens = torch.randint(0, 300, (150,)).tolist()
    whole = _step(model, _Cache(model), tokens)
    for cuts in ((100, 1, 1, 5, 43), (63, 2, 64, 21), (1,) * 10 + (140,)):
        cache, rows, at = _Cache(model), [], 0
        for n in cuts:
            rows.append(_step(model, cache, tokens[at: at + n]))
            at += n
        assert torch.equal(torch.cat(rows), whole), cuts


def test_attention_runs_split_rows_by_key_block():
    from specdec.models.attn_metadata import causal_metadata
    from specdec.models.kv_cache import SeqKV

    kv = SeqKV(1, 1, 4, torch.bfloat16)
    (seq,) = causal_metadata([(kv, 60, 9)], min_query_rows=6, key_block=64).seqs
    assert [(r.first, r.num_rows, r.key_len) for r in seq.runs] == [(0, 4, 64), (4, 5, 128)]
    assert seq.key_len == 128 and seq.runs[0].mask.shape == (6, 64)
    # row 1 of the first run (position 61) sees keys 0..61; padded query rows see every real key
    assert seq.runs[0].mask[1].tolist() == [True] * 62 + [False] * 2
    (one,) = causal_metadata([(kv, 0, 1)]).seqs             # fp32: one run over exactly the keys, no mask
    assert [(r.first, r.num_rows, r.key_len, r.mask) for r in one.runs] == [(0, 1, 1, None)]


def test_cache_grows_on_demand_keeping_its_contents(tiny_models):
    model = tiny_models[0].model
    mgr = KVManager(model, 64)
    cache = _Cache(model, manager=mgr)
    first = _step(model, cache, [5, 17, 42])
    assert cache.kv.capacity < 64 and mgr.allocated == cache.kv.capacity
    logits = [_step(model, cache, [t]) for t in range(1, 30)]       # grows (doubling) as it goes
    cache.rollback(3)
    assert torch.equal(_step(model, cache, [1]), logits[0])           # the prefix survived every resize
    from specdec.models.kv_manager import KVCapacityError
    with pytest.raises(KVCapacityError):
        mgr.ensure(0, 65)
    mgr.free_seq(0)
    assert mgr.allocated == 0 and first.shape[0] == 3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sequences_sharing_a_forward_get_their_own_rows_bit_identically(tiny_dirs, dtype):
    """Rows of one sequence do not depend on what else is in the forward: prefill chunks, plain steps and
    verification rows of other sequences beside it (the engine's batch invariance, at the model level)."""
    lm = load_model(str(tiny_dirs["target"]), dtype=dtype, device="cpu", progress=False)
    model = lm.model
    torch.manual_seed(1)
    prefixes = [torch.randint(0, 300, (n,)).tolist() for n in (7, 30, 64, 3)]
    news = [torch.randint(0, 300, (n,)).tolist() for n in (1, 5, 9, 40)]
    alone = []
    for p, t in zip(prefixes, news):
        c = _Cache(model)
        _step(model, c, p)
        alone.append(_step(model, c, t))
    mgr = KVManager(model, 4096)
    caches = [_Cache(model, i, mgr) for i in range(4)]
    for c, p in zip(caches, prefixes):
        _step(model, c, p)
    together = forward_spans(model, [c.span(t) for c, t in zip(caches, news)])
    for a, b in zip(alone, together):
        assert torch.equal(a, b)
