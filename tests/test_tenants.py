"""Tenants kept apart: `cache_salt` (vLLM's request field) and API keys partition the prefix cache and the suffix
pools, so a request never gets cached tokens or suffix drafts from another tenant's requests; one salt shares."""
import hashlib

import httpx
import pytest
from model_cache import private_cache

from specdec.config import SpeculativeConfig
from specdec.engine import EngineConfig, LLMEngine
from specdec.models.loader import load_model
from specdec.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
_rid = iter(range(10**9))


@pytest.fixture(scope="module")
def target(tiny_dirs, tmp_path_factory):
    with private_cache(tmp_path_factory):
        return load_model(str(tiny_dirs["target"]), dtype="bfloat16", device="cpu", progress=False)


def _run(engine, prompts, salts, method="none"):
    seqs = [engine.add_request(f"r{next(_rid)}", p, GREEDY, SpeculativeConfig(method=method), pool="code",
                               cache_salt=s) for p, s in zip(prompts, salts)]
    while not all(s.finished for s in seqs):
        assert all(o.error is None for o in engine.step())
    return seqs


def test_two_salts_never_share_cached_tokens_while_one_salt_does(target):
    engine = LLMEngine(EngineConfig(target.model, target.tokenizer))
    prompt = target.tokenizer.encode("def fibonacci(n):\n    # a long shared system prompt " * 2)
    first = _run(engine, [prompt], ["tenant-a"])[0]
    assert first.stats.cached_tokens == 0
    # the same prompt: another salt, no salt, then the first salt again
    other, unsalted, same = (_run(engine, [prompt], [s])[0] for s in ("tenant-b", None, "tenant-a"))
    assert other.stats.cached_tokens == 0 and unsalted.stats.cached_tokens == 0
    assert same.stats.cached_tokens == len(prompt) - 1
    assert other.output_ids == first.output_ids == same.output_ids          # the salt changes reuse, not answers
    # a conversation's next turn under its own salt reuses the whole history; under another, nothing
    turn2 = prompt + first.output_ids + target.tokenizer.encode(" and now memoize it")
    mine, theirs = (_run(engine, [turn2], [s])[0] for s in ("tenant-a", "tenant-c"))
    assert mine.stats.cached_tokens >= len(prompt) + len(first.output_ids) - 1 and theirs.stats.cached_tokens == 0


def test_a_running_prompt_is_shared_only_within_its_salt(target):
    """Two requests with one long prompt in the same batch: the second copies the first's computed prompt only
    when their salts agree."""
    prompt = target.tokenizer.encode("class Cache:\n    '''an LRU cache with eviction and statistics''' " * 3)
    for salts, shared in ((["x", "x"], True), (["x", "y"], False)):
        engine = LLMEngine(EngineConfig(target.model, target.tokenizer))
        engine.sched_cfg.max_num_batched_tokens = 64         # the prompt takes several steps: both run together
        a, b = _run(engine, [prompt, prompt], salts)
        assert (b.stats.cached_tokens > 0) == shared and a.output_ids == b.output_ids


def test_suffix_pools_are_partitioned_by_salt(target):
    engine = LLMEngine(EngineConfig(target.model, target.tokenizer))
    prompt = target.tokenizer.encode("def add(a, b):")
    _run(engine, [prompt], ["tenant-a"], method="suffix")
    pools = engine.proposers["suffix"].pools
    assert "code" not in pools and len(pools) == 1          # the salted pool's name keeps no raw salt
    assert "tenant-a" not in next(iter(pools))
    engine.reset_prefix_cache()                              # so the second request decodes every token again
    same = _run(engine, [prompt], ["tenant-a"], method="suffix")[0]
    engine.reset_prefix_cache()
    other = _run(engine, [prompt], ["tenant-b"], method="suffix")[0]
    assert same.output_ids == other.output_ids
    assert same.stats.accepted_tokens >= 8                   # its pool saw this answer
    assert other.stats.accepted_tokens < same.stats.accepted_tokens


def test_server_salts_and_keys_are_tenants(tiny_dirs):
    from server_utils import running_server

    from specdec import LLM

    llm = LLM(target=str(tiny_dirs["target"]), dtype="float32", progress=False)
    keys = {"key-a": "ta", "key-b": "tb", "key-c": "team-1", "key-d": "team-1"}
    with running_server(llm, SpeculativeConfig(method="none"), api_keys=keys) as (url, state):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Write a cache class " * 10}],
                "max_tokens": 4, "temperature": 0}

        def cached(key, **extra):
            r = httpx.post(url + "/v1/chat/completions", json={**body, **extra}, timeout=60,
                           headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        assert cached("key-a") == 0
        assert cached("key-b") == 0                          # another key: another tenant
        assert cached("key-a") > 0                           # its own earlier request
        assert cached("key-a", cache_salt="s1") == 0         # a salt partitions within a tenant
        assert cached("key-b", cache_salt="s1") == 0         # ... and is never shared across tenants
        assert cached("key-a", cache_salt="s1") > 0
        assert cached("key-c") == 0 and cached("key-d") > 0  # two keys of one named tenant share
        for bad in (7, "", "s" * 1025, ["a"]):
            r = httpx.post(url + "/v1/chat/completions", json={**body, "cache_salt": bad}, timeout=60,
                           headers={"Authorization": "Bearer key-a"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", (bad, r.text)
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1,
                                                      "cache_salt": "ok"}, timeout=60,
                       headers={"Authorization": "Bearer key-e"})
        assert r.status_code == 401


def test_api_key_file(tmp_path):
    from specdec.errors import SpecDecError
    from specdec.server.launch import api_keys

    path = tmp_path / "keys"
    path.write_text("# key [tenant]\nalpha\nbeta team-1\n\ngamma team-1\n")
    got = api_keys(["delta"], str(path))
    assert got["beta"] == got["gamma"] == "team-1"
    assert got["alpha"] == hashlib.sha256(b"alpha").hexdigest()[:16] != got["delta"]
    assert api_keys(["only"], None) == {"only": ""}         # one key: one tenant, as before
    assert api_keys(None, None) == {}
    path.write_text("alpha one two\n")
    with pytest.raises(SpecDecError, match="--api-key-file"):
        api_keys(None, str(path))
    with pytest.raises(SpecDecError, match="--api-key-file"):
        api_keys(None, str(tmp_path / "missing"))
