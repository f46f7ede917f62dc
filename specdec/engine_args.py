"""EngineArgs: everything that builds an engine, in one object (vLLM's `EngineArgs`).

Built once, from Python (`EngineArgs(target=..., speculative=SpeculativeConfig(...))`, or `LLM(**kwargs)`, which
builds one) or from the command line (`EngineArgs.from_cli_args(namespace)`), validated here and nowhere else,
and handed down: `LLM` loads what it names, the engine gets its scheduler config, the policy its PolicyConfig.
The server's own options (host, port, API key, queue limits) stay in server/.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import AUTO, PLAIN, QUANTIZATIONS, SpeculativeConfig
from .engine import SchedulerConfig
from .engine.scheduler import ITL_TARGET_S
from .errors import SpecDecError
from .models.registry import DEFAULT_TARGET
from .policy import PolicyConfig
from .proposers.registry import draft_model_method, get_method, head_methods
from .utils import parse_json_object

DTYPES = ("bfloat16", "float32", "float16")
# vLLM's `--speculative-config` JSON keys
SPEC_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "quantization",
             "eagle_topk", "num_steps", "draft_vocab_size", "draft_mlp_bits", "draft_p_min")


@dataclass
class EngineArgs:
    target: str = DEFAULT_TARGET                # built-in name, .gguf file or HF directory
    draft: str | None = None                    # draft model for methods draft/auto (None: the pair's 0.5B)
    speculative: SpeculativeConfig | None = None   # None: method draft when `draft` is given, else none
    dtype: str = "bfloat16"
    device: str | None = None                   # cpu | cuda (None: cuda when available)
    max_model_len: int | None = None            # None: the model's context window
    num_threads: int | None = None              # CPU threads (None: all cores)
    quantization: str | None = None             # target weights: none | int8 | int4 (None: by file and device)
    heads: dict[str, str | None] | None = None  # learned heads beside the speculative method's: {method: directory,
                                                # or None for the shipped head}; None: the heads shipped for the
                                                # target when the method is a policy (auto), else none
    head_quantization: str | None = None        # heads' linears: none | int8 | int4 (None: by kernels present)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    policy: PolicyConfig | None = None          # method auto's, per request or per server (None: the defaults, k_max
                                                # = num_speculative_tokens when the method is auto)
    enable_prefix_caching: bool = True          # keep finished requests' K/V for prompts that share a prefix
    suffix_cache: str | None = None             # suffix decoding's pools: read at start if present, saved as they grow
    progress: bool = True                       # progress bars while models load

    def __post_init__(self):
        if self.speculative is None:
            self.speculative = SpeculativeConfig(method=draft_model_method() if self.draft else PLAIN)
        elif isinstance(self.speculative, str):          # a method's name, as `generate(spec=...)` takes it
            self.speculative = SpeculativeConfig(method=self.speculative)
        elif not isinstance(self.speculative, SpeculativeConfig):
            raise SpecDecError(f"speculative must be a SpeculativeConfig or a method name, got "
                               f"{type(self.speculative).__name__}")
        if self.dtype not in DTYPES:
            raise SpecDecError(f"unknown dtype '{self.dtype}' (choose from: {', '.join(DTYPES)})")
        for name in ("quantization", "head_quantization"):
            if getattr(self, name) not in (None, *QUANTIZATIONS):
                raise SpecDecError(f"unknown {name} '{getattr(self, name)}' (choose from: {', '.join(QUANTIZATIONS)})")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise SpecDecError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.num_threads is not None and self.num_threads < 1:
            raise SpecDecError(f"num_threads must be >= 1, got {self.num_threads}")
        unknown = [m for m in self.heads or () if m not in head_methods()]
        if unknown:
            raise SpecDecError(f"'{unknown[0]}' is not a learned head method ({', '.join(head_methods())})")

    @property
    def policy_config(self) -> PolicyConfig:
        """Method auto's policy: as given, else the defaults with k_max = the speculative config's k."""
        if self.policy is not None:
            return self.policy
        return PolicyConfig(k_max=self.speculative.num_speculative_tokens if self.speculative.method == AUTO
                            else get_method(AUTO).default_k)

    @classmethod
    def from_cli_args(cls, args) -> EngineArgs:
        """From `specdec serve` (--speculative-config JSON, --spec-heads, scheduler and policy flags) or
        `specdec generate` (--method, --k, ...). Raises SpecDecError naming the flag for bad values."""
        if hasattr(args, "speculative_config"):
            spec = parse_speculative_config(args.speculative_config)
            method = get_method(spec.method)
            reads_draft = method.needs == "draft_model" or method.kind == "policy"   # auto weighs the draft too
            if args.draft and reads_draft and spec.model is None:
                spec.model = args.draft
            draft = spec.model if reads_draft else None
            heads = parse_heads(args.spec_heads)
            policy = PolicyConfig(k_max=spec.num_speculative_tokens, max_load=args.spec_max_load,
                                  min_acceptance=args.spec_min_acceptance) if spec.method == AUTO else None
            scheduler = scheduler_config(args.max_num_seqs, args.max_num_batched_tokens, args.max_total_tokens,
                                         args.itl_target_ms)
        else:
            try:
                spec = SpeculativeConfig(method=args.method, num_speculative_tokens=args.k, model=args.draft,
                                         prompt_lookup_max=args.prompt_lookup_max,
                                         prompt_lookup_min=args.prompt_lookup_min,
                                         quantization=args.draft_quantization, eagle_topk=args.eagle_topk,
                                         num_steps=args.num_steps, draft_vocab_size=args.draft_vocab_size,
                                         draft_mlp_bits=args.draft_mlp_bits, **p_min_of(args))
            except ValueError as exc:
                raise SpecDecError(str(exc)) from None
            draft, heads, policy, scheduler = args.draft, None, None, SchedulerConfig()
        try:
            return cls(target=args.target, draft=draft, speculative=spec, dtype=args.dtype, device=args.device,
                       max_model_len=args.max_model_len, num_threads=args.threads, quantization=args.quantization,
                       heads=heads, head_quantization=args.head_quantization, scheduler=scheduler, policy=policy,
                       enable_prefix_caching=args.enable_prefix_caching,
                       suffix_cache=getattr(args, "suffix_cache", None))
        except ValueError as exc:
            raise SpecDecError(str(exc)) from None


def p_min_of(args) -> dict:
    """--draft-p-min as a SpeculativeConfig keyword, where it was given (left out: the config's default)."""
    return {} if getattr(args, "draft_p_min", None) is None else {"draft_p_min": args.draft_p_min}


def parse_speculative_config(text: str | None) -> SpeculativeConfig:
    """vLLM's `--speculative-config` JSON -> SpeculativeConfig (left out: method auto)."""
    if not text:
        return SpeculativeConfig(method=AUTO)
    obj = parse_json_object(text, "--speculative-config")
    unknown = set(obj) - set(SPEC_KEYS)
    if unknown:
        raise SpecDecError(f"--speculative-config: unknown key '{sorted(unknown)[0]}' "
                           f"(known: {', '.join(sorted(SPEC_KEYS))})")
    try:
        return SpeculativeConfig(**obj)
    except (TypeError, ValueError) as exc:
        raise SpecDecError(f"--speculative-config: {exc}") from None


def parse_heads(text: str | None) -> dict[str, str | None] | None:
    """--spec-heads 'eagle3,medusa=DIR' -> {method: directory or None (the shipped head)}; 'none' -> {}; left out
    (None) -> None: the heads shipped for the target, under method auto."""
    if text is None:
        return None
    out: dict[str, str | None] = {}
    if text.strip() == "none":
        return out
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        method, _, path = part.partition("=")
        if method not in head_methods():
            raise SpecDecError(f"--spec-heads: '{method}' is not a learned head method ({', '.join(head_methods())})")
        out[method] = path or None
    return out


def scheduler_config(max_num_seqs: int, max_num_batched_tokens: int, max_total_tokens: int | None,
                     itl_target_ms: float | None = ITL_TARGET_S * 1000) -> SchedulerConfig:
    """The serve flags -> SchedulerConfig (--itl-target-ms 0: no cap; --max-total-tokens left out: the default)."""
    try:
        return SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                               itl_target_s=itl_target_ms / 1000 if itl_target_ms else None,
                               **({"max_total_tokens": max_total_tokens} if max_total_tokens else {}))
    except ValueError as exc:
        raise SpecDecError(str(exc)) from None
