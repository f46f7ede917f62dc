"""Token trees: one target forward verifies a tree through per-row key lists; greedy acceptance follows the target's
argmax down the tree; the accepted path's K/V is compacted into place. Greedy output equals plain decoding for every
tree shape, in fp32 and bf16 (tree rows attend over the same keys, in the same order, as chain rows)."""
import pytest
import torch
from model_cache import private_cache
from test_heads import PROMPT, _eagle3, _medusa

from specdec.config import SpeculativeConfig
from specdec.engine import EngineConfig, LLMEngine
from specdec.models.loader import load_model
from specdec.models.runner import Span, forward_spans
from specdec.proposers.base import Draft, Proposer
from specdec.proposers.tree import TreeBuilder
from specdec.sampling.rejection import verify_tree_greedy
from specdec.sampling_params import SamplingParams


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def target(request, tiny_dirs, tmp_path_factory):
    with private_cache(tmp_path_factory):
        return load_model(str(tiny_dirs["target"]), dtype=request.param, device="cpu", progress=False)


def _add_children(b: TreeBuilder, parent: int, logprobs: torch.Tensor, token_ids: torch.Tensor) -> None:
    """The head's log-probabilities over its vocabulary [V'] after `parent`, token_ids [V'] their target ids: adds
    the topk best as children (what the proposers do for many rows at once)."""
    lp, idx = logprobs.topk(b.topk)
    b.add_top(parent, lp.tolist(), token_ids[idx].tolist())


def _kv(model, n):
    kv = model.new_kv()
    kv.resize(-(-n // model.key_block) * model.key_block)
    return kv


def test_tree_rows_equal_chain_rows_bitwise(target):
    model = target.model
    prompt = target.tokenizer.encode(PROMPT)
    chain = [7, 11, 13, 17]                          # the newest token, then a path of three
    # the same path inside a tree with decoys: rows 0 root, 1 decoy, 2 path[1], 3 decoy under 2, 4 path[2], 5 path[3]
    tree_tokens = [7, 5, 11, 19, 13, 17]
    parents = [-1, 0, 0, 2, 2, 4]
    logits = {}
    for name, toks, par in (("chain", chain, None), ("tree", tree_tokens, parents)):
        kv = _kv(model, len(prompt) + 8)
        forward_spans(model, [Span(kv, 0, prompt, "none")])
        logits[name] = forward_spans(model, [Span(kv, len(prompt), toks, "all", decode=True, parents=par)])[0]
    on_path = [0, 2, 4, 5]
    assert torch.equal(logits["tree"][on_path], logits["chain"])
    # a decoy row sees its own ancestors only: row 1 is the chain's second row with another token
    kv = _kv(model, len(prompt) + 8)
    forward_spans(model, [Span(kv, 0, prompt, "none")])
    alt = forward_spans(model, [Span(kv, len(prompt), [7, 5], "all", decode=True)])[0]
    assert torch.equal(logits["tree"][1], alt[1])


def test_tree_parents_must_come_first(target):
    kv = _kv(target.model, 16)
    with pytest.raises(ValueError, match="earlier row"):
        forward_spans(target.model, [Span(kv, 0, [1, 2, 3], "all", decode=True, parents=[-1, 2, 0])])


def test_verify_tree_greedy_follows_the_argmax():
    # nodes: 0:a(root) 1:b(root) 2:c(under 1) 3:d(under 1) 4:e(under 3)
    tokens, parents = [10, 20, 30, 40, 50], [-1, -1, 1, 1, 3]
    # rows: 0 root, node i at row i+1; target argmax per row
    argmax = [20, 0, 40, 0, 50, 99]
    path, emitted = verify_tree_greedy(argmax, tokens, parents)
    assert path == [1, 3, 4] and emitted == [20, 40, 50, 99]
    path, emitted = verify_tree_greedy([77, 0, 0, 0, 0, 0], tokens, parents)
    assert path == [] and emitted == [77]
    path, emitted = verify_tree_greedy([20, 0, 30, 0, 0, 0], tokens, parents)
    assert path == [1, 2] and emitted == [20, 30, 0]


def test_tree_builder_keeps_the_likeliest_nodes_with_their_ancestors():
    b = TreeBuilder(topk=2)
    ids = torch.arange(5)
    _add_children(b, -1, torch.tensor([0.6, 0.3, 0.05, 0.03, 0.02]).log(), ids)        # nodes 0 (tok 0), 1 (tok 1)
    assert b.pick_frontier(1) == [0, 1]
    _add_children(b, 0, torch.tensor([0.1, 0.1, 0.7, 0.05, 0.05]).log(), ids)          # 2: 0.42, 3: 0.06
    _add_children(b, 1, torch.tensor([0.05, 0.9, 0.02, 0.02, 0.01]).log(), ids)        # 4: 0.27, 5: 0.015
    tokens, parents = b.select(4)
    # kept: 0 (0.6), 2 (0.42), 1 (0.3), 4 (0.27); by depth: 0, 1, then 2 (under 0), 4 (under 1)
    assert tokens == [0, 1, 2, 1] and parents == [-1, -1, 0, 1]
    assert Draft(torch.tensor(tokens), None, parents).depth == 2


def test_tree_size_follows_the_measured_cost_of_rows():
    """Each kept node adds its path probability to the expected length and a row to the forward: with rows nearly
    free the whole budget is kept, with rows that cost the tree stops where tokens per unit of time peak."""
    b = TreeBuilder(topk=3)
    ids = torch.arange(6)
    _add_children(b, -1, torch.tensor([0.7, 0.2, 0.05, 0.03, 0.01, 0.01]).log(), ids)
    b.pick_frontier(1)
    for node in (0, 1, 2):
        _add_children(b, node, torch.tensor([0.6, 0.3, 0.05, 0.03, 0.01, 0.01]).log(), ids)
    assert len(b.select(8)[0]) == 8
    assert len(b.select(8, lambda n: 1.0 + 0.01 * (n - 1))[0]) == 8
    steep = lambda n: 1.0 + 0.5 * (n - 1)                       # noqa: E731 - every row half a forward
    tokens, parents = b.select(8, steep)
    # 1 node: (1 + 0.7) / 1.5 = 1.13; 2 nodes (+0.42): 2.12 / 2 = 1.06 -> one node
    assert tokens == [0] and parents == [-1]



def test_tree_grows_a_level_only_where_a_frontier_node_would_be_verified():
    b = TreeBuilder(topk=2)
    ids = torch.arange(6)
    _add_children(b, -1, torch.tensor([0.5, 0.3, 0.1, 0.05, 0.03, 0.02]).log(), ids)    # 0: 0.5, 1: 0.3
    b.pick_frontier(1)
    assert b.worth_growing(8)                                   # no cost model: the budget keeps both
    steep = lambda n: 1.0 + 0.5 * (n - 1)                       # noqa: E731 - one node kept: (1 + 0.5) / 1.5
    assert b.worth_growing(8, steep)                            # node 0 is kept, so its children may be
    _add_children(b, 0, torch.tensor([0.2, 0.2, 0.2, 0.2, 0.1, 0.1]).log(), ids)        # 2, 3: 0.1 each
    b.pick_frontier(2)
    assert b.frontier == [2, 3]
    assert not b.worth_growing(8, steep)                        # neither 0.1 node pays for its row
    assert b.worth_growing(8, lambda n: 1.0)                    # rows free: everything is kept
    assert not b.worth_growing(2)                               # a budget of 2 keeps 0 and 1 only

class OracleTree(Proposer):
    """A tree whose true path hides behind a decoy at every level (so compaction moves K/V): it knows the plain
    greedy output in advance."""
    name = "medusa"

    def __init__(self, prompt_len: int, truth: list[int], vocab: int):
        self.prompt_len, self.truth, self.vocab = prompt_len, truth, vocab

    def propose(self, ctxs, ks):
        out = []
        for ctx, k in zip(ctxs, ks):
            done = len(ctx.token_ids) - self.prompt_len
            nxt = self.truth[done: done + max(1, k // 2)]
            tokens, parents, parent = [], [], -1
            for t in nxt:
                if len(tokens) + 2 > k:
                    break
                tokens += [(t + 1) % self.vocab, t]                                     # a decoy, then the truth
                parents += [parent, parent]
                parent = len(tokens) - 1
            out.append(Draft(torch.tensor(tokens, dtype=torch.long), None, parents))
        return out


def _generate(engine, ids, spec, params=None, rid="r"):
    seq = engine.add_request(rid, ids, params or SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True), spec)
    while not seq.finished:
        for out in engine.step():
            if out.error is not None:
                raise out.error
    return seq


def test_accepted_paths_behind_decoys_are_compacted(target):
    """The oracle's tree holds the truth behind a decoy at each level: accepted paths are rows 2, 4, 6, so the cache
    must be compacted for the following steps to stay exact."""
    ids = target.tokenizer.encode(PROMPT)
    engine = LLMEngine(EngineConfig(target.model, target.tokenizer))
    base = _generate(engine, ids, SpeculativeConfig("none")).output_ids
    engine.proposers["medusa"] = OracleTree(len(ids), base, target.tokenizer.vocab_size)
    seq = _generate(engine, ids, SpeculativeConfig("medusa", 6, eagle_topk=2, num_steps=3))
    assert seq.output_ids == base
    assert seq.stats.accepted_tokens >= seq.stats.draft_steps      # at least one accepted per step: paths were kept
    assert seq.stats.mean_accepted_length > 2.0


@pytest.mark.parametrize("k,topk,steps", [(3, 2, 2), (6, 2, 3), (8, 4, 4), (5, 3, 1)])
def test_greedy_parity_for_tree_shapes(target, k, topk, steps):
    ids = target.tokenizer.encode(PROMPT)
    model = target.model
    dtype = model.embed_tokens.weight.dtype
    heads = {"eagle3": _eagle3(model).to(dtype), "medusa": _medusa(model, truncated=150).to(dtype)}
    engine = LLMEngine(EngineConfig(model, target.tokenizer, heads=heads))
    base = _generate(engine, ids, SpeculativeConfig("none")).output_ids
    for method in ("eagle3", "medusa"):
        seq = _generate(engine, ids, SpeculativeConfig(method, k, eagle_topk=topk, num_steps=steps))
        assert seq.output_ids == base, method
        assert seq.stats.draft_tokens > 0


def test_trees_batched_with_sampled_and_chain_requests(target):
    """Tree, chain and sampled requests of one head share steps; greedy outputs equal plain decoding and a sampled
    request (verified as a chain) equals the same request run alone."""
    ids = target.tokenizer.encode(PROMPT)
    model = target.model
    dtype = model.embed_tokens.weight.dtype
    engine = LLMEngine(EngineConfig(model, target.tokenizer, heads={"eagle3": _eagle3(model).to(dtype)}))
    base = _generate(engine, ids, SpeculativeConfig("none")).output_ids
    sampled = SamplingParams(max_tokens=30, temperature=0.8, seed=3, ignore_eos=True)
    alone = _generate(engine, ids, SpeculativeConfig("eagle3", 6, eagle_topk=3), sampled).output_ids
    seqs = [engine.add_request("t", ids, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
                               SpeculativeConfig("eagle3", 6, eagle_topk=3)),
            engine.add_request("c", ids[:-2], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
                               SpeculativeConfig("eagle3", 3)),
            engine.add_request("s", ids, sampled, SpeculativeConfig("eagle3", 6, eagle_topk=3))]
    while not all(s.finished for s in seqs):
        for out in engine.step():
            assert out.error is None, out.error
    assert seqs[0].output_ids == base
    assert seqs[1].output_ids == _generate(engine, ids[:-2], SpeculativeConfig("none"), rid="c2").output_ids
    assert seqs[2].output_ids == alone


def test_tree_config_is_checked():
    with pytest.raises(ValueError, match="needs a method that drafts trees: draft or eagle3 or eagle or medusa"):
        SpeculativeConfig("ngram", 4, eagle_topk=2)
    with pytest.raises(ValueError, match="num_steps"):
        SpeculativeConfig("eagle3", 4, eagle_topk=2, num_steps=5)
    assert SpeculativeConfig("eagle3", 8, eagle_topk=4).num_steps == 4
    assert SpeculativeConfig("eagle3", 3).num_steps == 3


def test_eager_tree_attention_matches_the_compiled_one(tiny_models, monkeypatch):
    """Without specdec._C (CUDA, or no compiler) a tree's rows take SDPA with the key lists as a mask."""
    from specdec.models import cpu_ops

    model = tiny_models[0].model                   # fp32
    prompt = tiny_models[0].tokenizer.encode(PROMPT)
    toks, parents = [7, 5, 11, 19, 13, 17], [-1, 0, 0, 2, 2, 4]

    def run():
        kv = _kv(model, len(prompt) + 8)
        forward_spans(model, [Span(kv, 0, prompt, "none")])
        return forward_spans(model, [Span(kv, len(prompt), toks, "all", decode=True, parents=parents)])[0]

    compiled = run()
    monkeypatch.setattr(cpu_ops, "_ops", lambda: None)
    eager = run()
    assert torch.allclose(eager, compiled, atol=1e-4, rtol=1e-4)


def test_sampled_requests_verify_chains_never_trees(target):
    """Trees are verified by argmax, exact for greedy requests only: a head drafts a chain for a sampled request
    (verified by rejection sampling, statistically exact: tests/test_sampler.py), and a tree a proposer returns
    for one anyway is dropped, not verified."""
    from specdec.proposers.base import ProposalContext

    model = target.model
    dtype = model.embed_tokens.weight.dtype
    ids = target.tokenizer.encode(PROMPT)
    engine = LLMEngine(EngineConfig(model, target.tokenizer, heads={"eagle3": _eagle3(model).to(dtype)}))
    sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
    seq = _generate(engine, ids, SpeculativeConfig("eagle3", 6, eagle_topk=3, num_steps=2), sampled)
    assert seq.stats.draft_tokens > 0
    assert len(seq.stats.drafted_per_position) == 2          # the chain is as long as the tree is deep, not k
    proposer = engine.proposers["eagle3"]
    proposer.accept_hidden(99, 0, {i: torch.zeros(len(ids) - 1, model.config.hidden_size, dtype=dtype)
                                   for i in proposer.target_hidden})
    ctx = ProposalContext(99, list(ids), sampled, torch.Generator().manual_seed(0), None, 3, 3)
    assert not ctx.tree and proposer.propose([ctx], [6])[0].parents is None
    proposer.release(99)
    plain = _generate(engine, ids, SpeculativeConfig("none"), sampled, rid="plain").output_ids
    engine.proposers["medusa"] = OracleTree(len(ids), plain, target.tokenizer.vocab_size)
    seq = _generate(engine, ids, SpeculativeConfig("medusa", 6, eagle_topk=2, num_steps=3), sampled, rid="o")
    assert seq.stats.draft_tokens == 0 and seq.output_ids == plain


def test_llm_sizes_trees_with_its_measured_cost_model(tiny_dirs, tmp_path, monkeypatch):
    """Through `LLM`, a head's trees are sized by the cost model measured on this machine; output stays exact."""
    from specdec import LLM
    from specdec.models.heads import save_head, target_fingerprint

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    probe = LLM(target=str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False)
    save_head(_medusa(probe.target.model, truncated=150), "medusa", tmp_path / "m",
              {"specdec_target_fingerprint": target_fingerprint(probe.target.model)})
    llm = LLM(target=str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False,
              heads={"medusa": str(tmp_path / "m")})
    assert llm.engine.row_cost is not None and llm.row_cost(1) == 1.0 and llm.row_cost(9) >= 1.0
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    ids = llm.encode(PROMPT)
    plain = llm.generate(ids, params, spec="none")[0].token_ids
    out = llm.generate(ids, params, spec=SpeculativeConfig("medusa", 8, eagle_topk=3, num_steps=3))[0]
    assert out.token_ids == plain and out.stats.draft_tokens > 0


@pytest.fixture(scope="module")
def draft_of(target, tiny_dirs, tmp_path_factory):
    """The tiny draft model in the target's dtype."""
    with private_cache(tmp_path_factory):
        return load_model(str(tiny_dirs["draft"]), dtype=str(target.model.embed_tokens.weight.dtype)[6:],
                          device="cpu", progress=False)


class _Spy:
    """Wraps a proposer's propose: keeps every draft it returns."""
    def __init__(self, proposer):
        self.drafts, self.propose_of = [], proposer.propose

    def __call__(self, ctxs, ks):
        out = self.propose_of(ctxs, ks)
        self.drafts += out
        return out


def test_draft_model_trees_keep_parity_beside_chains_and_sampled_requests(target, draft_of):
    """The draft model grows a token tree level by level for a greedy request with eagle_topk > 1 (branching
    where its top-1 is unsure), in the same batched forwards as a chain request; greedy outputs equal plain
    decoding, and a sampled request with eagle_topk > 1 (verified as a chain) equals the same request alone."""
    tok = target.tokenizer
    ids = tok.encode(PROMPT)
    engine = LLMEngine(EngineConfig(target.model, tok, draft_of.model))
    spy = _Spy(engine.proposers["draft"])
    engine.proposers["draft"].propose = spy
    base = _generate(engine, ids, SpeculativeConfig("none")).output_ids
    base_c = _generate(engine, ids[:-2], SpeculativeConfig("none"), rid="pc").output_ids
    sampled = SamplingParams(max_tokens=30, temperature=0.8, seed=3, ignore_eos=True)
    alone = _generate(engine, ids, SpeculativeConfig("draft", 6, eagle_topk=3), sampled, rid="sa").output_ids
    greedy = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    spy.drafts.clear()
    seqs = [engine.add_request("t", ids, greedy, SpeculativeConfig("draft", 8, eagle_topk=3, num_steps=4)),
            engine.add_request("c", ids[:-2], greedy, SpeculativeConfig("draft", 4)),
            engine.add_request("s", ids, sampled, SpeculativeConfig("draft", 6, eagle_topk=3))]
    while not all(s.finished for s in seqs):
        for out in engine.step():
            assert out.error is None, out.error
    assert seqs[0].output_ids == base and seqs[1].output_ids == base_c and seqs[2].output_ids == alone
    trees = [d for d in spy.drafts if d.parents is not None]
    assert trees and all(len(d) <= 8 and d.depth <= 4 for d in trees)
    assert any(len(set(p for p in d.parents)) < len(d.parents) for d in trees)      # some node has two children
    assert seqs[0].stats.draft_tokens > 0 and not engine.proposers["draft"].tree_base   # nothing left behind


def test_a_draft_model_tree_follows_the_targets_argmax_when_the_draft_is_the_target(target):
    """With the target as its own draft, every tree holds the target's greedy path (the likeliest child at every
    level): a wrong slot, position or key list for a tree row would show as rejected tokens."""
    tok = target.tokenizer
    ids = tok.encode(PROMPT)
    engine = LLMEngine(EngineConfig(target.model, tok, target.model))
    base = _generate(engine, ids, SpeculativeConfig("none")).output_ids
    seq = _generate(engine, ids, SpeculativeConfig("draft", 6, eagle_topk=2, num_steps=3), rid="self")
    assert seq.output_ids == base
    # each verification accepts the whole top-1 path the tree kept: 3 tokens + the bonus where it kept all 3
    assert seq.stats.mean_accepted_length >= 3.0, seq.stats
