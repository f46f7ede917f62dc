"""`specdec bench offline`: an A/B evaluation of speculative decoding on real prompts.

Loads the models once, warms every engine up, then runs the cross product (prompt x repeat x temperature x
(method, k)) with the same prompts and seeds for every method; peers (transformers, llama.cpp) run on the same
prompt tokens right after ours on each prompt, so that a slow minute of a noisy machine falls on both sides.
Writes `results.json`, `report.md` and PNG plots to the output directory, each atomically (an interrupted run
leaves no half-written file).
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..config import AUTO, DEFAULT_DRAFT_P_MIN, K_MAX, K_MIN, PLAIN, SpeculativeConfig
from ..errors import SpecDecError
from ..metrics.stats import peak_rss_mb
from ..proposers.registry import draft_model_method, get_method, lookup_method, method_names, tree_methods
from ..sampling_params import SamplingParams
from ..utils import write_json_atomic, write_text_atomic
from .datasets import load_prompts
from .summary import summarize


def tree_labels() -> dict[str, str]:
    """Bench-only labels: a method drafting token trees (eagle_topk > 1), beside its chain: {label: method}."""
    return {f"{m}-tree": m for m in tree_methods()}


def bench_methods() -> tuple[str, ...]:
    return (*method_names(), *tree_labels())


def base_method(label: str) -> str:
    """The declared method a bench label runs (a `-tree` label's method)."""
    return tree_labels().get(label, label)
RUN_FIELDS = ("method", "k", "temperature", "repeat", "prompt_index", "category", "seed", "prompt_tokens",
              "completion_tokens", "finish_reason", "ttft_s", "tpot_s", "decode_tok_s", "e2e_s",
              "acceptance_rate", "mean_accepted_length", "accepted_per_position", "draft_time_s", "verify_time_s",
              "prefill_time_s", "target_forwards", "draft_steps", "lookup_steps", "draft_tokens", "accepted_tokens",
              "drafted_per_position", "accepted_counts_per_position", "draft_kv_bytes", "peak_rss_mb")


@dataclass
class OfflineBenchConfig:
    prompts: str = "builtin"
    categories: list[str] | None = None     # keep only these categories of the prompt source
    methods: list[str] = field(default_factory=lambda: [PLAIN, lookup_method(), draft_model_method()])
    ks: list[int] = field(default_factory=lambda: [4])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    max_tokens: int = 128
    repeats: int = 1
    seed: int = 0
    out: str = "out/bench-offline"
    peers: list[str] = field(default_factory=list)
    target: str | None = None
    draft: str | None = None
    dtype: str = "bfloat16"
    device: str | None = None
    max_model_len: int | None = None
    threads: int | None = None
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    draft_quantization: str | None = None
    draft_vocab_size: int | None = None     # the draft's output head rows (None: the default; 0: the whole head)
    draft_mlp_bits: int | None = None       # the int4 draft's MLP linears: 3 or 4 bits (None: the default)
    draft_p_min: float = DEFAULT_DRAFT_P_MIN    # the draft model's chain stops after a token it is less sure of
    head_quantization: str | None = None     # learned heads' linears (None: models.heads.default_head_quantization)
    quantization: str | None = None         # the target's weights (--quantization)
    progress: bool = True
    heads: dict[str, str | None] = field(default_factory=dict)   # learned head per method (None: the shipped one)
    # eagle3-tree / medusa-tree: the head drafting token trees for greedy requests (sampled ones verify a chain)
    eagle_topk: int = 4                     # branching (SGLang's --speculative-eagle-topk)
    num_steps: int | None = None            # depth (None: min(k, 4))
    tree_tokens: list[int] = field(default_factory=list)   # nodes verified per tree (its k; empty: --k)

    def __post_init__(self):
        from .peers import PEERS

        bad = [m for m in self.methods if m not in bench_methods()]
        if bad:
            raise SpecDecError(f"unknown method '{bad[0]}' (choose from: {', '.join(bench_methods())})")
        if not self.methods:
            raise SpecDecError("--methods is empty")
        if PLAIN not in self.methods:       # the baseline every speedup and parity is measured against
            self.methods = [PLAIN, *self.methods]
        bad = [p for p in self.peers if p not in PEERS]
        if bad:
            raise SpecDecError(f"unknown peer '{bad[0]}' (choose from: {', '.join(PEERS)})")
        if not self.ks or any(not K_MIN <= k <= K_MAX for k in [*self.ks, *self.tree_tokens]):
            raise SpecDecError(f"--k and --tree-tokens values must be in {K_MIN}..{K_MAX}, got "
                               f"{[*self.ks, *self.tree_tokens]}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise SpecDecError(f"--temperature values must be >= 0, got {self.temperatures}")
        if self.max_tokens < 1 or self.repeats < 1:
            raise SpecDecError("--max-tokens and --repeats must be >= 1")
        try:                                 # SpeculativeConfig's own check, before anything loads
            SpeculativeConfig(draft_p_min=self.draft_p_min)
        except ValueError as exc:
            raise SpecDecError(f"--draft-p-min: {exc}") from None

    def configs(self) -> list[tuple[str, int]]:
        """(method, k) pairs; `auto` runs once (k = 0 here: the policy picks k per request, up to max(ks)); a tree
        method's k is its node count (--tree-tokens, else --k)."""
        trees = tree_labels()
        policies = [m for m in self.methods if get_method(base_method(m)).kind == "policy"]
        return [(PLAIN, 0)] + [(m, k) for m in self.methods if m != PLAIN and m not in policies
                               for k in (self.tree_tokens or self.ks if m in trees else self.ks)] + \
            [(m, 0) for m in policies]

    def spec(self, method: str, k: int) -> SpeculativeConfig:
        tree = method in tree_labels()
        policy = get_method(base_method(method)).kind == "policy"
        return SpeculativeConfig(method=base_method(method),
                                 num_speculative_tokens=k or (max(self.ks) if policy else None),
                                 prompt_lookup_max=self.prompt_lookup_max, prompt_lookup_min=self.prompt_lookup_min,
                                 eagle_topk=self.eagle_topk if tree else 1,
                                 num_steps=min(self.num_steps or 4, k) if tree else None,
                                 draft_p_min=self.draft_p_min)


def machine_info(threads: int) -> dict:
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError):
        mem_gb = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu": cpu, "cpu_count": os.cpu_count(), "threads": threads, "memory_gb": mem_gb,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "specdec_commit": commit}


def _heads(cfg: OfflineBenchConfig, declared: list) -> dict[str, str | None]:
    """The heads each head method asked for needs, and under auto the ones `specdec serve` loads by default, so
    that auto here is the method a user gets (a --<method>-head directory given wins)."""
    from ..loading import default_heads
    from ..models.registry import DEFAULT_TARGET

    heads = {m.name: cfg.heads.get(m.name) for m in dict.fromkeys(declared) if m.needs == "head"}
    if AUTO in cfg.methods:
        heads = {**default_heads(AUTO, cfg.target or DEFAULT_TARGET), **cfg.heads, **heads}
    return heads


def run_offline(cfg: OfflineBenchConfig) -> dict:
    import torch

    from ..llm import LLM
    from ..models.registry import DEFAULT_TARGET

    prompts = load_prompts(cfg.prompts, cfg.seed)          # bad input fails before any model loads
    if cfg.categories:
        have = dict.fromkeys(p["category"] for p in prompts)
        missing = [c for c in cfg.categories if c not in have]
        if missing:
            raise SpecDecError(f"no prompts in category '{missing[0]}' (have: {', '.join(have)})")
        prompts = [p for p in prompts if p["category"] in cfg.categories]
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise SpecDecError(f"--out {out} exists and is not a directory")
    # hf-assisted uses the draft too, when one is loaded (method draft, or --draft given)
    declared = [get_method(base_method(m)) for m in cfg.methods]
    need_draft = any(m.needs == "draft_model" or m.kind == "policy" for m in declared) or cfg.draft is not None
    t0 = time.perf_counter()
    llm = LLM(target=cfg.target or DEFAULT_TARGET, draft=cfg.draft, dtype=cfg.dtype, device=cfg.device,
              max_model_len=cfg.max_model_len, num_threads=cfg.threads, progress=cfg.progress,
              quantization=cfg.quantization, head_quantization=cfg.head_quantization,
              # every method's run of a prompt starts cold: a cached prefix would favour the later runs' TTFT
              enable_prefix_caching=False,
              heads=_heads(cfg, declared),
              # the methods asked for that draft with a model: the first one loads it (cross_vocab: another vocabulary)
              speculative=SpeculativeConfig(method=next((m.name for m in declared if m.needs == "draft_model"),
                                                        draft_model_method()) if need_draft else PLAIN,
                                            quantization=cfg.draft_quantization,
                                            draft_vocab_size=cfg.draft_vocab_size,
                                            draft_mlp_bits=cfg.draft_mlp_bits,
                                            prompt_lookup_max=cfg.prompt_lookup_max,
                                            prompt_lookup_min=cfg.prompt_lookup_min))
    if AUTO in cfg.methods:
        from ..policy import PolicyConfig

        llm.policy(PolicyConfig(k_max=max(cfg.ks)))          # measures (or reads) the cost model before timing
    cfg.quantization = llm.quantization            # as resolved at load (reported in the results' config)
    load_s = time.perf_counter() - t0
    specs = {(m, k): cfg.spec(m, k) for m, k in cfg.configs()}
    prompt_ids = [llm.encode(p["messages"]) for p in prompts]
    draft_kv_per_token = llm.draft.model.config.kv_bytes_per_token * (4 if cfg.dtype == "float32" else 2) // 2 \
        if llm.draft is not None else 0

    warm = SamplingParams(max_tokens=4, temperature=0.0)
    for m in dict.fromkeys(m for m, _ in cfg.configs()):
        # auto: warm the methods it may pick, without teaching its pools anything
        for sub in ((PLAIN, *llm.policy().available) if m == AUTO else (m,)):
            llm.generate(prompt_ids[0], warm, spec=SpeculativeConfig(method=sub) if m == AUTO else
                         next(spec for (mm, _), spec in specs.items() if mm == m))

    peers, peer_info = _load_peers(cfg, llm, prompt_ids)
    runs: list[dict] = []
    try:
        _run_all(cfg, llm, prompts, prompt_ids, specs, peers, runs, draft_kv_per_token)
    finally:
        for peer in peers.values():
            peer.close()
    _add_parity(llm, prompt_ids, runs)
    memory = {"target_weight_bytes": llm.target.weight_bytes,
              # bytes a target forward streams: every weight but the embedding table (only rows are gathered)
              "target_read_gb_per_forward":
                  (llm.target.weight_bytes - llm.target.model.embed_tokens.weight.nbytes) / 1e9,
              "draft_weight_bytes": llm.draft.weight_bytes if llm.draft is not None else 0,
              "draft_kv_bytes_per_token": draft_kv_per_token, "peak_rss_mb": peak_rss_mb(),
              "heads": {m: {"weight_bytes": h.module.weight_nbytes(), "quantization": h.quantization}
                        for m, h in llm.heads.items()},
              # each method's own status section (suffix decoding's pools: count, tokens, bytes)
              "methods": {m["method"]: m["status"] for m in llm.methods() if m["status"]}}
    config = {**asdict(cfg), **({"policy": llm.policy().status()} if AUTO in cfg.methods else {}),
              "methods": list(dict.fromkeys(m for m, _ in cfg.configs())),
              "target": llm.target.name, "draft": llm.draft.name if llm.draft else None,
              "target_source": str(llm.target.source), "draft_source": str(llm.draft.source) if llm.draft else None,
              "num_prompts": len(prompts), "load_s": load_s, "memory": memory, "peers": peer_info}
    result = {"config": config, "machine": machine_info(torch.get_num_threads()), "runs": runs,
              "summary": summarize(runs)}
    write_outputs(result, out)
    return result


def _load_peers(cfg: OfflineBenchConfig, llm, prompt_ids) -> tuple[dict, dict]:
    """Each peer loaded and warmed up (untimed) before any timed run: {name: peer}, {name: load info}."""
    from .peers import HFPeer, LlamaCppPeer, PeerRequest

    peers, info = {}, {}
    lookup_k = get_method(lookup_method()).default_k     # the peers' prompt lookup runs at our default k
    try:
        for name in cfg.peers:
            t0 = time.perf_counter()
            if name == "hf":
                peer = HFPeer(llm.target.source, llm.draft.source if llm.draft else None, cfg.dtype,
                              llm.tokenizer.eos_token_ids, lookup_k)
            else:
                n_ctx = min(llm.target.config.max_position_embeddings, max(map(len, prompt_ids)) + cfg.max_tokens + 64)
                peer = LlamaCppPeer(llm.target.source, n_ctx, cfg.threads or os.cpu_count() or 1, lookup_k,
                                    llm.tokenizer.eos_token_ids)
            peers[name] = peer
            info[name] = {"methods": peer.methods, "load_s": time.perf_counter() - t0}
            for m in peer.methods:      # warm-up, not timed
                try:
                    peer.run(m, PeerRequest(prompt_ids[0], 4, 0.0, cfg.seed))
                except Exception as exc:  # noqa: BLE001
                    info[name].setdefault("warmup_errors", {})[m] = str(exc)
    except BaseException:
        for peer in peers.values():
            peer.close()
        raise
    return peers, info


def _run_all(cfg: OfflineBenchConfig, llm, prompts, prompt_ids, specs: dict, peers: dict, runs: list[dict],
             draft_kv_per_token: int) -> None:
    """The timed runs: per prompt, repeat and temperature, every (method, k) of ours, then every peer method."""
    from tqdm import tqdm

    from .peers import PeerRequest

    per_prompt = len(specs) + sum(len(p.methods) for p in peers.values())
    bar = tqdm(total=len(prompts) * cfg.repeats * len(cfg.temperatures) * per_prompt, desc="bench offline",
               unit="run", disable=not cfg.progress)
    for i, (prompt, ids) in enumerate(zip(prompts, prompt_ids)):
        for rep in range(cfg.repeats):
            seed = cfg.seed + 1000 * i + rep
            for temp in cfg.temperatures:
                params = SamplingParams(max_tokens=cfg.max_tokens, temperature=temp, seed=seed)
                where = {"temperature": temp, "repeat": rep, "prompt_index": i, "category": prompt["category"],
                         "seed": seed, "prompt_tokens": len(ids)}
                for (m, k), spec in specs.items():
                    run = {"method": m, "k": k, **where}
                    try:
                        # pool = the prompt's pool (default: its category), one per method: auto's policy learns
                        # each pool's acceptance, suffix decoding its outputs, each from its own runs only (another
                        # method's run of the same prompt would hand suffix decoding the answer)
                        o = llm.generate(ids, params, spec=spec, pool=f"{prompt.get('pool', prompt['category'])}/{m}",
                                         request_id=f"{i}-{rep}-{temp}")[0]
                        if m == AUTO:
                            run.update({"chosen_method": o.stats.method, "chosen_k": o.stats.num_speculative_tokens,
                                        "policy_reason": o.stats.policy_reason})
                        run.update({f: v for f, v in o.stats.to_dict().items() if f in RUN_FIELDS and f not in run})
                        run["token_ids"] = o.token_ids
                        if get_method(base_method(m)).needs == "draft_model":
                            run["draft_kv_bytes"] = draft_kv_per_token * (len(ids) + len(o.token_ids) + k)
                    except Exception as exc:  # noqa: BLE001 - one failing run is data, not the end of the bench
                        run["error"] = f"{type(exc).__name__}: {exc}"
                    runs.append(run)
                    bar.update(1)
                for peer in peers.values():
                    for m in peer.methods:
                        run = {"method": m, "k": 0, **where}
                        try:
                            r = peer.run(m, PeerRequest(ids, cfg.max_tokens, temp, seed))
                            run.update({f: v for f, v in r.items() if f in RUN_FIELDS and f not in run})
                            run["k"] = r["num_speculative_tokens"]
                            run["token_ids"] = r["token_ids"]
                        except Exception as exc:  # noqa: BLE001 - a peer failing on a prompt is recorded
                            run["error"] = f"{type(exc).__name__}: {exc}"
                        runs.append(run)
                        bar.update(1)
    bar.close()


def _add_parity(llm, prompt_ids: list[list[int]], runs: list[dict]) -> None:
    """parity: same token ids as the `none` run with the same prompt, temperature and seed."""
    base = {(r["prompt_index"], r["temperature"], r["repeat"]): r for r in runs
            if r["method"] == PLAIN and "token_ids" in r}
    for r in runs:
        b = base.get((r["prompt_index"], r["temperature"], r["repeat"]))
        if "token_ids" not in r or b is None:
            r["parity"] = None
            continue
        r["parity"] = r["token_ids"] == b["token_ids"]
        if not r["parity"] and r["temperature"] == 0 and not r["method"].startswith("llamacpp"):
            # a near-tie in the target's logits (bf16 rounding) rather than a bug
            r["divergence_margin"] = divergence_margin(llm, prompt_ids[r["prompt_index"]], b["token_ids"],
                                                       r["token_ids"])


def divergence_margin(llm, prompt_ids: list[int], base_ids: list[int], other_ids: list[int]) -> float | None:
    """Target's top-2 logit margin at the first token where two outputs differ (None if identical).

    A margin at the level of bf16 rounding says the divergence is a near-tie, not a bug.
    """
    from ..models.runner import forward_once

    i = next((j for j, (a, b) in enumerate(zip(base_ids, other_ids)) if a != b), None)
    if i is None:
        return None
    top2 = forward_once(llm.target.model, prompt_ids + base_ids[:i])[-1].topk(2).values
    return float(top2[0] - top2[1])


def write_outputs(result: dict, out: Path) -> None:
    from .plots import write_plots
    from .report import render_report

    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(result, out)
    write_text_atomic(out / "report.md", render_report(result, plots))
    write_json_atomic(out / "results.json", result)

