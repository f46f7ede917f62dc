"""Parity on the real default pair (assembled from the installed part packages; run in CI)."""
import pytest
import torch
from model_cache import gguf_read_once

from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.models.loader import load_model
from specdec.models.registry import BUILTIN_MODELS, DEFAULT_DRAFT, assemble
from specdec.models.runner import forward_once

pytestmark = pytest.mark.real_models

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Rewrite this function with type hints and a docstring:\n\ndef mean(xs):\n    total = 0\n    for x in xs:\n"
    "        total += x\n    return total / len(xs)",
]


@pytest.fixture(scope="module")
def draft_gguf():
    return assemble(BUILTIN_MODELS[DEFAULT_DRAFT], progress=False)


def _transformers_reference(gguf, messages) -> dict:
    """transformers' own reading of the GGUF: its chat-template token ids and fp32 logits for `messages`. Loading a
    GGUF through transformers dequantizes every tensor in Python (over a minute here), so the reference is computed
    once per GGUF file and transformers version and kept in specdec's cache (written atomically), like a converted
    model; a new GGUF or another transformers version computes it again."""
    import hashlib
    import json

    import transformers
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from specdec.models.registry import cache_dir
    from specdec.utils import save_torch_atomic

    st = gguf.stat()
    key = hashlib.sha256(json.dumps([gguf.name, st.st_size, st.st_mtime_ns, transformers.__version__,
                                     messages]).encode()).hexdigest()[:16]
    path = cache_dir() / "test-references" / f"{gguf.stem}-{key}.pt"
    if path.is_file():
        return torch.load(path)
    with gguf_read_once():
        ref_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        ids = ref_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        ref = Qwen2ForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0]
    out = {"ids": list(ids), "logits": logits}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_torch_atomic(out, path)
    return out


def test_real_0_5b_matches_transformers(draft_gguf):
    ours = load_model(DEFAULT_DRAFT, dtype="float32", device="cpu", progress=False)
    messages = [{"role": "user", "content": "Write a function that reverses a string. 你好"}]
    ids = ours.tokenizer.encode_chat(messages)
    ref = _transformers_reference(draft_gguf, messages)
    assert ids == ref["ids"]
    logits = forward_once(ours.model, ids)
    assert torch.equal(logits.argmax(-1), ref["logits"].argmax(-1))
    assert (logits - ref["logits"]).abs().max().item() < 1e-2


@pytest.fixture(scope="module")
def llm_fp32():
    return LLM(speculative=SpeculativeConfig(method="draft", num_speculative_tokens=4), dtype="float32",
               progress=False, heads={"eagle3": None, "medusa": None})      # the heads shipped for the target


def test_real_pair_greedy_parity_fp32(llm_fp32):
    """fp32, one code prompt: prompt lookup, the 0.5B draft and the EAGLE-3 and Medusa heads shipped for the 1.5B
    each keep the plain greedy tokens; the draft agrees with the target most of the time on code, and the heads
    draft tokens the target accepts (on code, where they were trained)."""
    params = SamplingParams(max_tokens=16, temperature=0.0)
    prompt = PROMPTS[0]
    base = llm_fp32.generate(prompt, params, spec="none")[0]
    assert base.stats.completion_tokens > 10
    for spec, least in (("ngram", None), ("draft", 0.4), (SpeculativeConfig("eagle3", 3), 0.1),
                        (SpeculativeConfig("medusa", 3), 0.1)):
        out = llm_fp32.generate(prompt, params, spec=spec)[0]
        assert out.token_ids == base.token_ids and out.text == base.text, spec
        if least is not None:
            assert out.stats.acceptance_rate > least, (spec, out.stats.acceptance_rate)


def test_real_pair_greedy_parity_bf16():
    """The default runtime (int4 linears, bf16 activations) on CPU: every row is computed the same way whatever
    shares its forward, so greedy speculation is token-exact: each prompt under each method, all of them in one
    mixed batch, equals the prompt's plain decoding alone."""
    llm = LLM(speculative=SpeculativeConfig(method="draft", num_speculative_tokens=4), progress=False)
    params = SamplingParams(max_tokens=16, temperature=0.0)
    prompts = PROMPTS + ["用中文介绍一下你最喜欢的季节。"]
    alone = [llm.generate(prompt, params, spec="none")[0].token_ids for prompt in prompts]
    assert llm.generate(prompts[0], params, spec="draft")[0].token_ids == alone[0]        # alone, speculating
    jobs = [(i, m) for i in range(len(prompts)) for m in ("ngram", "draft")] + [(2, "none")]
    seqs = [llm.engine.add_request(f"batch-{j}", llm.encode(prompts[i]), params, SpeculativeConfig(m))
            for j, (i, m) in enumerate(jobs)]
    widest = drafted = 0
    while llm.engine.has_unfinished():
        assert all(o.error is None for o in llm.engine.step())
        widest = max(widest, llm.engine.last_step.num_seqs)
        drafted += llm.engine.last_step.num_draft_tokens
    assert widest >= 4 and drafted > 0
    for (i, m), seq in zip(jobs, seqs):
        assert list(seq.output_ids) == alone[i], (m, prompts[i])
