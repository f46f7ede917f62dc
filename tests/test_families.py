"""The families people bring, against transformers: Llama 3.x (RoPE type llama3), Qwen3 (q/k norms), Mistral, as
HF directories and as GGUF files written the way llama.cpp's converter writes them; and every config field or tensor
specdec does not compute refused at load with one line, never run."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from families import LLAMA3_ROPE, make_family, write_gguf

from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.cli import main
from specdec.models.loader import load_model
from specdec.models.runner import forward_once

PROMPT = ("def add(a, b):\n    return a + b\n\nclass Cache:\n    def rollback(self, n):\n        self.length = n\n"
          "The quick brown fox jumps over the lazy dog.")        # ~60 tokens with the template: past 32


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    return make_family(tmp_path_factory.mktemp("llama3") / "m", "llama")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return make_family(tmp_path_factory.mktemp("qwen3") / "m", "qwen3")


def _reference(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        return model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(ids):].tolist()


def _check_against_transformers(source: str, ref) -> LLM:
    """Logits of a prompt past the original context within fp32 tolerance, greedy tokens identical through the
    engine, plain and speculative (ngram, suffix)."""
    ours = load_model(source, dtype="float32", device="cpu", progress=False, pack=False)
    ids = torch.randint(5, ref.config.vocab_size, (70,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    got = forward_once(ours.model, ids)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert (got - want).abs().max().item() < 1e-3
    llm = LLM(target=source, dtype="float32", progress=False,
              speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=4))
    prompt_ids = llm.encode(PROMPT)
    assert len(prompt_ids) > LLAMA3_ROPE["original_max_position_embeddings"]
    want_ids = _reference(ref, prompt_ids, 30)
    assert len(set(want_ids)) >= 3
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    for method in ("none", "ngram", "suffix"):
        assert llm.generate(PROMPT, params, spec=method)[0].token_ids == want_ids, method
    return llm


def test_llama3_rope_scaling_from_an_hf_directory(llama3, tmp_path):
    path, ref = llama3
    ours = load_model(str(path), dtype="float32", device="cpu", progress=False)
    assert ours.config.rope_scaling["rope_type"] == "llama3" and ours.config.tie_word_embeddings
    _check_against_transformers(str(path), ref)
    # the negative control: the same weights without the scaling (what specdec computed before) give other tokens
    plain = tmp_path / "no-scaling"
    shutil.copytree(path, plain)
    cfg = json.loads((plain / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_parameters"]["rope_theta"]}
    (plain / "config.json").write_text(json.dumps(cfg))
    llm = LLM(target=str(plain), dtype="float32", progress=False)
    ids = llm.encode(PROMPT)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    assert llm.generate(PROMPT, params)[0].token_ids != _reference(ref, ids, 30)


def test_llama3_rope_scaling_from_a_gguf(llama3, tmp_path):
    """llama.cpp writes a Llama 3 file's scaling as the rope_freqs tensor, and its Q/K rows permuted."""
    path, ref = llama3
    gguf_path = write_gguf(path, ref, tmp_path / "llama3.gguf", "llama")
    ours = load_model(str(gguf_path), dtype="float32", device="cpu", progress=False)
    assert ours.config.rope_scaling["rope_type"] == "freq_factors"
    _check_against_transformers(str(gguf_path), ref)


def test_llama_gguf_blocks_as_int4_keep_the_rows_in_order(llama3, tmp_path):
    """A llama-arch file's quantized Q/K blocks, kept as they are (int4 from GGUF blocks), move back to HF's row
    order: the int4 model's logits follow the float model's of the same file."""
    path, ref = llama3
    gguf_path = write_gguf(path, ref, tmp_path / "q8.gguf", "llama", q8=True)
    exact = load_model(str(gguf_path), dtype="float32", device="cpu", progress=False, pack=False)
    blocks = load_model(str(gguf_path), dtype="bfloat16", device="cpu", progress=False, quantization="int4")
    ids = torch.randint(5, ref.config.vocab_size, (70,), generator=torch.Generator().manual_seed(3)).tolist()
    want, got = forward_once(exact.model, ids), forward_once(blocks.model, ids).float()
    # the tied head is F32 in the file and re-quantized to 4 bits, on a random model: 0.86 of the argmaxes and 12%
    # relative error measured here; with the file's row order kept, 0.04 and 125%
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.7
    assert ((got - want).norm() / want.norm()).item() < 0.3
    # LLM() without a quantization keeps the blocks as `specdec serve` does (it once loaded the runtime dtype)
    from specdec import LLM
    from specdec.models.quantization.kernels import vector_kernel

    llm = LLM(target=str(gguf_path), device="cpu", progress=False)
    assert llm.quantization == ("int4" if vector_kernel(4) else "none")


@pytest.mark.parametrize("rope", [{"rope_type": "linear", "factor": 3.0},
                                  {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}])
def test_linear_and_yarn_rope_scaling(tmp_path, rope):
    path, ref = make_family(tmp_path / "m", "llama", rope_parameters={"rope_theta": 10000.0, **rope})
    _check_against_transformers(str(path), ref)


def test_qwen3_from_an_hf_directory_and_a_gguf(qwen3, tmp_path):
    path, ref = qwen3
    ours = load_model(str(path), dtype="float32", device="cpu", progress=False)
    assert (ours.config.arch, ours.config.qk_norm, ours.config.head_dim) == ("qwen3", True, 32)
    _check_against_transformers(str(path), ref)
    gguf_path = write_gguf(path, ref, tmp_path / "qwen3.gguf", "qwen3")
    _check_against_transformers(str(gguf_path), ref)


@pytest.mark.parametrize("window", [None, 16])
def test_mistral_with_and_without_a_sliding_window(tmp_path, window):
    """Mistral is the Llama shape; with a sliding window shorter than the prompt every layer drops the keys past it
    (the prompt and the answer run 40+ positions past a window of 16)."""
    path, ref = make_family(tmp_path / "m", "mistral", sliding_window=window)
    cfg = load_model(str(path), dtype="float32", device="cpu", progress=False).config
    assert (cfg.arch, cfg.sliding_window) == ("llama", window)
    _check_against_transformers(str(path), ref)
    if window:       # the negative control: the same weights attending over every key give other tokens
        llm = LLM(target=str(_edited(path, tmp_path, sliding_window=None)), dtype="float32", progress=False)
        params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
        assert llm.generate(PROMPT, params)[0].token_ids != _reference(ref, llm.encode(PROMPT), 30)


def _edited(path, tmp_path, **changes):
    out = tmp_path / "edited"
    shutil.copytree(path, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(changes)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "rope_type 'dynamic'"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type 'longrope'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor 0.5"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16}, "sliding_window 16"),
    ({"model_type": "phi3"}, "unsupported model_type 'phi3'"),
])
def test_what_specdec_does_not_compute_is_refused_in_one_line(llama3, tmp_path, capsys, changes, message):
    path = _edited(llama3[0], tmp_path, **changes)
    assert main(["generate", "hi", "--target", str(path), "--dtype", "float32", "--max-tokens", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("extra, tensors, message", [
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, None, "rope.scaling.type 'yarn'"),
    ({"llama.attention.sliding_window": 16}, None, "sliding_window 16"),
    (None, {"blk.0.attn_output.bias": [0.0] * 64}, "'blk.0.attn_output.bias' is not computed"),
])
def test_a_gguf_with_what_specdec_does_not_compute_is_refused(llama3, tmp_path, capsys, extra, tensors, message):
    import numpy as np

    path, ref = llama3
    tensors = {k: np.asarray(v, dtype=np.float32) for k, v in (tensors or {}).items()}
    gguf_path = write_gguf(path, ref, tmp_path / "m.gguf", "llama", extra=extra, extra_tensors=tensors)
    assert main(["generate", "hi", "--target", str(gguf_path), "--dtype", "float32", "--max-tokens", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_a_weight_the_forward_would_not_read_is_refused(llama3, tmp_path):
    """An o_proj bias in the weights of a config that says none: refused, never dropped."""
    from safetensors.torch import load_file, save_file

    from specdec.errors import SpecDecError

    out = _edited(llama3[0], tmp_path)
    state = load_file(str(out / "model.safetensors"))
    state["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(SpecDecError, match="'model.layers.0.self_attn.o_proj.bias', which specdec's llama forward"):
        load_model(str(out), dtype="float32", device="cpu", progress=False)


def test_the_readme_and_specdec_models_list_the_families_of_the_table(capsys):
    """One table (models/families.py): the README's copy is the generated one, `specdec models` prints every
    family, and the config readers accept exactly its model types and GGUF architectures."""
    from pathlib import Path

    from specdec.models import families
    from specdec.models.config import ModelConfig
    from specdec.models.gguf_weights import SUPPORTED_ARCHS

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    start = readme.index("<!-- families:")
    block = readme[readme.index("\n", start) + 1: readme.index("<!-- /families -->")].strip()
    assert block == families.markdown_table()
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert all(f.name in out for f in families.FAMILIES) and "refused at load" in out
    assert SUPPORTED_ARCHS == ("qwen2", "qwen3", "llama", "gemma3")
    with pytest.raises(ValueError, match="unsupported model_type 'phi3' \\(supported: qwen2, qwen3, llama, mistral"):
        ModelConfig.from_hf_config({"model_type": "phi3"})


def test_a_llama3_draft_pair_served_keeps_the_targets_tokens(llama3, tmp_path):
    """Two tiny Llama 3 models of one tokenizer, the smaller drafting: served (`specdec serve`'s app), every
    method's greedy text equals speculation off's, and transformers' tokens."""
    import httpx
    from server_utils import running_server

    path, ref = llama3
    draft_path, _ = make_family(tmp_path / "draft", "llama", seed=1, num_hidden_layers=1)
    llm = LLM(target=str(path), draft=str(draft_path), dtype="float32", device="cpu", progress=False,
              speculative=SpeculativeConfig(method="draft", num_speculative_tokens=3))
    want = _reference(ref, llm.encode(PROMPT), 24)
    with running_server(llm, SpeculativeConfig(method="draft", num_speculative_tokens=3), name="llama3") as (url, _):
        texts = {}
        for method in ("none", "draft", "ngram", "suffix"):
            r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
                "model": "llama3", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24,
                "temperature": 0, "ignore_eos": True, "speculative": {"method": method}})
            assert r.status_code == 200, r.text
            texts[method] = r.json()["choices"][0]["message"]["content"]
    assert len(set(texts.values())) == 1, texts
    assert texts["none"] == llm.tokenizer.decode(want)
