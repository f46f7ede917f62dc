"""Our Qwen2 forward vs the transformers reference; KV cache rollback; multi-token forward."""
import torch

from specdec.models.loader import load_model


def _hf_logits(directory, ids):
    from transformers import Qwen2ForCausalLM

    ref = Qwen2ForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0]


def test_logits_match_transformers_tiny(tiny_dirs, tiny_models):
    target, _ = tiny_models
    ids = target.tokenizer.encode("def add(a, b):\n    return a + b  你好")
    cache = target.model.new_kv_cache(64)
    ours = target.model.compute_logits(target.model(torch.tensor([ids]), torch.arange(len(ids))[None], cache))[0]
    ref = _hf_logits(tiny_dirs["target"], ids)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= 1e-4


def test_logits_match_transformers_unpacked(tiny_dirs):
    # the plain nn.Linear path (used on CUDA) must agree too
    lm = load_model(str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False, pack=False)
    ids = lm.tokenizer.encode("The quick brown fox")
    ours = lm.model.compute_logits(lm.model(torch.tensor([ids]), torch.arange(len(ids))[None],
                                            lm.model.new_kv_cache(32)))[0]
    assert (ours - _hf_logits(tiny_dirs["target"], ids)).abs().max().item() <= 1e-4


def _step(model, cache, tokens):
    pos = torch.arange(cache.length, cache.length + len(tokens))[None]
    return model.compute_logits(model(torch.tensor([tokens]), pos, cache))[0]


def test_rollback_regenerates_identical_logits_without_copying(tiny_models):
    model = tiny_models[0].model
    cache = model.new_kv_cache(64)
    prompt = [5, 17, 42, 8, 99, 3]
    _step(model, cache, prompt)
    first = _step(model, cache, [7, 11, 13])
    assert cache.length == len(prompt) + 3
    k_ptr, v_ptr, k_version = cache.k.data_ptr(), cache.v.data_ptr(), cache.k._version
    cache.rollback(len(prompt))
    assert cache.length == len(prompt)
    # rollback moved the length only: same storage, no write to it
    assert (cache.k.data_ptr(), cache.v.data_ptr(), cache.k._version) == (k_ptr, v_ptr, k_version)
    again = _step(model, cache, [7, 11, 13])
    assert torch.equal(first, again)
    # a different continuation after rollback must not see the stale entries
    cache.rollback(len(prompt))
    other = _step(model, cache, [21, 11, 13])
    fresh = model.new_kv_cache(64)
    _step(model, fresh, prompt)
    assert torch.allclose(other, _step(model, fresh, [21, 11, 13]), atol=1e-5)


def test_rollback_rejects_bad_lengths(tiny_models):
    import pytest

    cache = tiny_models[0].model.new_kv_cache(16)
    _step(tiny_models[0].model, cache, [1, 2, 3])
    with pytest.raises(ValueError):
        cache.rollback(4)
    with pytest.raises(ValueError):
        cache.rollback(-1)


def test_multi_token_forward_equals_one_at_a_time(tiny_models):
    model = tiny_models[0].model
    tokens = [5, 17, 42, 8, 99, 3, 61, 2]
    batched = _step(model, model.new_kv_cache(32), tokens)
    cache = model.new_kv_cache(32)
    single = torch.cat([_step(model, cache, [t]) for t in tokens])
    assert torch.allclose(batched, single, atol=1e-4)
    # and a multi-token forward on top of an existing prefix (what verification does)
    cache = model.new_kv_cache(32)
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
        cache = model.new_kv_cache(256)
        _step(model, cache, prefix)
        single = torch.cat([_step(model, cache, [t]) for t in tokens])
        for T in range(2, 10):
            cache.rollback(prefix_len)
            assert torch.equal(_step(model, cache, tokens[:T]), single[:T]), (prefix_len, T)
