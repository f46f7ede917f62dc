"""Resolve a model argument, convert its weights once, and load them fast afterwards.

A model argument is a built-in name, a `.gguf` file, or an HF-format directory (config.json +
*.safetensors + tokenizer.json). The first load converts the weights to the runtime dtype with fused
QKV / gate-up matrices and stores them as safetensors (plus the built tokenizer) under
`<cache>/converted/`; later loads read those back in seconds. Cache entries are written to a temporary
directory and renamed into place, so an interrupted conversion leaves nothing that looks complete; each records
its source's sha256, so weights are never read for a source whose bytes changed.
"""
from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import SpecDecError
from ..tokenizer import Tokenizer
from ..utils import atomic_dir, remove_tree
from .config import ModelConfig
from .gemma3 import Gemma3Transformer
from .output_rows import OutputRows
from .qwen2 import Transformer
from .registry import BUILTIN_MODELS, assemble, cache_dir
from .sources import made_from, record_source, source_digest, source_key

log = logging.getLogger("specdec")

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass
class LoadedModel:
    name: str
    source: Path
    model: Transformer
    tokenizer: Tokenizer
    config: ModelConfig
    load_s: float
    converted: bool            # True when this load did the (slow) first conversion

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_nbytes()


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise SpecDecError(f"unknown dtype '{dtype}' (choose from: bfloat16, float32, float16)")
    return DTYPES[dtype]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_source(spec: str, progress: bool = True) -> tuple[str, Path]:
    """Model argument -> (display name, path of a .gguf file or HF directory)."""
    if spec in BUILTIN_MODELS:
        return spec, assemble(BUILTIN_MODELS[spec], progress=progress)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise SpecDecError(f"{spec}: not a .gguf file")
        return path.stem, path.resolve()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecDecError(f"{spec}: directory has no config.json (expected an HF-format model directory)")
        return path.name, path.resolve()
    if "/" in spec or spec.endswith(".gguf"):
        raise SpecDecError(f"model file or directory not found: {spec}")
    raise SpecDecError(f"unknown model '{spec}' (built-in: {', '.join(BUILTIN_MODELS)}; "
                       "or a .gguf path / HF directory)")


def source_arch(spec: str, progress: bool = True) -> str:
    """The family a model argument names ('qwen2', 'llama', 'gemma3'), from its GGUF header or config.json, without
    loading it (what a method that needs a same-family draft can be refused by before anything loads)."""
    _, path = resolve_source(spec, progress=progress)
    if path.is_file():
        from ..gguf_file import header_field

        return str(header_field(path, "general.architecture", ""))
    cfg = json.loads((path / "config.json").read_text())
    arch = cfg.get("model_type", "llama")
    return "gemma3" if arch in ("gemma3", "gemma3_text") else arch


GGUF_FLOAT_FILE_TYPES = (0, 1, 32)     # llama.cpp's file_type ALL_F32, MOSTLY_F16, MOSTLY_BF16: not block-quantized


def default_quantization(spec: str, device: str | torch.device | None = None, progress: bool = True) -> str:
    """The target's weights when no --quantization is given: int4 for a GGUF of quantized blocks on a CPU where
    specdec._C runs 4-bit codes vectorized (AVX-512 VNNI or AVX2), else none (the runtime dtype).

    int4 keeps a GGUF's Q4_K / Q5_0 / Q6_K / Q8_0 blocks as they are, so it holds exactly what the file holds,
    while bf16 reads ~3.4x the bytes per token for no more information. A float GGUF or an HF directory keeps
    its precision unless asked (4-bit would be a lossy quantization the user did not choose)."""
    device = torch.device(device) if device is not None else default_device()
    if device.type != "cpu":
        return "none"
    from .quantization.kernels import vector_kernel

    _, path = resolve_source(spec, progress=progress)
    if not path.is_file() or not vector_kernel(4):
        return "none"
    from ..gguf_file import header_field

    file_type = header_field(path, "general.file_type")
    return "none" if file_type is None or int(file_type) in GGUF_FLOAT_FILE_TYPES else "int4"


def build_model(cfg: ModelConfig) -> Transformer:
    """The decoder class of the config's family, built on the current default device."""
    return Gemma3Transformer(cfg) if cfg.arch == "gemma3" else Transformer(cfg)


# Gemma 3's norms besides the two every family has (HF names under model.layers.N.); Qwen3 has the q/k ones.
_QK_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
_GEMMA3_NORMS = ("pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight", *_QK_NORMS)


def _layer_norms(cfg: ModelConfig) -> tuple[str, ...]:
    return ("input_layernorm.weight", "post_attention_layernorm.weight",
            *(_GEMMA3_NORMS if cfg.arch == "gemma3" else _QK_NORMS if cfg.qk_norm else ()))


# -- conversion: HF-named float32 tensors -> our fused, runtime-dtype state dict -----------------------
def _fuse(hf: dict, cfg: ModelConfig, dtype: torch.dtype, norm_offset: float = 0.0) -> dict:
    """Values are float tensors, or BlockCodes (int4 from GGUF blocks) for linear weights."""
    from .quantization.blocks import BlockCodes, concat

    out: dict = {}

    def cast(t):
        return t if isinstance(t, BlockCodes) else t.to(dtype)

    def cat(ts):
        return concat(ts) if isinstance(ts[0], BlockCodes) else torch.cat(ts).to(dtype)

    def take(name):
        if name not in hf:
            raise SpecDecError(f"weights are missing tensor '{name}'")
        return hf.pop(name)

    def norm(name):   # norm_offset: Gemma's HF checkpoints store w for a norm that multiplies by 1 + w
        return (take(name) + norm_offset).to(dtype)

    out["embed_tokens.weight"] = take("model.embed_tokens.weight").to(dtype)
    out["norm.weight"] = norm("model.norm.weight")
    if not cfg.tie_word_embeddings or "lm_head.weight" in hf:   # a tied head's own int4 codes (see _convert_gguf)
        out["lm_head.weight"] = cast(take("lm_head.weight"))
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        q = f"layers.{i}."
        for n in _layer_norms(cfg):
            out[q + n] = norm(p + n)
        out[q + "self_attn.qkv_proj.weight"] = cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
        if cfg.attention_bias:
            out[q + "self_attn.qkv_proj.bias"] = torch.cat([take(p + f"self_attn.{n}_proj.bias")
                                                             for n in "qkv"]).to(dtype)
        out[q + "self_attn.o_proj.weight"] = cast(take(p + "self_attn.o_proj.weight"))
        out[q + "mlp.gate_up_proj.weight"] = cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
        out[q + "mlp.down_proj.weight"] = cast(take(p + "mlp.down_proj.weight"))
    # a tensor the forward would not read (an o_proj or MLP bias, a norm of another family) changes the model's
    # arithmetic: refused, never dropped (rotary_emb.inv_freq buffers of older checkpoints are derived, not weights)
    left = sorted(n for n in hf if not n.endswith("rotary_emb.inv_freq"))
    if left:
        raise SpecDecError(f"weights hold tensor '{left[0]}', which specdec's {cfg.arch} forward does not compute"
                           + (f" (and {len(left) - 1} more)" if len(left) > 1 else ""))
    return out


def _convert_gguf(path: Path, dtype: torch.dtype, progress: bool, int4: bool = False, int4_exact: bool = True,
                  mlp_bits: int = 4):
    from tqdm import tqdm

    from ..gguf_file import open_gguf
    from .gguf_weights import dequantize_hf, gguf_config, iter_hf_tensors, llama_row_order
    from .quantization.blocks import take_rows
    from .quantization.convert import is_mlp_weight
    from .quantization.gguf_blocks import codes_for_bits, codes_for_int4

    reader = open_gguf(path)
    cfg = gguf_config(reader)
    items = list(iter_hf_tensors(reader, cfg))

    def work(item):
        name, tensor = item
        if int4 and (name.endswith("proj.weight") or name == "lm_head.weight"):
            # the GGUF's blocks, kept without loss where the type allows (int4_exact), else 4-bit everywhere; a
            # llama-arch file's Q/K rows back in HF's order (whole rows move, so the blocks stay as they are)
            codes = codes_for_int4(tensor, exact=int4_exact) if mlp_bits == 4 or not is_mlp_weight(name) else \
                codes_for_bits(tensor, mlp_bits)
            order = llama_row_order(name, codes.shape[0], cfg)
            return name, codes if order is None else take_rows(codes, order)
        # dequantize to fp32, then straight to the runtime dtype to halve peak memory in bf16
        arr = np.ascontiguousarray(dequantize_hf(name, tensor, cfg))
        return name, torch.from_numpy(arr if arr.flags.writeable else arr.copy())

    if int4 and cfg.tie_word_embeddings:
        # a tied head reads the embedding's blocks (Gemma's Q8_0) as they are, as llama.cpp does, not a 4-bit copy
        # of them: the output head is most of a small model's bytes a token, and int4 keeps what the file holds
        items.append(("lm_head.weight", next(t for t in reader.tensors if t.name == "token_embd.weight")))
    hf: dict[str, torch.Tensor] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool, tqdm(
        total=len(items), desc=f"converting {path.name}", unit="tensor", disable=not progress
    ) as bar:
        for name, t in pool.map(work, items):
            hf[name] = t if dtype == torch.float32 or not isinstance(t, torch.Tensor) else t.to(dtype)
            bar.update(1)
    if cfg.tie_word_embeddings and not int4:
        hf.pop("lm_head.weight", None)
    return cfg, _fuse(hf, cfg, dtype), Tokenizer.from_gguf(reader)


def _convert_hf_dir(path: Path, dtype: torch.dtype):
    from safetensors.torch import load_file

    try:
        cfg = ModelConfig.from_hf_config(json.loads((path / "config.json").read_text()))
    except ValueError as exc:                 # what the config asks for that specdec does not compute
        raise SpecDecError(f"{path}: {exc}") from None
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise SpecDecError(f"{path}: no *.safetensors weight files")
    hf: dict[str, torch.Tensor] = {}
    for f in files:
        hf.update({k: v.float() for k, v in load_file(str(f)).items()})
    if cfg.tie_word_embeddings:
        hf.pop("lm_head.weight", None)
    return cfg, _fuse(hf, cfg, dtype, norm_offset=1.0 if cfg.arch == "gemma3" else 0.0), Tokenizer.from_hf_dir(path)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _convert(source: Path, entry: Path, dtype: torch.dtype, scheme: str, int4_exact: bool, progress: bool,
             mlp_bits: int = 4) -> None:
    """Convert the source into a new cache entry (written whole, or not at all), with the source's checksum."""
    from safetensors.torch import save_file

    digest = source_digest(source)
    if source.is_file():
        cfg, state, tok = _convert_gguf(source, dtype, progress, int4=scheme == "int4", int4_exact=int4_exact,
                                        mlp_bits=mlp_bits)
    else:
        cfg, state, tok = _convert_hf_dir(source, dtype)
    meta = None
    if scheme == "int4":
        from .quantization.convert import to_int4_state

        state, meta = to_int4_state(state, mlp_bits)
    with atomic_dir(entry) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata=meta)
        (tmp / "config.json").write_text(cfg.to_json())
        tok.save(tmp)
        record_source(tmp, source, digest)


def _read_entry(entry: Path, device: torch.device, scheme: str):
    """The model (weights assigned, before quantizing or packing), tokenizer and config of a cache entry."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    cfg = ModelConfig.from_json_file(entry / "config.json")
    tokenizer = Tokenizer.load(entry)
    with torch.device("meta"):
        model = build_model(cfg)
    state = load_file(str(entry / "model.safetensors"), device=str(device))
    packed = None
    if scheme == "int4":
        from .quantization.convert import split_int4_state

        with safe_open(str(entry / "model.safetensors"), "pt") as f:
            state, packed = split_int4_state(state, f.metadata())
        if "lm_head" in packed and model.lm_head is None:   # a tied head stored as its own codes
            with torch.device("meta"):
                model.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        missing, unexpected = model.load_state_dict(state, assign=True, strict=False)
        if unexpected or set(missing) != {f"{n}.weight" for n in packed}:
            raise ValueError(f"int4 cache entry does not match the model (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
    else:
        model.load_state_dict(state, assign=True, strict=True)
    return model, tokenizer, cfg, packed


def keep_output_rows(model: Transformer, packed: dict | None, output_ids: torch.Tensor) -> None:
    """Cut a model's output head (before it is quantized or packed) to the rows of `output_ids`: logits row j is then
    token output_ids[j] (model.output_ids). A head in packed blocks keeps its codes as they are; a float or tied
    head gets a linear of its own over those rows. The whole head stays at hand (model.output_rows) for the rows a
    request needs beyond the cut."""
    ids = torch.as_tensor(output_ids, dtype=torch.long).cpu()
    if int(ids.min()) < 0 or int(ids.max()) >= model.config.vocab_size or len(ids.unique()) != len(ids):
        raise SpecDecError(f"output head rows must be distinct token ids below {model.config.vocab_size}")
    if packed is not None and "lm_head" in packed:
        model.output_rows = OutputRows(packed["lm_head"])
        packed["lm_head"] = packed["lm_head"].select_rows(ids)
    else:
        full = (model.lm_head if model.lm_head is not None else model.embed_tokens).weight.detach()
        model.output_rows = OutputRows(full)
        model.lm_head = model.output_rows.linear(ids)
    model.output_ids = ids.to(model.embed_tokens.weight.device)


def load_model(spec: str, dtype: str | torch.dtype = "bfloat16", device: str | torch.device | None = None,
               progress: bool = True, pack: bool = True, quantization: str | None = None,
               quantize: str | None = None, int4_exact: bool = True,
               output_ids: torch.Tensor | None = None, mlp_bits: int = 4) -> LoadedModel:
    """Load a model argument for inference; converts and caches on first use.

    quantization (vLLM's name; `quantize` is the older alias): "none" (default: oneDNN-packed linears
    on CPU unless pack=False), "int8" (weight-only per-channel, e.g. for a draft whose steps are one
    token) or "int4" (group-32 blocks on specdec's own CPU kernel; from a GGUF, its Q4_K / Q6_K / Q8_0 /
    Q5_0 blocks are kept without loss). int4 has its own conversion-cache entry (`<dtype>-int4-v<N>`).
    int4_exact=False (drafts) re-quantizes the 6- and 8-bit blocks to 4 bits too (lossy, ~30% fewer bytes to read;
    cache entry `<dtype>-int4-v<N>-4bit`): a draft's tokens are verified, so only its speed matters. mlp_bits=3
    re-quantizes the MLP linears (gate/up, down) to 3 bits with a searched range per group (entry `...-mlp3`;
    docs/benchmarks/draft-bits).
    output_ids: keep only these rows of the output head (keep_output_rows; a draft's head cut to the tokens its
    target emits).
    An entry carries its source's checksum (converted again when the source's bytes changed) and a damaged entry is
    converted again, with one warning line.
    """
    from .quantization import quantize_model, resolve_scheme

    t0 = time.perf_counter()
    if quantization is not None and quantize is not None and resolve_scheme(quantization) != resolve_scheme(quantize):
        raise SpecDecError(f"quantization={quantization!r} and quantize={quantize!r} disagree")
    scheme = resolve_scheme(quantization if quantization is not None else quantize)
    dtype = resolve_dtype(dtype)
    device = torch.device(device) if device is not None else default_device()
    if scheme == "int4":
        from .quantization.kernels import load_kernels

        load_kernels()   # fail fast, before a long conversion, when the extension is missing
    name, source = resolve_source(spec, progress=progress)
    entry = cache_dir() / "converted" / f"{source.stem}-{source_key(source)}" / _dtype_name(dtype)
    if scheme == "int4":   # its own entry, named with the packed layout's version
        from .quantization.blocks import FORMAT_VERSION

        entry = entry.with_name(f"{entry.name}-int4-v{FORMAT_VERSION}" + ("" if int4_exact else "-4bit")
                                + ("" if mlp_bits == 4 else f"-mlp{mlp_bits}"))
    if (entry / "model.safetensors").is_file() and not made_from(entry, source):
        log.warning("converted weights in %s were made from another %s (its checksum changed under the same name, "
                    "size and time): converting it again", entry, source.name)
        remove_tree(entry)
    converted = False
    if not (entry / "model.safetensors").is_file():
        _convert(source, entry, dtype, scheme, int4_exact, progress, mlp_bits)
        converted = True
    try:
        model, tokenizer, cfg, packed = _read_entry(entry, device, scheme)
    except Exception as exc:  # noqa: BLE001 - a damaged cache is never a reason not to start: convert again
        if isinstance(exc, MemoryError):
            raise
        log.warning("converted weights in %s are damaged (%s: %s): converting %s again", entry,
                    type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "", source.name)
        remove_tree(entry)
        _convert(source, entry, dtype, scheme, int4_exact, progress, mlp_bits)
        converted = True
        model, tokenizer, cfg, packed = _read_entry(entry, device, scheme)
    model.eval().requires_grad_(False)
    if output_ids is not None:
        keep_output_rows(model, packed, output_ids)
    if scheme == "int4":
        quantize_model(model, "int4", packed)
    elif scheme == "int8":
        quantize_model(model, "int8")
    elif pack:
        quantize_model(model, "none")
    return LoadedModel(name=name, source=source, model=model, tokenizer=tokenizer, config=cfg,
                       load_s=time.perf_counter() - t0, converted=converted)
