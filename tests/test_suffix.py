"""Suffix decoding: matches against a pool's past outputs and the request itself, frequency-weighted continuation
trees, bounded pools that survive a restart, and exact verification (greedy parity through the engine)."""
import json

import numpy as np
import pytest
import torch

from specdec.config import SpeculativeConfig
from specdec.engine import EngineConfig, LLMEngine
from specdec.errors import SpecDecError
from specdec.proposers.base import ProposalContext
from specdec.proposers.suffix import (
    SEP,
    PoolCorpus,
    SuffixConfig,
    SuffixProposer,
    best_path,
    continuation_tree,
    match_ends,
)
from specdec.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
SAMPLED = SamplingParams(max_tokens=8, temperature=0.8)


def _ctx(ids, params=GREEDY, corpus="p"):
    return ProposalContext(0, list(ids), params, None, corpus=corpus)


def test_longest_match_and_its_continuations():
    corpus = np.array([5, 1, 2, 3, 9, SEP, 7, 2, 3, 4, SEP, 1, 2, 3, 9, 8], dtype=np.int32)
    n, ends = match_ends(corpus, np.array([1, 2, 3]), max_match=8, min_match=2)
    assert n == 3 and corpus[ends].tolist() == [9, 9]                # "1 2 3" twice, followed by 9 both times
    n, ends = match_ends(corpus, np.array([6, 2, 3]), max_match=8, min_match=2)
    assert n == 2 and sorted(corpus[ends].tolist()) == [4, 9, 9]      # "2 3" three times
    assert match_ends(corpus, np.array([4, 5]), 8, 2)[0] == 0         # "4 5": no occurrence of 2 tokens
    assert match_ends(corpus, np.array([3, 4]), 8, 2)[0] == 0         # "3 4" is followed by SEP only: nothing


def test_tree_is_weighted_by_frequency_and_cut_by_min_prob():
    corpus = np.array([1, 2, 3, SEP, 1, 2, 3, SEP, 1, 4, SEP, 1, 2, 5, SEP], dtype=np.int32)
    starts = np.array([1, 5, 9, 12])                                  # after each "1"
    tokens, parents, probs = continuation_tree([(corpus, starts)], depth=3, budget=8, min_prob=0.1)
    nodes = {(tokens[i], parents[i]): p for i, p in enumerate(probs)}
    two = tokens.index(2)
    assert nodes[(2, -1)] == pytest.approx(0.75) and nodes[(4, -1)] == pytest.approx(0.25)
    assert nodes[(3, two)] == pytest.approx(0.5) and nodes[(5, two)] == pytest.approx(0.25)
    assert all(p < i for i, p in enumerate(parents))                  # parents before children
    assert best_path(tokens, parents, probs) == [2, 3]
    tokens, _, _ = continuation_tree([(corpus, starts)], depth=3, budget=8, min_prob=0.3)
    assert sorted(tokens) == [2, 3]                                   # 4 and 5 hold a quarter each: cut
    assert continuation_tree([(corpus, starts)], depth=3, budget=2, min_prob=0.0)[0] == [2, 3]


def test_a_pool_drafts_what_it_generated_before():
    sp = SuffixProposer()
    answer = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    assert len(sp.propose([_ctx([1, 2, 10, 11])], [8])[0]) == 0      # nothing seen yet
    sp.learn("p", [1, 2], answer)
    chain = sp.propose([_ctx([3, 4, 10, 11, 12], SAMPLED)], [8])[0]
    assert chain.token_ids.tolist() == [13, 14, 15, 16, 17, 18] and chain.parents is None   # 2 x the 3-token match
    tree = sp.propose([_ctx([3, 4, 10, 11, 12])], [4])[0]
    assert tree.token_ids.tolist() == [13, 14, 15, 16] and tree.parents == [-1, 0, 1, 2]
    assert len(sp.propose([_ctx([3, 4, 10, 11, 12], corpus="other")], [8])[0]) == 0   # pools are apart
    # the request's own tokens count too (prompt lookup's source)
    own = sp.propose([_ctx([7, 8, 9, 6, 7, 8], SAMPLED, corpus="fresh")], [3])[0]
    assert own.token_ids.tolist() == [9, 6, 7]                       # k = 3 (the 2-token match allows 4)


def test_pools_are_bounded_and_survive_a_restart(tmp_path):
    sp = SuffixProposer(SuffixConfig(max_tokens=50, max_pools=2))
    for i in range(20):
        sp.learn("a", [], list(range(i, i + 9)))
    assert sp.pools["a"].size <= 50 and len(sp.pools["a"].requests) == 5     # the oldest requests left first
    sp.learn("b", [], [1, 2, 3])
    sp.learn("c", [], [4, 5, 6])
    assert list(sp.pools) == ["b", "c"]                                       # least recently used pool dropped
    assert sp.status()["tokens"] == 8 and sp.status()["bytes"] == 32
    path = tmp_path / "suffix.json"
    sp.save(str(path))
    again = SuffixProposer()
    again.load(str(path))
    assert [r.tolist() for r in again.pools["c"].requests] == [[4, 5, 6]]
    assert json.loads(path.read_text())["version"] == 1
    path.write_text("{broken")
    with pytest.raises(SpecDecError, match="--suffix-cache"):
        SuffixProposer().load(str(path))


def test_corpus_array_marks_request_boundaries():
    c = PoolCorpus(100)
    c.add([1, 2])
    c.add([3])
    assert c.array.tolist() == [1, 2, SEP, 3, SEP]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_greedy_parity_and_acceptance_from_the_pool(tiny_dirs, dtype):
    from specdec.models.loader import load_model

    target = load_model(str(tiny_dirs["target"]), dtype=dtype, device="cpu", progress=False)
    engine = LLMEngine(EngineConfig(target.model, target.tokenizer))
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    def run(rid, prompt, method, pool="code"):
        seq = engine.add_request(rid, prompt, params, SpeculativeConfig(method=method), pool=pool)
        while not seq.finished:
            assert all(o.error is None for o in engine.step())
        return seq

    prompts = [target.tokenizer.encode(t) for t in ("def add(a, b):", "class Cache:", "def add(x, y):")]
    plain = [run(f"n{i}", p, "none", pool=f"plain{i}").output_ids for i, p in enumerate(prompts)]
    for i, p in enumerate(prompts):
        assert run(f"s{i}", p, "suffix").output_ids == plain[i]
    again = run("again", prompts[0], "suffix")
    assert again.output_ids == plain[0]
    # the pool saw this answer: its drafts are accepted
    assert again.stats.accepted_tokens >= 8 and again.stats.target_forwards < 20
    assert torch.is_tensor(engine.proposers["suffix"].propose([_ctx(again.token_ids[:-3], corpus="code")], [4])[0]
                           .token_ids)
