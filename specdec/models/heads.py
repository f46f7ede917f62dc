"""Learned draft heads on disk: load the layouts users have (vLLM's and the papers' authors'), save ours atomically.

A head directory holds config.json and *.safetensors. EAGLE-3 (`LlamaForCausalLMEagle3`) and Medusa (`MedusaModel`,
or the Medusa authors' `medusa_num_heads`) are recognised from the config; EAGLE-1/2 heads (`EagleLlamaForCausalLM`,
or the authors' plain `LlamaForCausalLM` config beside an `fc` over [embedding, feature]) from the config or the
method asked for (vLLM's `"method": "eagle"`). A head is checked against the target at
load: hidden size, vocabulary, the layers it reads, and, for heads trained here, the target's fingerprint (a hash
of its configuration and the first rows of its embedding), so a head never silently drafts for a model it was not
trained on.

Heads saved here keep vLLM's tensor names. Their 2-D weights may be stored as int8 with a per-row scale
(`X.weight` int8 + `X.weight_scale`, as compressed-tensors' W8A16 does), which keeps a shipped head under 50 MB;
loading multiplies them back out in the runtime dtype.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import SpecDecError
from ..utils import atomic_dir
from .config import ModelConfig
from .eagle1 import EagleConfig, EagleHead
from .eagle3 import Eagle3Config, Eagle3Head
from .medusa import MedusaConfig, MedusaHeads


@dataclass
class LoadedHead:
    method: str
    module: nn.Module                  # Eagle3Head | EagleHead | MedusaHeads
    source: Path
    quantization: str = "none"         # its linears as run: none (runtime dtype) | int8 | int4 blocks (pack_head)
    trained_context: int | None = None  # the longest context its training saw, where its config says (auto does
                                        # not weigh it for longer prompts: docs/benchmarks/heads-default)


SHIPPED = Path(__file__).resolve().parent.parent / "heads"      # specdec/heads/<target>/<method>/


def shipped_heads(target_name: str, methods: tuple[str, ...]) -> list[str]:
    """Which of the learned-head `methods` ship with specdec for a target (none for a target of the user's own)."""
    return [m for m in methods if (SHIPPED / target_name / m / "config.json").is_file()]


def shipped_head(method: str, target_name: str, trainable: bool = False) -> Path:
    """The head shipped with specdec for a built-in target, or a SpecDecError saying there is none (and, for a
    `trainable` method, how to train one)."""
    path = SHIPPED / target_name / method
    if not (path / "config.json").is_file():
        have = sorted(f"{p.parent.name}/{p.name}" for p in SHIPPED.glob("*/*") if (p / "config.json").is_file())
        train = f", or train one with `specdec train-head --method {method}`" if trainable else ""
        raise SpecDecError(f"no {method} head ships for target '{target_name}' (shipped: {', '.join(have) or 'none'}); "
                           f"pass a head directory as the speculative config's model{train}")
    return path


def target_fingerprint(model) -> str:
    """A short hash of the target's shape and the signs of the first rows of its embedding: the same weights give
    the same print in any dtype (a sign survives every rounding), other weights a different one."""
    cfg = model.config
    return fingerprint_of(cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                          model.embed_tokens.weight[:64])


def fingerprint_of(vocab: int, hidden: int, layers: int, heads: int, embed_rows: torch.Tensor) -> str:
    h = hashlib.sha256(json.dumps([vocab, hidden, layers, heads]).encode())
    h.update(torch.sign(embed_rows.detach().float().cpu()).to(torch.int8).numpy().tobytes())
    return h.hexdigest()[:16]


def head_method(cfg: dict) -> str:
    archs = " ".join(cfg.get("architectures") or [])
    if "Eagle3" in archs or cfg.get("draft_vocab_size") is not None and "eagle" in archs.lower():
        return Eagle3Head.method
    if "Medusa" in archs or cfg.get("model_type") == "medusa" or "medusa_num_heads" in cfg:
        return MedusaHeads.method
    if "Eagle" in archs:
        return EagleHead.method
    raise SpecDecError(f"not a draft head this version reads (architectures {cfg.get('architectures')}); "
                       "expected LlamaForCausalLMEagle3, EagleLlamaForCausalLM or MedusaModel; an EAGLE-1/2 head "
                       "with a plain Llama config loads as method 'eagle'")


# vLLM / SpecForge names -> ours (the fused q/k/v and gate/up are concatenated at load)
_EAGLE3_NAMES = {
    "fc.weight": "fc.weight", "norm.weight": "norm.weight", "lm_head.weight": "lm_head.weight", "d2t": "d2t",
    "midlayer.input_layernorm.weight": "input_layernorm.weight",
    "midlayer.hidden_norm.weight": "hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "midlayer.self_attn.o_proj.weight": "self_attn.o_proj.weight",
    "midlayer.mlp.down_proj.weight": "mlp.down_proj.weight",
}
_EAGLE3_FUSED = {"self_attn.qkv_proj.weight": ("midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
                                               "midlayer.self_attn.v_proj.weight"),
                 "mlp.gate_up_proj.weight": ("midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight")}


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise SpecDecError(f"{path}: no *.safetensors weight files")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    # int8 with a per-row scale -> float (see the module docstring)
    for name in [n for n in out if n.endswith(".weight_scale")]:
        base = name[: -len("_scale")]
        out[base] = out[base].float() * out.pop(name).float()[:, None]
    return out


def _eagle3_state(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = {ours: hf[theirs] for theirs, ours in _EAGLE3_NAMES.items() if theirs in hf}
    for ours, parts in _EAGLE3_FUSED.items():
        if all(p in hf for p in parts):
            state[ours] = torch.cat([hf[p] for p in parts])
    # some exports drop the "midlayer." prefix (layers.0.*)
    if "input_layernorm.weight" not in state and "layers.0.input_layernorm.weight" in hf:
        return _eagle3_state({k.replace("layers.0.", "midlayer."): v for k, v in hf.items()})
    return state


def _eagle_state(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """EAGLE-1/2 tensors (the authors' names, with or without `model.`) -> ours: q/k/v and gate/up fused, the
    embedding dropped (the target's is used)."""
    hf = {k.removeprefix("model."): v for k, v in hf.items()}
    state = {k: v for k, v in hf.items() if k.split(".")[0] in ("fc", "embedding_layernorm", "hidden_states_layernorm")}
    layers = sorted({int(k.split(".")[1]) for k in hf if k.startswith("layers.")})
    for i in layers:
        pre = f"layers.{i}."
        for kind in ("weight", "bias"):
            qkv = [hf.get(f"{pre}self_attn.{x}_proj.{kind}") for x in "qkv"]
            if all(t is not None for t in qkv):
                state[f"{pre}self_attn.qkv_proj.{kind}"] = torch.cat(qkv)
        gate, up = hf.get(f"{pre}mlp.gate_proj.weight"), hf.get(f"{pre}mlp.up_proj.weight")
        if gate is not None and up is not None:
            state[f"{pre}mlp.gate_up_proj.weight"] = torch.cat([gate, up])
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight",
                     "input_layernorm.weight"):
            if pre + name in hf and not (i == 0 and name == "input_layernorm.weight"):
                state[pre + name] = hf[pre + name]
    return state


def _medusa_state(hf: dict[str, torch.Tensor], cfg: MedusaConfig) -> dict[str, torch.Tensor]:
    state = {}
    for name, t in hf.items():
        n = name.removeprefix("medusa_heads.").removeprefix("medusa_head.")
        parts = n.split(".")
        if n == "token_map":
            state["token_map"] = t.long()
        elif parts[0] in ("blocks", "lm_heads"):                  # vLLM: blocks.i.layers.j.linear?.w, lm_heads.i.w
            if parts[0] == "blocks":
                i, j, leaf = parts[1], parts[3], parts[-1]
                state[f"blocks.{i}.{j}.linear.{leaf}"] = t
            else:
                state[n] = t
        elif parts[0].isdigit():                                   # Medusa authors: i.j.linear.w, i.{layers}.weight
            i, j = parts[0], int(parts[1])
            if j == cfg.num_layers:
                state[f"lm_heads.{i}.weight"] = t
            else:
                state[f"blocks.{i}.{j}.linear.{parts[-1]}"] = t
    return state


def load_head(path: str | Path, target, dtype: torch.dtype, device: torch.device | str = "cpu",
              method: str | None = None) -> LoadedHead:
    """A head directory -> the head, checked against `target` (a Transformer), in `dtype` on `device`. `method`:
    what the user asked for (an EAGLE-1 config reads like any Llama's; vLLM too is told `"method": "eagle"`)."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise SpecDecError(f"{path}: not a draft head directory (no config.json)")
    cfg = json.loads((path / "config.json").read_text())
    try:
        found = head_method(cfg)
    except SpecDecError:
        if method != EagleHead.method:
            raise
        found = EagleHead.method
    if method is not None and found != method:
        raise SpecDecError(f"head {path} is a {found} head, not {method}")
    method = found
    tcfg: ModelConfig = target.config
    where = f"head {path}"
    fp = cfg.get("specdec_target_fingerprint")
    if fp and fp != target_fingerprint(target):
        raise SpecDecError(f"{where} was trained for another target ({cfg.get('specdec_target') or 'unnamed'}, "
                           f"fingerprint {fp}); this target's is {target_fingerprint(target)}")
    hf = _read_tensors(path)
    if method == Eagle3Head.method:
        hcfg = Eagle3Config.from_hf(cfg, tcfg)
        if hcfg.target_hidden_size != tcfg.hidden_size:
            raise SpecDecError(f"{where} reads target hidden states of size {hcfg.target_hidden_size}; the target's "
                               f"hidden size is {tcfg.hidden_size}")
        if hcfg.vocab_size != tcfg.vocab_size:
            raise SpecDecError(f"{where} maps onto a vocabulary of {hcfg.vocab_size} tokens; the target has "
                               f"{tcfg.vocab_size}")
        bad = [i for i in hcfg.aux_layers if not 0 <= i < tcfg.num_layers]
        if bad:
            raise SpecDecError(f"{where} reads target layers {list(hcfg.aux_layers)}; the target has "
                               f"{tcfg.num_layers} layers")
        if hcfg.hidden_size != tcfg.hidden_size:
            raise SpecDecError(f"{where} has hidden size {hcfg.hidden_size}; it embeds tokens with the target's "
                               f"embedding, whose size is {tcfg.hidden_size}")
        module = Eagle3Head(hcfg)
        state = _eagle3_state(hf)
        if "d2t" not in state:
            if hcfg.draft_vocab_size != hcfg.vocab_size:
                raise SpecDecError(f"{where} has a reduced draft vocabulary but no d2t map")
            state["d2t"] = torch.zeros(hcfg.draft_vocab_size, dtype=torch.long)
    elif method == EagleHead.method:
        state = _eagle_state(hf)
        hcfg = EagleConfig.from_hf(cfg, tcfg, fc_bias="fc.bias" in state)
        if hcfg.hidden_size != tcfg.hidden_size:
            raise SpecDecError(f"{where} has hidden size {hcfg.hidden_size}; it reads the target's states, of size "
                               f"{tcfg.hidden_size}")
        if hcfg.vocab_size != tcfg.vocab_size:
            raise SpecDecError(f"{where} drafts over {hcfg.vocab_size} tokens through the target's output head, "
                               f"which has {tcfg.vocab_size}")
        module = EagleHead(hcfg)
    else:
        hcfg = MedusaConfig.from_hf(cfg)
        if hcfg.hidden_size != tcfg.hidden_size:
            raise SpecDecError(f"{where} has hidden size {hcfg.hidden_size}; the target's is {tcfg.hidden_size}")
        if hcfg.vocab_size != tcfg.vocab_size:
            raise SpecDecError(f"{where} predicts over {hcfg.vocab_size} tokens; the target has {tcfg.vocab_size}")
        module = MedusaHeads(hcfg)
        state = _medusa_state(hf, hcfg)
        state.setdefault("token_map", torch.arange(hcfg.truncated_vocab_size, dtype=torch.long))
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise SpecDecError(f"{where} lacks weights: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    for name, t in state.items():
        if name in expected and tuple(t.shape) != tuple(expected[name].shape):
            raise SpecDecError(f"{where}: {name} has shape {tuple(t.shape)}, expected {tuple(expected[name].shape)}")
    module.load_state_dict({k: v for k, v in state.items() if k in expected})
    module.to(device)
    for p in module.parameters():
        p.data = p.data.to(dtype)
    module.requires_grad_(False)
    trained = cfg.get("specdec_trained_context")
    return LoadedHead(method, module.eval(), path,
                      trained_context=int(trained) if isinstance(trained, int) and trained > 0 else None)


def _unblockable_linears(module: nn.Module) -> list[str]:
    """Names of the linears whose inputs do not come in whole block groups (32 wide): they cannot take block weights."""
    from .quantization.blocks import INT4_GROUP

    return [n for n, m in module.named_modules() if isinstance(m, nn.Linear) and m.in_features % INT4_GROUP]


def default_head_quantization(module: nn.Module) -> str:
    """int4 blocks where specdec._C runs 4-bit codes on a vector kernel (AVX-512 VNNI or AVX2), else int8 blocks
    where it runs 8-bit codes on one, for a bf16 head on CPU whose linears' inputs come in whole 32-wide groups;
    else the runtime dtype (codes on the portable scalar kernel would be slower than the bf16 linears). In the
    engine a head's weights come from memory at every step (the target's forward in between has pushed them out
    of the caches), so its bytes set its cost: 4-bit blocks cut EAGLE-3's drafting from 0.22 to 0.14 of a target
    forward at the accepted lengths 8-bit blocks give (docs/benchmarks/heads-stage4/)."""
    from .quantization.kernels import vector_kernel

    w = next(module.parameters())
    if w.device.type != "cpu" or w.dtype != torch.bfloat16 or _unblockable_linears(module):
        return "none"
    return "int4" if vector_kernel(4) else "int8" if vector_kernel(8) else "none"


def pack_head(module: nn.Module, quantization: str | None = None) -> str:
    """Swap the head's linears for the engine's CPU kernels and return the scheme used: `int8` (8-bit blocks, Q8_0's
    shape) or `int4` (4-bit blocks) through specdec._C, `none` the batch-invariant runtime-dtype kernel (a no-op off
    CPU or in fp16); None picks default_head_quantization. A head's weights only shape its guesses, which the
    target verifies: quantizing it moves acceptance, never the output."""
    from .packed_linear import can_pack, pack_linear
    from .quantization import resolve_scheme

    scheme = resolve_scheme(quantization) if quantization is not None else default_head_quantization(module)
    if scheme != "none":
        from .quantization.blocks import INT4_GROUP, pack, quantize_int4, quantize_int8
        from .quantization.kernels import load_kernels
        from .quantization.linear import BlockQuantLinear

        load_kernels()                    # a clear error when the extension is missing
        if next(module.parameters()).device.type != "cpu":
            raise SpecDecError(f"{scheme} head weights are available on CPU only")
        odd = _unblockable_linears(module)
        if odd:
            raise SpecDecError(f"{scheme} head weights need linears whose inputs are a multiple of {INT4_GROUP} wide "
                               f"({odd[0]} is not); use --head-quantization none")
        codes = quantize_int8 if scheme == "int8" else quantize_int4

        def make(child: nn.Linear) -> nn.Module:
            p = pack(codes(child.weight.data.float()))
            p.share_equal_scales()
            return BlockQuantLinear(p, None if child.bias is None else child.bias.data)
    else:
        def make(child: nn.Linear) -> nn.Module:
            return pack_linear(child.weight.data, None if child.bias is None else child.bias.data)
    for m in list(module.modules()):
        for child_name, child in list(m.named_children()):
            if isinstance(child, nn.Linear) and (scheme != "none" or can_pack(child.weight)):
                setattr(m, child_name, make(child))
    return scheme


def hf_state(module: nn.Module, method: str) -> dict[str, torch.Tensor]:
    """Our module's weights under vLLM's names (q/k/v and gate/up split again)."""
    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    if method == MedusaHeads.method:
        out = {}
        for k, v in state.items():
            parts = k.split(".")
            if parts[0] == "blocks":          # blocks.i.j.linear.w -> blocks.i.layers.j.w
                out[f"blocks.{parts[1]}.layers.{parts[2]}.{parts[-1]}"] = v
            else:
                out[k] = v
        return out
    if method == EagleHead.method:
        out = {}
        cfg1: EagleConfig = module.cfg
        q, kv = cfg1.num_heads * cfg1.head_dim, cfg1.num_kv_heads * cfg1.head_dim
        for k, v in state.items():
            if ".qkv_proj." in k:
                out.update(zip((k.replace("qkv_proj", f"{x}_proj") for x in "qkv"), v.split((q, kv, kv))))
            elif ".gate_up_proj." in k:
                out.update(zip((k.replace("gate_up_proj", f"{x}_proj") for x in ("gate", "up")), v.chunk(2)))
            else:
                out[k] = v
        return out
    cfg: Eagle3Config = module.cfg
    out = {theirs: state[ours] for theirs, ours in _EAGLE3_NAMES.items()}
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    for ours, parts in _EAGLE3_FUSED.items():
        sizes = (q, kv, kv) if len(parts) == 3 else (cfg.intermediate_size,) * 2
        out.update(zip(parts, state[ours].split(sizes)))
    out["t2d"] = module.t2d().cpu()
    return out


def quantize_int8_rows(state: dict[str, torch.Tensor], min_numel: int = 1024) -> dict[str, torch.Tensor]:
    """2-D float weights -> int8 + per-row fp32 scale (quant.quantize_rows_int8); small and 1-D tensors unchanged."""
    from .quant import quantize_rows_int8

    out = {}
    for name, t in state.items():
        if t.is_floating_point() and t.dim() == 2 and t.numel() >= min_numel and name.endswith(".weight"):
            out[name], out[name + "_scale"] = quantize_rows_int8(t)
        else:
            out[name] = t
    return out


def save_head(module: nn.Module, method: str, out: str | Path, extra_config: dict | None = None,
              int8: bool = False) -> Path:
    """Write config.json + model.safetensors to `out` via a temporary directory renamed into place (never half
    written; an existing head at `out` is replaced only once the new one is complete)."""
    from safetensors.torch import save_file

    out = Path(out)
    cfg = {**module.cfg.to_hf(), **(extra_config or {})}
    state = hf_state(module, method)
    state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in state.items()}
    if int8:
        state = quantize_int8_rows(state)
    with atomic_dir(out, replace=True) as tmp:
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    return out
