"""Gemma 3 in our runtime: a tiny random-init Gemma 3 (HF format) against transformers' own, past its sliding
window; speculation on it keeps the plain tokens."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tokenizer
from model_cache import gguf_read_once

from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.models.loader import load_model
from specdec.models.runner import forward_once

WINDOW = 8     # small, so prompts and answers of a few dozen tokens cross it on the local layers


def make_tiny_gemma3(directory, seed: int = 0, **overrides):
    """A random-init Gemma3ForCausalLM in HF format: 7 layers (0-4 and 6 local, 5 global), window 8, one KV head,
    q/k norms and every other norm random (HF stores w of a `1 + w` norm: the loader must add the 1)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    directory.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(directory)
    cfg = dict(vocab_size=vocab + 4, hidden_size=64, intermediate_size=128, num_hidden_layers=7,
               num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=WINDOW,
               query_pre_attn_scalar=24, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
               attn_implementation="eager")
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.25 if p.dim() == 2 else 0.3)
    model.save_pretrained(directory, safe_serialization=True)
    return directory, model.eval()


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    return make_tiny_gemma3(tmp_path_factory.mktemp("gemma") / "g")


def test_config_reads_the_sliding_pattern_and_both_rope_bases(tiny_gemma):
    path, ref = tiny_gemma
    ours = load_model(str(path), dtype="float32", device="cpu", progress=False)
    cfg = ours.config
    assert (cfg.arch, cfg.sliding_window, cfg.sliding_window_pattern) == ("gemma3", WINDOW, 6)
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.query_pre_attn_scalar) == (1e6, 1e4, 24)
    assert [cfg.is_sliding(i) for i in range(7)] == [t == "sliding_attention" for t in ref.config.layer_types]
    assert cfg.tie_word_embeddings


def test_logits_match_transformers_past_the_window(tiny_gemma):
    path, ref = tiny_gemma
    ours = load_model(str(path), dtype="float32", device="cpu", progress=False, pack=False)
    ids = torch.randint(5, ref.config.vocab_size - 4, (41,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    got = forward_once(ours.model, ids)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert (got - want).abs().max().item() < 1e-3


def test_greedy_tokens_match_transformers_and_speculation_keeps_them(tiny_gemma):
    path, ref = tiny_gemma
    llm = LLM(target=str(path), dtype="float32", progress=False,
              speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=4))
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
    ids = llm.encode(prompt)                                  # through the chat template: ~50 tokens
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(ids):].tolist()
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = llm.generate(prompt, params, spec="none")[0]
    assert plain.token_ids == want
    assert len(set(want)) >= 3
    for method in ("ngram", "suffix"):
        out = llm.generate(prompt, params, spec=method)[0]
        assert out.token_ids == want, method
        assert 0 < out.stats.accepted_tokens < out.stats.draft_tokens, method      # rows kept and rows rejected


def test_a_window_pattern_other_than_repeating_is_refused(tmp_path):
    from specdec.errors import SpecDecError
    from specdec.models.config import ModelConfig

    cfg = json.loads((make_tiny_gemma3(tmp_path / "g", num_hidden_layers=2)[0] / "config.json").read_text())
    cfg["layer_types"] = ["full_attention", "sliding_attention"]
    with pytest.raises((ValueError, SpecDecError), match="pattern"):
        ModelConfig.from_hf_config(cfg)


# -- the real Gemma 3 270M (the `gemma` extra, assembled from its part packages) --------------------------------------
GEMMA_TEXTS = [
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "  two spaces, then\ttab and\n\n\nthree newlines    four spaces",
    "Unicode: naïve café, 你好，世界！ emoji 🤖🚀 and a rare glyph \U0001d4ea plus <start_of_turn> typed in",
    "The quick brown fox jumps over the lazy dog. " * 3,
]


@pytest.fixture(scope="module")
def gemma_gguf():
    from specdec.models.registry import BUILTIN_MODELS, assemble

    return assemble(BUILTIN_MODELS["gemma3-270m"], progress=False)


def _gemma_reference(gguf, prompts: list[str], max_new_tokens: int) -> dict:
    """transformers' reading of the GGUF (tokenizer and fp32 model): token ids of GEMMA_TEXTS and the greedy
    continuation of each prompt, kept in specdec's cache per file and transformers version (as the Qwen one is)."""
    import hashlib

    import transformers
    from transformers import AutoTokenizer, Gemma3ForCausalLM

    from specdec.models.registry import cache_dir
    from specdec.utils import save_torch_atomic

    st = gguf.stat()
    key = hashlib.sha256(json.dumps([gguf.name, st.st_size, st.st_mtime_ns, transformers.__version__, GEMMA_TEXTS,
                                     prompts, max_new_tokens, 2]).encode()).hexdigest()[:16]
    path = cache_dir() / "test-references" / f"{gguf.stem}-{key}.pt"
    if path.is_file():
        return torch.load(path)
    with gguf_read_once():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = Gemma3ForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    out = {"texts": [tok(t)["input_ids"] for t in GEMMA_TEXTS], "prompts": [],
           "greedy": []}
    for prompt in prompts:
        ids = tok(prompt)["input_ids"]                                            # with BOS, as the model expects
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        out["prompts"].append(ids)
        out["greedy"].append(gen[0, len(ids):].tolist())
    save_torch_atomic(out, path)
    return out


GEMMA_PROMPTS = [
    "def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n",
    "The capital of France is",
    # longer than the 512-token window, so the local layers drop keys while the global ones keep them
    "Here is a list of numbers and their squares:\n" + "".join(f"{i} squared is {i * i}.\n" for i in range(1, 90)),
]


@pytest.fixture(scope="module")
def gemma_fp32(gemma_gguf):
    return LLM(target="gemma3-270m", dtype="float32", progress=False, quantization="none",
               speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=4))


@pytest.mark.real_models
def test_real_gemma3_greedy_matches_transformers_fp32(gemma_gguf, gemma_fp32):
    ours = gemma_fp32
    ref = _gemma_reference(gemma_gguf, GEMMA_PROMPTS, 24)
    assert [ours.tokenizer.encode(t) for t in GEMMA_TEXTS] == ref["texts"]             # BOS, then the text
    assert [ours.tokenizer.decode(ids[1:], skip_special_tokens=False) for ids in ref["texts"]] == GEMMA_TEXTS
    # the length bound admission uses before tokenizing holds (the space-for-U+2581 normalizer keeps lengths)
    assert all(0 < ours.tokenizer.min_tokens(t) <= len(ids) for t, ids in zip(GEMMA_TEXTS, ref["texts"]))
    assert len(ref["prompts"][-1]) > 600
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for prompt, ids, want in zip(GEMMA_PROMPTS, ref["prompts"], ref["greedy"]):
        assert ours.tokenizer.encode(prompt) == ids
        for method in ("none", "ngram"):          # a base model: the text as it is, no chat template
            assert ours.generate(prompt, params, chat=False, spec=method)[0].token_ids == want, (method, prompt[:40])


@pytest.mark.real_models
def test_real_gemma3_chat_template_and_end_of_turn(gemma_fp32):
    tok = gemma_fp32.tokenizer
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": " Hi there "},
                                    {"role": "assistant", "content": "Hello."},
                                    {"role": "user", "content": "Bye"}])
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello."
                    "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    ids = tok.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[:2] == [2, 105] and ids.count(2) == 1                             # one BOS, then <start_of_turn>
    assert 106 in tok.eos_token_ids and 1 in tok.eos_token_ids                   # <end_of_turn> ends an answer
    assert tok.token_bytes(tok.vocab()["<0xF0>"]) == b"\xf0" and tok.token_bytes(tok.vocab()["\u2581the"]) == b" the"


@pytest.mark.real_models
def test_real_gemma3_served_with_ngram_and_suffix(gemma_gguf, tmp_path):
    """`specdec serve --target gemma3-270m` as a user starts it (int4, method auto; no draft model is loaded for
    another family): requests naming ngram and suffix answer with the plain tokens, the status is standard JSON,
    a method that needs a draft model is refused in one line."""
    import subprocess
    import sys

    import httpx
    from server_utils import server_process

    with server_process(["--target", "gemma3-270m"], tmp_path / "log") as (_, url):
        status = httpx.get(url + "/v1/speculative/status", timeout=30).json()
        methods = {m["method"] for m in status["methods"]}
        assert methods >= {"none", "ngram", "suffix", "auto"} and "draft" not in methods, methods
        body = {"model": "gemma3-270m", "prompt": GEMMA_PROMPTS[0], "max_tokens": 32, "temperature": 0}
        texts = {}
        for method in ("none", "ngram", "suffix", "suffix"):       # suffix again: it drafts from the first answer
            r = httpx.post(url + "/v1/completions", json={**body, "speculative": {"method": method}}, timeout=120)
            assert r.status_code == 200, r.text
            texts.setdefault(method, []).append(r.json()["choices"][0]["text"])
            spec = r.json()["speculative"]
        assert texts["ngram"][0] == texts["none"][0] and texts["suffix"] == texts["none"] * 2
        assert spec["accepted_tokens"] > 16                             # the second suffix run copies the first
        chat_body = {"model": "gemma3-270m", "max_tokens": 8, "temperature": 0,
                     "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
        chat = httpx.post(url + "/v1/chat/completions", timeout=120, json=chat_body)
        assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] > 8
        again = httpx.post(url + "/v1/chat/completions", timeout=120, json=chat_body).json()     # the prefix cache
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= chat.json()["usage"]["prompt_tokens"] - 1
        assert again["choices"][0]["message"] == chat.json()["choices"][0]["message"]
        # structured outputs through llguidance over the SentencePiece vocabulary (its text never gets a BOS)
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "gemma3-270m", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Is water wet? Answer in JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}})
        assert r.status_code == 200, r.text
        assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"])["ok"], bool)
        assert httpx.get(url + "/v1/speculative/status", timeout=30).status_code == 200
    out = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "x", "--target", "gemma3-270m",
                          "--method", "draft"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "--draft" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("method", ["none", "draft"])
def test_an_answer_past_the_window_is_reusable_as_it_stands(tiny_gemma, method):
    """bf16: the local layers take the row-by-row attention with their window, so past the window too a token's K/V
    is the same from a decode step, a verification row or a prompt chunk of any size. A Gemma answer's entry then
    equals a fresh prefill of prompt + answer bit for bit, with no settling pass."""
    from specdec.engine import EngineConfig, LLMEngine, SchedulerConfig
    from specdec.models.runner import Span, exact_rows, forward_spans

    path, _ = tiny_gemma
    target = load_model(str(path), dtype="bfloat16", device="cpu", progress=False)
    model = target.model
    assert model.config.sliding_window == WINDOW and exact_rows(model)
    # drafting with the target itself: every draft is accepted, so the answer's K/V comes from verification rows
    engine = LLMEngine(EngineConfig(model, target.tokenizer, model if method == "draft" else None, SchedulerConfig()))
    params = SamplingParams(max_tokens=160, temperature=0.0, ignore_eos=True)
    seq = engine.add_request("a", target.tokenizer.encode("def add(a, b):\n    return"), params,
                             SpeculativeConfig(method=method, num_speculative_tokens=3))
    while not seq.finished:
        assert all(o.error is None for o in engine.step())
    (entry,) = engine.kv.prefix.entries.values()
    n = len(seq.token_ids) - 1                      # the last token was sampled after the last forward
    assert n > 4 * WINDOW and entry.exact == n and not engine.has_background_work()
    if method == "draft":
        assert seq.stats.accepted_tokens >= 20
    kept = entry.kv
    assert kept.base > 0                              # the local layers kept only their recent positions
    for cuts in ((n,), (5, 20, n - 25), (1,) * 7 + (n - 7,)):
        fresh, start = engine.kv.ensure(-7, n + 1), 0
        for c in cuts:
            forward_spans(model, [Span(fresh, start, seq.token_ids[start:start + c], "none", decode=True)])
            start += c
        assert fresh.base == 0
        for a, b in ((kept.k, fresh.k), (kept.v, fresh.v)):                                  # global layers
            assert torch.equal(a[:, :, :n], b[:, :, :n])
        for a, b in ((kept.local.k, fresh.local.k), (kept.local.v, fresh.local.v)):          # local: the span
            assert torch.equal(a[:, :, :n - kept.base], b[:, :, kept.base:n])
        engine.kv.free_seq(-7)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_local_layers_keep_a_window_with_the_tokens_of_a_whole_cache(tiny_gemma, dtype):
    """WindowedKV: the local layers keep a span of recent positions (slid forward as sequences grow), the budget
    counts their share, and every method gives the tokens a whole-history cache gives -- chunked prefill, a batch,
    a next turn from the prefix cache (bf16: the whole conversation; fp32 cannot settle an answer whose window slid,
    so it reuses less), and a prompt that shares only the start of an entry whose window is gone (no hit there)."""
    from specdec.engine import EngineConfig, LLMEngine, SchedulerConfig
    from specdec.models.kv_cache import WindowedKV
    from specdec.models.qwen2 import Transformer

    path, _ = tiny_gemma
    target = load_model(str(path), dtype=dtype, device="cpu", progress=False)
    model = target.model
    assert isinstance(model.new_kv(), WindowedKV)
    ids = target.tokenizer.encode("def add(a, b):\n    return a + b\n" * 3)
    params = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)

    def run(method, windowed):
        model.new_kv = model.new_kv if windowed else Transformer.new_kv.__get__(model)
        try:
            engine = LLMEngine(EngineConfig(model, target.tokenizer, model if method == "draft" else None,
                               SchedulerConfig(max_num_batched_tokens=16)))
            spec = SpeculativeConfig(method=method, num_speculative_tokens=3)
            out, hits, peak = [], [], 0
            for prompts in ([ids[: len(ids) - i] for i in range(3)], None, [ids[:12] + [7, 8, 9]]):
                if prompts is None:                    # the next turn of the first conversation
                    prompts = [out[0][0] + ids[:5]]
                before = engine.kv.prefix.hits
                seqs = [engine.add_request(f"r{len(out)}-{i}", p, params, spec) for i, p in enumerate(prompts)]
                while not all(x.finished for x in seqs):
                    assert all(o.error is None for o in engine.step())
                    peak = max(peak, engine.kv.allocated)
                out.append([list(x.token_ids) for x in seqs])
                hits.append(engine.kv.prefix.hits - before)
            return out, hits, peak
        finally:
            del model.new_kv

    for method in ("none", "ngram", "draft"):
        (got, hits, peak), (want, full_hits, full_peak) = run(method, True), run(method, False)
        assert got == want, method
        assert peak < full_peak, (method, peak, full_peak)
        assert full_hits[2] == 12 and hits[2] == 0, method          # only the full cache still holds those 12
        if dtype == "bfloat16":
            assert hits[1] == full_hits[1] >= len(want[0][0]) - 1, method     # the first conversation reused whole
        else:       # fp32 settles an answer before reuse, which needs the window its span has slid past
            assert hits[1] <= full_hits[1], method


def test_the_kv_budget_counts_the_local_layers_window(tiny_gemma):
    """A request too long for the budget as whole-history caches count it (7 layers, 6 of them local with a window
    of 8) is admitted when the local layers keep their span, stays inside the budget while it runs, and gives the
    tokens a whole-history cache with room to spare gives."""
    from specdec.engine import EngineConfig, LLMEngine, SchedulerConfig
    from specdec.errors import SpecDecError
    from specdec.models.qwen2 import Transformer

    path, _ = tiny_gemma
    target = load_model(str(path), dtype="bfloat16", device="cpu", progress=False)
    model, tok = target.model, target.tokenizer
    ids = tok.encode("def add(a, b):\n    return a + b\n")
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)     # its context: 512 positions

    def run(budget: int):
        sched = SchedulerConfig(max_total_tokens=budget, max_num_batched_tokens=16)
        engine = LLMEngine(EngineConfig(model, tok, None, sched))
        seq, peak = engine.add_request("a", ids, params, SpeculativeConfig()), 0
        while not seq.finished:
            assert all(o.error is None for o in engine.step())
            peak = max(peak, engine.kv.allocated)
            assert engine.kv.allocated <= budget
        return list(seq.output_ids), peak

    got, peak = run(420)
    assert len(got) == 400 and peak < 300
    model.new_kv = Transformer.new_kv.__get__(model)      # every layer's whole history
    try:
        with pytest.raises(SpecDecError, match="KV positions"):
            run(420)
        want, full_peak = run(2048)
    finally:
        del model.new_kv
    assert got == want and full_peak > 400
