"""Learned draft heads (EAGLE-3, Medusa) on tiny random models: greedy parity, the head's inference forward against
its training forward, loading the layouts users have, refusals with precise messages, and a training run."""
import json

import pytest
import torch

from specdec.config import SpeculativeConfig
from specdec.engine import EngineConfig, LLMEngine
from specdec.errors import SpecDecError
from specdec.models.attn_metadata import causal_metadata
from specdec.models.eagle3 import Eagle3Config, Eagle3Head, default_aux_layers
from specdec.models.heads import load_head, save_head, target_fingerprint
from specdec.models.medusa import MedusaConfig, MedusaHeads
from specdec.models.runner import Span, forward_spans
from specdec.sampling_params import SamplingParams

PROMPT = "def add(a, b):\n    return a + b\n\nclass Cache:"


def _eagle3(target, draft_vocab=200, seed=0, std=0.2):
    c = target.config
    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Config(c.hidden_size, 96, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size,
                                   draft_vocab, aux_layers=default_aux_layers(c.num_layers)))
    for p in head.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, 0, std)
    head.set_vocab(torch.randperm(c.vocab_size)[:draft_vocab].sort().values)
    return head


def _medusa(target, heads=3, truncated=0, seed=0):
    c = target.config
    torch.manual_seed(seed)
    m = MedusaHeads(MedusaConfig(c.hidden_size, c.vocab_size, heads, 1, truncated))
    for p in m.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, 0, 0.2)
    if truncated:
        m.token_map.copy_(torch.randperm(c.vocab_size)[:truncated].sort().values)
    return m


@pytest.fixture(scope="module")
def heads(tiny_models, tmp_path_factory):
    """A random EAGLE-3 head and Medusa heads for the tiny target, saved and loaded back as users' heads are."""
    target, _ = tiny_models
    base = tmp_path_factory.mktemp("heads")
    save_head(_eagle3(target.model), "eagle3", base / "e3",
              {"specdec_target_fingerprint": target_fingerprint(target.model)})
    save_head(_medusa(target.model, truncated=150), "medusa", base / "med")
    return {"eagle3": load_head(base / "e3", target.model, torch.float32).module,
            "medusa": load_head(base / "med", target.model, torch.float32).module, "dir": base}


def _run(engine, ids, method, k, params=None, rid="r"):
    seq = engine.add_request(rid, ids, params or SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
                             SpeculativeConfig(method, k))
    while not seq.finished:
        for out in engine.step():
            if out.error is not None:
                raise out.error
    return seq


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_parity_heads(tiny_models, heads, k):
    target, _ = tiny_models
    ids = target.tokenizer.encode(PROMPT)
    both = {"eagle3": heads["eagle3"], "medusa": heads["medusa"]}
    engine = LLMEngine(EngineConfig(target.model, target.tokenizer, heads=both))
    base = _run(engine, ids, "none", None).output_ids
    for method in ("eagle3", "medusa"):
        seq = _run(engine, ids, method, k)
        assert seq.output_ids == base, method
        assert seq.stats.draft_tokens > 0, method          # the head drafted every step


def test_heads_batched_beside_other_methods_keep_parity(tiny_models, heads):
    """Sequences of every method in one engine, stepping together, prompts of different lengths: each output is
    its plain greedy output (the head's states are routed per sequence)."""
    target, draft = tiny_models
    tok = target.tokenizer
    prompts = [tok.encode(PROMPT), tok.encode("class Cache:\n    def rollback(self, n):"), tok.encode("def f(x):")]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    plain = [_run(LLMEngine(EngineConfig(target.model, tok)), p, "none", None, params).output_ids for p in prompts]
    both = {"eagle3": heads["eagle3"], "medusa": heads["medusa"]}
    engine = LLMEngine(EngineConfig(target.model, tok, draft.model, heads=both))
    seqs = [engine.add_request(f"{m}{i}", p, params, SpeculativeConfig(m, 3))
            for m in ("eagle3", "medusa", "draft") for i, p in enumerate(prompts)]
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None
    for s in seqs:
        assert s.output_ids == plain[int(s.request_id[-1])], s.request_id
    assert not engine.proposers["eagle3"].kv.caches and not engine.proposers["medusa"].last    # released when finished



@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_heads_guess_as_the_float_head_does_and_keep_parity(tiny_models, heads, scheme):
    """pack_head's int8 / int4 blocks: every linear runs on the block kernel, Medusa's guesses match the float
    heads' on random states (int8 nearly always), and greedy speculation with the quantized heads stays exact."""
    import copy

    from specdec.models.heads import default_head_quantization, pack_head
    from specdec.models.quantization.kernels import available
    from specdec.models.quantization.linear import BlockQuantLinear

    if not available():
        pytest.fail("specdec._C is not built: the README's install builds it")
    target, _ = tiny_models
    qe, qm = copy.deepcopy(heads["eagle3"]), copy.deepcopy(heads["medusa"])
    assert pack_head(qe, scheme) == scheme and pack_head(qm, scheme) == scheme
    for m in (qe, qm):
        assert not any(isinstance(x, torch.nn.Linear) for x in m.modules())
        assert any(isinstance(x, BlockQuantLinear) for x in m.modules())
    assert qm.weight_nbytes() < heads["medusa"].weight_nbytes() / (3 if scheme == "int8" else 5)
    h = torch.randn(256, target.config.hidden_size)
    with torch.inference_mode():
        agree = [(a.argmax(-1) == b.argmax(-1)).float().mean().item() for a, b in zip(qm(h), heads["medusa"](h))]
    assert min(agree) > (0.95 if scheme == "int8" else 0.7), agree
    ids = target.tokenizer.encode(PROMPT)
    engine = LLMEngine(EngineConfig(target.model, target.tokenizer, heads={"eagle3": qe, "medusa": qm}))
    base = _run(engine, ids, "none", None).output_ids
    for method in ("eagle3", "medusa"):
        seq = _run(engine, ids, method, 3)
        assert seq.output_ids == base and seq.stats.draft_tokens > 0, method
    # the default: int4 for a bf16 head on a CPU that runs 4-bit codes on a vector kernel (AVX-512 VNNI or AVX2),
    # else int8 where 8-bit codes run on one; the runtime dtype for fp32 heads and where only the portable kernel runs
    from specdec.models.quantization.kernels import vector_kernel

    assert default_head_quantization(heads["medusa"]) == "none"
    bf16_default = default_head_quantization(copy.deepcopy(heads["medusa"]).to(torch.bfloat16))
    assert bf16_default == ("int4" if vector_kernel(4) else "int8" if vector_kernel(8) else "none")
    odd = torch.nn.Sequential(torch.nn.Linear(40, 16)).to(torch.bfloat16)     # inputs not in whole 32-wide groups
    assert default_head_quantization(odd) == "none"
    with pytest.raises(SpecDecError, match="multiple of 32"):
        pack_head(odd, scheme)

def test_eagle3_inference_matches_training_forward(tiny_models):
    """The head's engine forward (KV cache, fused ops) equals its training forward (whole sequence, training-time
    test): step 0 over target-fed rows, and a chained row fed the head's own output and its guess."""
    target, _ = tiny_models
    model = target.model
    head = _eagle3(model, std=0.1).float()
    ids = target.tokenizer.encode(PROMPT)[:12]
    T = len(ids)
    kv = model.new_kv()
    kv.resize(T)
    aux = head.cfg.aux_layers
    _, hidden = forward_spans(model, [Span(kv, 0, ids, "none", hidden=True)], aux)
    states = torch.cat([hidden[0][i] for i in aux], -1).clone()                     # [T, 3H]
    x = torch.tensor(ids)
    emb = model.embed_tokens(torch.cat([x[1:], x[-1:]])).clone()                      # row t: x_{t+1}
    with torch.no_grad():
        train = head.train_forward(emb[None], head.fc(states)[None], 2)             # steps 0 and 1
    hkv = head.new_kv()
    hkv.resize(T + 1)
    p = T - 3                                                                       # rows 0..p: target-fed
    g = head.fuse(states[: p + 1])
    h = head(emb[: p + 1], g, torch.arange(p + 1), causal_metadata([(hkv, 0, p + 1, False)]))
    torch.testing.assert_close(head.compute_logits(h), train[0][0, : p + 1].float(), rtol=1e-4, atol=1e-4)
    # the chained row at position p+1: the head's output at p and the token x_{p+2}
    h2 = head(model.embed_tokens(x[p + 2: p + 3]), h[p: p + 1], torch.tensor([p + 1]),
              causal_metadata([(hkv, p + 1, 1, True)]))
    torch.testing.assert_close(head.compute_logits(h2)[0], train[1][0, p].float(), rtol=1e-4, atol=1e-4)


def test_vllm_and_authors_layouts_load(tiny_models, heads, tmp_path):
    target, _ = tiny_models
    cfg = json.loads((heads["dir"] / "e3" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    from safetensors.torch import load_file, save_file

    names = set(load_file(str(heads["dir"] / "e3" / "model.safetensors")))
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.mlp.gate_proj.weight", "lm_head.weight",
            "d2t", "t2d"} <= names
    # the Medusa authors' layout: {head}.{block}.linear.*, {head}.{num_layers}.weight, config medusa_num_heads
    m = _medusa(target.model, heads=2)
    authors = {}
    for i in range(2):
        authors[f"{i}.0.linear.weight"] = m.blocks[i][0].linear.weight.detach()
        authors[f"{i}.0.linear.bias"] = m.blocks[i][0].linear.bias.detach()
        authors[f"{i}.1.weight"] = m.lm_heads[i].weight.detach()
    d = tmp_path / "authors"
    d.mkdir()
    save_file(authors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1,
                                               "hidden_size": target.config.hidden_size,
                                               "vocab_size": target.config.vocab_size}))
    loaded = load_head(d, target.model, torch.float32).module
    h = torch.randn(3, target.config.hidden_size)
    for a, b in zip(loaded(h), m(h)):
        torch.testing.assert_close(a, b)


def test_int8_storage_is_close_and_smaller(tiny_models, tmp_path):
    target, _ = tiny_models
    head = _eagle3(target.model, draft_vocab=300)
    save_head(head, "eagle3", tmp_path / "bf16")
    save_head(head, "eagle3", tmp_path / "int8", int8=True)
    size = lambda d: (d / "model.safetensors").stat().st_size                       # noqa: E731
    assert size(tmp_path / "int8") < 0.7 * size(tmp_path / "bf16")
    a = load_head(tmp_path / "bf16", target.model, torch.float32).module
    b = load_head(tmp_path / "int8", target.model, torch.float32).module
    w_a, w_b = a.mlp.gate_up_proj.weight, b.mlp.gate_up_proj.weight
    assert (w_a - w_b).abs().max() <= w_a.abs().amax(1).max() / 127 + 1e-2


def test_mismatched_heads_are_refused_with_precise_messages(tiny_models, heads, tmp_path, tiny_dirs):
    target, draft = tiny_models
    # trained for another target (fingerprint)
    with pytest.raises(SpecDecError, match="trained for another target"):
        load_head(heads["dir"] / "e3", draft.model, torch.float32)
    # hidden size
    d = tmp_path / "wide"
    m = MedusaHeads(MedusaConfig(target.config.hidden_size * 2, target.config.vocab_size, 2))
    save_head(m, "medusa", d)
    with pytest.raises(SpecDecError, match="hidden size 128; the target's is 64"):
        load_head(d, target.model, torch.float32)
    # vocabulary
    m = MedusaHeads(MedusaConfig(target.config.hidden_size, target.config.vocab_size + 8, 2))
    save_head(m, "medusa", tmp_path / "vocab")
    with pytest.raises(SpecDecError, match="predicts over 332 tokens; the target has 324"):
        load_head(tmp_path / "vocab", target.model, torch.float32)
    # layers it reads
    cfg = json.loads((heads["dir"] / "e3" / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 1, 40]
    cfg.pop("specdec_target_fingerprint")
    bad = tmp_path / "layers"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "model.safetensors").write_bytes((heads["dir"] / "e3" / "model.safetensors").read_bytes())
    with pytest.raises(SpecDecError, match=r"reads target layers \[0, 1, 40\]; the target has 2 layers"):
        load_head(bad, target.model, torch.float32)
    # not a head
    with pytest.raises(SpecDecError, match="not a draft head"):
        load_head(tiny_dirs["target"], target.model, torch.float32)
    # a method whose head is not loaded
    engine = LLMEngine(EngineConfig(target.model, target.tokenizer))
    with pytest.raises(SpecDecError, match="'eagle3' needs its head loaded"):
        engine.add_request("x", [1, 2, 3], SamplingParams(max_tokens=4), SpeculativeConfig("eagle3", 2))


def _train_cfg(method, src, out, **kw):
    from specdec.train.head_trainer import TrainConfig

    base = dict(seq_len=48, epochs=6, batch_seqs=4, lr=3e-3, warmup_steps=4, draft_vocab=160,
                intermediate_size=64, checkpoint_every=8, ttt_steps=2, num_heads=2)
    base.update(kw)
    return TrainConfig(method, str(src), str(out), **base)


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory):
    from conftest import CORPUS

    d = tmp_path_factory.mktemp("code")
    (d / "a.py").write_text(CORPUS * 6)
    (d / "b.py").write_text(CORPUS[::-1] * 3)
    return d


@pytest.fixture(scope="module")
def chat_jsonl(tmp_path_factory):
    from conftest import CORPUS

    path = tmp_path_factory.mktemp("chat") / "asks.jsonl"
    words = CORPUS.split()
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": " ".join(words[i: i + 6])}]}) + "\n"
                            for i in range(0, 48, 2)))
    return path


@pytest.fixture(scope="module")
def smooth_target(tmp_path_factory):
    """A tiny target with smaller weights: its answers settle into patterns a tiny head can learn in seconds (the
    default tiny target's text is close to random)."""
    from conftest import make_tiny_model

    from specdec.models.loader import load_model

    d = make_tiny_model(tmp_path_factory.mktemp("smooth") / "target", seed=0, weight_std=0.1)
    return load_model(str(d), dtype="float32", device="cpu", progress=False)


def test_train_head_learns_the_target_and_serves(smooth_target, code_dir, chat_jsonl, tmp_path):
    """A tiny self-distillation run training both heads from one pass over the target (the target answers the chat
    prompts, then the heads learn from its states): the loss falls, the heads agree with the target more than at
    the start, and the saved heads load and draft in the engine with greedy parity and accepted tokens on a prompt
    they were trained on. (The real pair's figures come from `specdec bench offline`; this checks the pipeline.)"""
    from specdec.train.evaluate import acceptance, head_layers, teacher_forced
    from specdec.train.head_trainer import HeadTrainer

    target = smooth_target
    cfg = _train_cfg("eagle3,medusa", f"{chat_jsonl},{code_dir}", tmp_path / "h", regenerate=40, regenerate_seqs=8,
                     epochs=8, draft_vocab=1000)                    # every token: a small model says rare ones
    infos = HeadTrainer(cfg, target, progress=False).run()
    ask = json.loads(chat_jsonl.read_text().splitlines()[3])["messages"]
    ids = target.tokenizer.encode_chat(ask)
    for method in ("eagle3", "medusa"):
        hist = json.loads((tmp_path / "h" / method / "training.json").read_text())["history"]
        first = sum(h["loss"] for h in hist[:4]) / 4
        last = sum(h["loss"] for h in hist[-4:]) / 4
        assert last < 0.8 * first, (method, first, last)
        assert infos[method]["final_agree"][0] > hist[0]["agree"][0] + 0.1, method
        head = load_head(tmp_path / "h" / method, target.model, torch.float32).module
        engine = LLMEngine(EngineConfig(target.model, target.tokenizer, heads={method: head}))
        base = _run(engine, ids, "none", None).output_ids
        seq = _run(engine, ids, method, 3)
        assert seq.output_ids == base, method
        assert seq.stats.acceptance_rate > 0.1, (method, seq.stats.acceptance_rate)
        # the teacher-forced replay (python -m specdec.train.evaluate) gets the engine's accepted length
        layers = head_layers(method, head, target.model.config.num_layers)
        done = teacher_forced(target.model, [(ids, base, True)], layers)
        k = min(3, head.cfg.num_heads) if method == "medusa" else 3            # the engine drafts Medusa's heads
        r = acceptance(method, head, target.model.embed_tokens, done, k, target.model.config.num_layers)
        assert r.steps == seq.stats.draft_steps, method
        assert r.mean_accepted_length == pytest.approx(seq.stats.mean_accepted_length), method
        assert r.per_position == pytest.approx(seq.stats.accepted_per_position), method


def test_train_head_resumes_to_the_same_head(tiny_models, code_dir, tmp_path, monkeypatch):
    """Interrupted after a checkpoint and resumed, a run ends with the weights an uninterrupted run ends with."""
    from specdec.train.head_trainer import HeadTrainer

    target, _ = tiny_models
    HeadTrainer(_train_cfg("eagle3", code_dir, tmp_path / "a", epochs=3), target, progress=False).run()
    calls = {"n": 0}
    real = HeadTrainer.loss

    def interrupted(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 11:                       # after the checkpoint of step 8
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    monkeypatch.setattr(HeadTrainer, "loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        HeadTrainer(_train_cfg("eagle3", code_dir, tmp_path / "b", epochs=3), target, progress=False).run()
    assert (tmp_path / "b.checkpoint.pt").is_file() and not (tmp_path / "b").exists()
    assert (tmp_path / "b.docs.pt").is_file() and (tmp_path / "b.features.pt").is_file()
    monkeypatch.setattr(HeadTrainer, "loss", real)

    def recomputed(*a, **kw):
        raise AssertionError("a resumed run recomputed what the stopped run saved")

    import specdec.train.data as data_module
    import specdec.train.head_trainer as trainer_module

    monkeypatch.setattr(data_module, "load_sequences", recomputed)          # the documents and features come back
    monkeypatch.setattr(trainer_module, "extract_features", recomputed)    # from b.docs.pt and b.features.pt
    HeadTrainer(_train_cfg("eagle3", code_dir, tmp_path / "b", epochs=3, resume=True), target, progress=False).run()
    assert not any(tmp_path.glob("b.*.pt"))                                 # caches and checkpoint go with the run
    from safetensors.torch import load_file

    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    for name in a:
        assert torch.equal(a[name], b[name]), name
    hist = json.loads((tmp_path / "b" / "training.json").read_text())["history"]
    assert [h["step"] for h in hist] == list(range(len(hist)))


def test_train_head_init_continues_from_a_trained_head(tiny_models, code_dir, chat_jsonl, tmp_path):
    """--init starts from a trained head: its draft vocabulary is kept (whatever the new data's frequent tokens) and
    its first loss on the data it learned is the loss it ended with, far below a fresh head's."""
    from specdec.train.head_trainer import HeadTrainer

    target, _ = tiny_models
    HeadTrainer(_train_cfg("eagle3,medusa", code_dir, tmp_path / "a", epochs=4), target, progress=False).run()
    HeadTrainer(_train_cfg("eagle3,medusa", code_dir, tmp_path / "b", epochs=1, init=str(tmp_path / "a")), target,
                progress=False).run()
    HeadTrainer(_train_cfg("eagle3,medusa", f"{chat_jsonl}", tmp_path / "c", epochs=1, init=str(tmp_path / "a")),
                target, progress=False).run()
    for method in ("eagle3", "medusa"):
        def first(d, method=method):
            return json.loads((tmp_path / d / method / "training.json").read_text())["history"][0]["loss"]

        fresh = first("a")
        trained = json.loads((tmp_path / "a" / method / "training.json").read_text())["final_loss"]
        assert first("b") < 0.5 * (fresh + trained), method
        heads = [load_head(tmp_path / d / method, target.model, torch.float32).module for d in "ac"]
        vocab = [h.draft_to_target if method == "eagle3" else h.token_map for h in heads]
        assert torch.equal(vocab[0], vocab[1]), method
    with pytest.raises(SpecDecError, match="not a draft head directory"):
        HeadTrainer(_train_cfg("eagle3", code_dir, tmp_path / "d", init=str(tmp_path)), target, progress=False).run()


def test_refreshed_vocabulary_swaps_rare_tokens_for_frequent_missing_ones():
    from specdec.train.features import refreshed_vocabulary

    current = torch.tensor([0, 1, 2, 3, 4, 5])
    docs = [[1, 2, 3, 4, 5] * 20 + [7] * 30 + [8] * 9 + [9] * 50 + [0]]     # 0 is rare but always kept
    out = refreshed_vocabulary(current, docs, 3, 12, always=[0])
    # newcomers 9 (50), 7 (30), 8 (9) against the rarest 1, 2, 3 (20 each): only 9 is more than twice as frequent
    assert out.tolist() == [0, 2, 3, 4, 5, 9]
    assert refreshed_vocabulary(current, docs, 3, 12, always=[0, 1]).tolist() == [0, 1, 3, 4, 5, 9]
    assert refreshed_vocabulary(current, docs, 0, 12, [0]).tolist() == current.tolist()


@pytest.mark.parametrize("method", ["eagle3", "medusa"])
def test_revocab_keeps_trained_rows_and_starts_new_ones_from_the_target(tiny_models, code_dir, tmp_path, method):
    from specdec.train.features import target_head_weight
    from specdec.train.head_trainer import HeadTrainer

    target, _ = tiny_models
    HeadTrainer(_train_cfg(method, code_dir, tmp_path / "a", epochs=1), target, progress=False).run()
    trainer = HeadTrainer(_train_cfg(method, code_dir, tmp_path / "b", init=str(tmp_path / "a")), target,
                          progress=False)
    head = trainer.initial_head(method)
    old = trainer.head_vocab(head)
    rows = [lm.weight.detach().clone() for lm in (head.lm_heads if method == "medusa" else [head.lm_head])]
    V = target.model.config.vocab_size
    lacking = torch.tensor([t for t in range(V) if t not in set(old.tolist())][:5])
    new = torch.sort(torch.cat([old[5:], lacking])).values
    w_target = target_head_weight(target.model)[new]
    head = trainer.revocab(head, new)
    assert torch.equal(trainer.head_vocab(head), new)
    for before, lm in zip(rows, head.lm_heads if method == "medusa" else [head.lm_head]):
        for i, t in enumerate(new.tolist()):
            if t in set(old[5:].tolist()):
                assert torch.equal(lm.weight[i], before[old.tolist().index(t)]), t
            else:
                assert torch.allclose(lm.weight[i], w_target[i]), t
    with pytest.raises(SpecDecError, match="refresh-vocab needs --init"):
        _train_cfg(method, code_dir, tmp_path / "c", refresh_vocab=4)


def test_training_autocasts_to_bf16_only_where_the_cpu_multiplies_bf16():
    """On an AVX2 CPU a bf16 backward is ~70x slower than fp32's: training stays fp32 there."""
    from specdec.models.quantization.kernels import native_bf16
    from specdec.train.head_trainer import train_autocast

    ctx = train_autocast(torch.device("cpu"))
    assert isinstance(ctx, torch.autocast) == native_bf16()
    if isinstance(ctx, torch.autocast):
        assert ctx.fast_dtype == torch.bfloat16


def test_replay_chain_accepts_while_guesses_match():
    from specdec.train.evaluate import replay_chain

    tokens = torch.tensor([9, 9, 1, 2, 3, 4, 5, 6])             # prompt of 2, answer 1 2 3 4 5 6
    guess = torch.full((2, 8), -1)
    guess[0, 1], guess[1, 1] = 2, 3        # after token 1 (column 1): 2 and 3 match -> 2 accepted, 4 is the bonus
    guess[0, 4] = 6                        # after 4 (column 4): 5 would be next, 6 misses -> 0 accepted
    # chains after 1 (accepts 2 3, then 4), after 4 (gets 5), after 5 (gets 6)
    assert replay_chain(tokens, 2, guess, 2) == [(2, 2), (2, 0), (2, 0)]
    assert replay_chain(tokens, 2, guess, 1) == [(1, 1), (1, 0), (1, 0), (1, 0)]
    # at the token limit the engine drafts at most one fewer than remain, and nothing when one remains
    assert replay_chain(tokens, 2, guess, 2, capped=True) == [(2, 2), (1, 0)]


def test_chain_steps_count_runs_of_matches_as_greedy_chains():
    from specdec.train.evaluate import chain_steps

    # chains of 3: tokens 0-2 accepted (the target adds 3), then 4 (the target adds 5, a miss), then 6
    assert chain_steps([True] * 5 + [False, True], 3) == (5, 3)
    assert chain_steps([False] * 4, 2) == (0, 4)             # nothing accepted: one target token a step
    assert chain_steps([True] * 8, 8) == (8, 1)
    assert chain_steps([], 4) == (0, 0)


def test_tree_guesses_follow_the_answer_while_the_tree_could_hold_it(monkeypatch):
    """evaluate --calibrate's pairs: a guess of step j counts where the answer's tokens of steps 0..j-1 were among
    their step's top-k, i.e. where a tree could have reached it."""
    from specdec.train import evaluate as ev

    x = torch.tensor([5, 6, 1, 2, 3, 4])                        # prompt 5 6; answer 1 2 3 4
    ans = ev.Answer(x, 2, False)

    def rows(*best):                                            # logits [T, 8] favouring (first, second) per row
        lg = torch.zeros(6, 8)
        for t, (a, b) in enumerate(best):
            lg[t, a], lg[t, b] = 4.0, 2.0
        return lg

    # step 0, row t guesses x[t+2]: rows 1..3 want 2, 3, 4; step 1, row t guesses x[t+3]: rows 1, 2 want 3, 4
    step0 = rows((0, 1), (2, 7), (7, 3), (0, 1), (0, 1), (0, 1))
    step1 = rows((0, 1), (3, 0), (4, 0), (0, 1), (0, 1), (0, 1))
    monkeypatch.setattr(ev, "step_logits", lambda *a: ([step0, step1], torch.arange(8)))
    pairs = ev.tree_guesses("eagle3", None, None, [ans], 2, 2, 0)
    # step 0: row 1 best right, row 2 second right, row 3 neither (so step 1 of row 3 is not reached either)
    assert [h for _, h in pairs[0]] == [True, False, False, True, True]
    assert [h for _, h in pairs[1]] == [False, True, False, False, False]
    assert pairs[0][0][0] == pytest.approx(torch.softmax(step0[1], -1)[2].item())
    # the exponent that makes p^a the hit rate: 2 for guesses right p^2 of the time, 1 for calibrated ones
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(4000, generator=gen) * 0.98 + 0.01
    u = torch.rand(4000, generator=gen)
    assert abs(ev.fit_exponent(p.log(), u < p ** 2) - 2.0) <= 0.15
    assert abs(ev.fit_exponent(p.log(), u < p) - 1.0) <= 0.1


def test_sharegpt_code_sources_pick_code_conversations():
    from specdec.train.data import load_source

    code = load_source("sharegpt-code:20", None)
    assert len(code) == 20
    assert load_source("sharegpt-code[10:20]", None) == code[10:]
    assert load_source("sharegpt[2:5]", None) == load_source("sharegpt:5", None)[2:]
    with pytest.raises(SpecDecError, match="needs an integer"):
        load_source("sharegpt:many", None)


def test_stdlib_function_sources_ask_humaneval_style_and_answer_with_the_real_function():
    import ast

    from specdec.bench.datasets import humaneval_request
    from specdec.train.data import load_source, stdlib_functions

    probs = stdlib_functions()
    assert len(probs) > 500 and len({p["task_id"] for p in probs}) == len(probs)
    for p in probs[:50]:
        fn = ast.parse(p["solution"]).body[0]
        assert isinstance(fn, ast.FunctionDef) and p["task_id"].endswith("." + fn.name)
        assert p["solution"].startswith(p["prompt"]) and len(p["solution"]) > len(p["prompt"])
        assert ast.get_docstring(fn) and len(ast.get_docstring(fn)) >= 60
    chats = load_source("stdlib-functions[3:5]", None)
    assert chats == load_source("stdlib-functions:5", None)[3:]
    ask, answer = chats[0]
    assert ask == humaneval_request(probs[3])["messages"][0]
    assert answer == {"role": "assistant", "content": f"```python\n{probs[3]['solution']}```"}
    with pytest.raises(SpecDecError, match="bad source 'stdlib-functions:x'"):
        load_source("stdlib-functions:x", None)



def test_package_function_sources_read_an_installed_packages_documented_functions(tmp_path, monkeypatch):
    from specdec.bench.datasets import humaneval_request
    from specdec.train.data import held_out_names, load_source, package_functions

    doc = '    """Return the sum of the squares of the even numbers in xs; odd numbers count for nothing."""\n'
    good = "def even_squares(xs: list[int]) -> int:\n" + doc + "    return sum(x * x for x in xs if x % 2 == 0)\n"
    pkg = tmp_path / "mypkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "tests").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "ops.py").write_text(
        "import functools\n\n\n" + good
        + "\n\ndef _private(x):\n" + doc + "    return x\n"               # private: left out
        + "\n\ndef short(x):\n    \"\"\"Too short.\"\"\"\n    return x\n"      # docstring < 60 characters
        + "\n\ndef only_doc(x):\n" + doc                                   # no body beyond the docstring
        + "\n\n@functools.cache\ndef cached(x):\n" + doc + "    return x\n"  # decorated
        + "\n\ndef intersperse(xs, d):\n" + doc + "    return xs\n")  # named as a held-out HumanEval problem
    (pkg / "tests" / "test_ops.py").write_text("def test_even(xs):\n" + doc + "    assert xs\n")
    (tmp_path / "onefile.py").write_text(good.replace("even_squares", "single"))
    monkeypatch.syspath_prepend(str(tmp_path))

    assert "intersperse" in held_out_names()                   # HumanEval/5, one of the benchmark's humaneval:20
    assert {p["task_id"] for p in package_functions("mypkg")} == {"mypkg.sub.ops.even_squares",
                                                                 "mypkg.sub.ops.intersperse"}
    probs = [p for p in package_functions("mypkg") if p["task_id"].endswith("even_squares")]
    assert probs[0]["solution"] == good and probs[0]["prompt"] == good[: good.index(doc) + len(doc)]
    assert [p["task_id"] for p in package_functions("onefile")] == ["onefile.single"]
    assert len(load_source("functions:mypkg", None)) == 1       # intersperse is never a training ask
    ask, answer = load_source("functions:mypkg", None)[0]
    assert ask == humaneval_request(probs[0])["messages"][0]
    assert answer == {"role": "assistant", "content": f"```python\n{good}```"}
    assert load_source("functions:mypkg[1:]", None) == []
    with pytest.raises(SpecDecError, match="no installed Python package 'no_such_pkg_here'"):
        load_source("functions:no_such_pkg_here", None)
    with pytest.raises(SpecDecError, match="bad source 'functions:mypkg:x'"):
        load_source("functions:mypkg:x", None)


def _eagle1(target, layers=1, seed=0):
    from specdec.models.eagle1 import EagleConfig, EagleHead

    c = target.config
    torch.manual_seed(seed)
    head = EagleHead(EagleConfig(c.hidden_size, 96, layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size,
                                 c.num_layers, fc_bias=True))
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, 0, 0.2)
            elif name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:                                                        # biases
                torch.nn.init.normal_(p, 0, 0.1)
    return head


def _save_eagle1_as_authors(head, out, prefix=""):
    """The EAGLE authors' layout: a plain Llama config, fc + layers.i.* (q/k/v, gate/up apart), the embedding."""
    from safetensors.torch import save_file

    from specdec.models.heads import hf_state

    out.mkdir(parents=True)
    c = head.cfg
    state = {prefix + k: v for k, v in hf_state(head, "eagle").items()}
    state[prefix + "embed_tokens.weight"] = torch.zeros(c.vocab_size, c.hidden_size)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "vocab_size": c.vocab_size, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta}))


def test_eagle1_first_row_matches_the_reference_wiring(tiny_models):
    """Row 0 attends to itself only (softmax over one key is 1, rotary cancels): h = r + MLP(norm(r)) with
    r = x + o_proj(v(x)), x = fc([embedding, feature]) and no input norm on the first layer."""
    import torch.nn.functional as F

    target, _ = tiny_models
    head = _eagle1(target.model)
    c = head.cfg
    e, f = torch.randn(1, c.hidden_size), torch.randn(1, c.hidden_size)
    kv = head.new_kv()
    kv.resize(4)
    h = head(e, f, torch.tensor([0]), causal_metadata([(kv, 0, 1, True)]))
    layer = head.layers[0]
    x = F.linear(torch.cat([e, f], -1), head.fc.weight, head.fc.bias)
    q, kvs = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    w, b = layer.self_attn.qkv_proj.weight, layer.self_attn.qkv_proj.bias
    v = F.linear(x, w[q + kvs:], None if b is None else b[q + kvs:]).view(c.num_kv_heads, c.head_dim)
    a = F.linear(v.repeat_interleave(c.num_heads // c.num_kv_heads, 0).reshape(1, -1), layer.self_attn.o_proj.weight)
    r = x + a
    n = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * layer.post_attention_layernorm.weight
    gate, up = F.linear(n, layer.mlp.gate_up_proj.weight).chunk(2, -1)
    ref = r + F.linear(F.silu(gate) * up, layer.mlp.down_proj.weight)
    assert torch.allclose(h, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layers", [1, 2])
def test_eagle1_heads_load_from_the_authors_layout_and_keep_parity(tiny_models, tmp_path, layers):
    target, _ = tiny_models
    ids = target.tokenizer.encode(PROMPT)
    head = _eagle1(target.model, layers)
    _save_eagle1_as_authors(head, tmp_path / "e1", prefix="model." if layers == 2 else "")
    with pytest.raises(SpecDecError, match="method 'eagle'"):
        load_head(tmp_path / "e1", target.model, torch.float32)        # a plain Llama config: say what it is
    loaded = load_head(tmp_path / "e1", target.model, torch.float32, method="eagle")
    assert loaded.method == "eagle"
    for name, t in head.state_dict().items():
        assert torch.equal(loaded.module.state_dict()[name], t), name
    # prefill and row-by-row feeding give the same states (the cache and the tree path are the EAGLE-3 ones)
    engine = LLMEngine(EngineConfig(target.model, target.tokenizer, heads={"eagle": loaded.module}))
    base = _run(engine, ids, "none", None).output_ids
    for spec in (SpeculativeConfig("eagle", 3), SpeculativeConfig("eagle", 6, eagle_topk=2, num_steps=3)):
        seq = engine.add_request(f"e{spec.eagle_topk}", ids, SamplingParams(max_tokens=40, temperature=0.0,
                                                                            ignore_eos=True), spec)
        while not seq.finished:
            for out in engine.step():
                assert out.error is None, out.error
        assert seq.output_ids == base and seq.stats.draft_tokens > 0
    save_head(_eagle3(target.model), "eagle3", tmp_path / "e3")
    with pytest.raises(SpecDecError, match="is a eagle3 head, not eagle"):
        load_head(tmp_path / "e3", target.model, torch.float32, method="eagle")


def test_bench_heads_times_each_head_per_scheme(tiny_dirs, heads, monkeypatch):
    """`python -m specdec.bench.heads`: every (head, scheme) timed as the engine drives it, the target's forward
    beside; the int8 scheme really packs the head's linears."""
    from specdec import LLM, loading
    from specdec.bench.heads import measure

    llm = LLM(target=str(tiny_dirs["target"]), dtype="bfloat16", device="cpu", progress=False,
              speculative=SpeculativeConfig(method="none"))
    calls: dict[tuple[str, str], int] = {}
    load = loading.load_head_for

    def counted(method, path, target, quantization=None):       # each loaded head's forwards, counted
        head = load(method, path, target, quantization)
        key = (method, quantization)
        calls[key] = 0
        head.module.register_forward_hook(lambda *_: calls.__setitem__(key, calls[key] + 1))
        return head

    monkeypatch.setattr(loading, "load_head_for", counted)
    repeats = 3
    r = measure(llm, {"eagle3": str(heads["dir"] / "e3"), "medusa": str(heads["dir"] / "med")}, ["none", "int8"],
                context=16, rounds=1, repeats=repeats)
    assert set(r["heads"]) == {(m, q) for m in ("eagle3", "medusa") for q in ("none", "int8")}
    assert r["target_s"] > 0 and all(first > 0 and further >= 0 for first, further in r["heads"].values())
    # what "each further token" times: an EAGLE-3 head runs again for each further token (timed proposals of 1 and 4
    # tokens, repeats + 1 times each), while Medusa's heads all run in one forward per proposal. Counted, not timed:
    # a difference of two timings is 0 whenever one proposal stalls on a noisy machine
    for q in ("none", "int8"):
        assert calls[("eagle3", q)] >= (repeats + 1) * (1 + 4) > calls[("medusa", q)], calls
    assert {q for (_, q), run in r["packed"].items() if run == q} == {"none", "int8"}


def test_regenerate_keeps_conversations_without_a_user_turn_as_they_are(tmp_path):
    """--regenerate answers each conversation's first user turn; one with no user turn (a system prompt and an
    assistant's text only) has nothing to ask and is trained on as it is, beside the answered ones."""
    from specdec.train.data import load_sequences

    class Tok:
        def apply_chat_template(self, messages, add_generation_prompt=False):
            return "|".join(f"{m['role']}:{m['content']}" for m in messages)

        def encode(self, text):
            return [ord(c) for c in text]

    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hello there"},
                          {"role": "assistant", "content": "hello"}]},
            {"messages": [{"role": "system", "content": "notes"},
                          {"role": "assistant", "content": "a long monologue"}]}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    asked = []

    def regenerate(asks):
        asked.extend(asks)
        return [list(range(100, 120)) for _ in asks]

    docs = load_sequences(str(path), Tok(), doc_len=512, regenerate=regenerate)
    assert asked == [rows[0]["messages"][:2]]                       # the first user turn, with its system message
    assert docs == [list(range(100, 120)), Tok().encode(Tok().apply_chat_template(rows[1]["messages"]))]
