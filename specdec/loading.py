"""What an engine runs on, loaded from EngineArgs: the target, the draft model when a method asked for needs one,
and the learned heads asked for. `LLM` (the API) gets a `LoadedModels` from here and builds the engine over it;
nothing here knows about requests.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from .engine_args import EngineArgs
from .errors import SpecDecError
from .models.heads import LoadedHead
from .models.loader import LoadedModel, default_quantization, load_model, source_arch
from .models.quantization import kernels
from .models.registry import DEFAULT_DRAFT
from .proposers import check_compatible
from .proposers.cross_vocab import METHOD as CROSS_VOCAB
from .proposers.cross_vocab import vocab_map_of
from .proposers.draft_vocab import draft_output_ids
from .proposers.registry import get_method, head_methods

# the int4 draft's MLP linears' bits unless the speculative config says (docs/benchmarks/draft-bits)
DEFAULT_DRAFT_MLP_BITS = 4

log = logging.getLogger("specdec")


@dataclass
class LoadedModels:
    target: LoadedModel
    quantization: str = "none"                     # the target's weights as loaded: none | int8 | int4
    draft: LoadedModel | None = None
    draft_quantization: str | None = None          # the draft's weights as loaded: none | int8 | int4
    draft_cross_vocab: bool = False                # the draft has another vocabulary (method cross_vocab drafts)
    draft_vocab_size: int | None = None            # rows of the draft's output head where it was cut (None: whole)
    draft_mlp_bits: int | None = None              # the int4 draft's MLP linears' bits (None: not int4)
    heads: dict[str, LoadedHead] = field(default_factory=dict)   # {method: head}


def default_draft_quantization(requested: str | None, target: LoadedModel) -> str:
    """The draft's weights: as requested, else int4 for a bf16 target on CPU when specdec._C is built, else the
    runtime dtype. A draft's tokens are verified by the target, so its precision can cost acceptance, never
    correctness, while its step cost is what speculation pays for every proposed token (the 0.5B reads 559 MB a
    step in 4-bit against ~1 GB in bf16; llama.cpp users pair a big target with a Q4 draft for the same reason)."""
    if requested is not None:
        return requested
    from .models.quantization.kernels import available

    target_weight = target.model.embed_tokens.weight
    if target_weight.device.type == "cpu" and target_weight.dtype == torch.bfloat16 and available():
        return "int4"
    return "none"


def load_head_for(method: str, path: str | None, target: LoadedModel, quantization: str | None = None) -> LoadedHead:
    """A learned head for the target: from `path`, else the one shipped for the default target; its linears on
    the engine's CPU kernels (quantization: none | int8 | int4; None: models.heads.default_head_quantization)."""
    from .models.heads import load_head, pack_head, shipped_head

    weight = target.model.embed_tokens.weight
    head = load_head(path or shipped_head(method, target.name, get_method(method).trainable), target.model,
                     weight.dtype, weight.device, method)
    head.quantization = pack_head(head.module, quantization)
    return head


def default_draft(arch: str) -> str | None:
    """The built-in draft (Qwen2.5-Coder 0.5B) for a target of its family; a target of another family (Gemma 3)
    gets a draft model only when one is named."""
    return DEFAULT_DRAFT if arch in ("qwen2", "llama") else None


def default_heads(method: str, target_name: str) -> dict[str, str | None]:
    """Heads loaded when none are named: under a policy (auto), the heads shipped for the target, so it weighs them
    beside the draft model and lookup (docs/benchmarks/heads-default); else none."""
    from .models.heads import shipped_heads

    return ({m: None for m in shipped_heads(target_name, head_methods())} if get_method(method).kind == "policy"
            else {})


def wants_draft_model(args: EngineArgs) -> bool:
    """A draft model is loaded for a method that needs one, and for the policy (it weighs the draft), unless
    `draft` is "none"."""
    method = get_method(args.speculative.method)
    return (method.needs == "draft_model" or method.kind == "policy") and args.draft != "none"


def resolve_quantization(args: EngineArgs) -> str:
    """The target's weights as they will load: `args.quantization`, or when left out what the file and the device
    call for (models.loader.default_quantization). The one place the default is decided: LLM, the CLI, the server
    (which prints it before loading) and the benchmarks all ask here."""
    if args.quantization is not None:
        return args.quantization
    return default_quantization(args.target, args.device, progress=args.progress)


def load_models(args: EngineArgs) -> LoadedModels:
    """The target, the draft model (wants_draft_model) and the heads: the speculative method's when it needs one,
    and any others asked for in `args.heads` ({method: directory or None = shipped}), so that requests may pick
    them per request."""
    spec = args.speculative
    draft = None
    if wants_draft_model(args):      # read from the target's header: a missing draft is refused before any load
        draft = args.draft or spec.model or default_draft(arch := source_arch(args.target, args.progress))
        if draft is None and get_method(spec.method).needs == "draft_model":
            raise SpecDecError(f"method '{spec.method}' needs a draft model for {args.target} ({arch}; the built-in "
                               f"draft is a Qwen2): pass --draft")
    quantization = resolve_quantization(args)
    target = load_model(args.target, dtype=args.dtype, device=args.device, progress=args.progress,
                        quantization=quantization)
    out = LoadedModels(target, quantization)
    if draft is not None:
        # a draft's int4 is 4-bit throughout (its Q6_K/Q8_0 blocks re-quantized): its tokens are verified, so only
        # its step cost matters (measured on the 0.5B: 796 -> 559 MB, 23.7 -> 16.0 ms a step)
        out.draft_quantization = default_draft_quantization(spec.quantization, target)
        # the built-in draft's head is cut to the tokens its target emits, by default where a ranking ships for the
        # target; another draft only when asked (draft_vocab_size), and then it must share the target's vocabulary
        cut = spec.draft_vocab_size if spec.draft_vocab_size is not None or draft == DEFAULT_DRAFT else 0
        output_ids = draft_output_ids(target.name, cut, target.tokenizer.vocab_size) if cut != 0 else None
        out.draft_mlp_bits = (spec.draft_mlp_bits or DEFAULT_DRAFT_MLP_BITS) if out.draft_quantization == "int4" \
            else None
        if out.draft_mlp_bits == 3 and not kernels.vector_kernel(3):
            log.warning("draft_mlp_bits 3: this CPU has no vector kernel for 3-bit codes (AVX-512 VNNI runs them), "
                        "so the portable one will: the draft's steps get slower, not faster")
        out.draft = load_model(draft, dtype=args.dtype, device=args.device, progress=args.progress,
                               quantization=out.draft_quantization, int4_exact=False, output_ids=output_ids,
                               mlp_bits=out.draft_mlp_bits or 4)
        out.draft_vocab_size = None if output_ids is None else len(output_ids)
        try:
            check_compatible(target.tokenizer, out.draft.tokenizer, target.config.vocab_size,
                             out.draft.config.vocab_size)
        except SpecDecError as exc:
            policy = get_method(spec.method).kind == "policy"
            if output_ids is not None:
                raise SpecDecError(f"{exc}: draft_vocab_size cuts the head of a draft that shares the target's "
                                   "vocabulary (0 keeps the whole head)") from None
            if spec.method != CROSS_VOCAB.name and not policy:
                raise SpecDecError(f"{exc} (method {CROSS_VOCAB.name} drafts with a model of another vocabulary)"
                                   ) from None
            out.draft_cross_vocab = True
            if policy:                         # auto weighs it only when the pair shares enough to draft with
                try:
                    vocab_map_of(target.tokenizer, out.draft.tokenizer).check()
                except SpecDecError as why:
                    log.warning("draft %s is not used: %s", out.draft.name, why)
                    out.draft, out.draft_cross_vocab = None, False
    wanted = dict(args.heads) if args.heads is not None else default_heads(spec.method, target.name)
    if get_method(spec.method).needs == "head":
        wanted[spec.method] = spec.model
    out.heads = {m: load_head_for(m, path, target, args.head_quantization) for m, path in wanted.items()}
    return out
