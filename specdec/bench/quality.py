"""`specdec bench quality`: what a quantization scheme costs in quality, against the runtime-dtype model.

On a fixed text (whole ShareGPT conversations drawn with a seed, or a text file) cut into windows scored from
scratch, each scheme's next-token distributions are compared with the reference (`none`: the weights in the
runtime dtype; for a GGUF, its blocks dequantized exactly). The figures are those of llama.cpp's
`llama-perplexity --kl-divergence`: perplexity and its ratio to the reference, mean and P99 KL divergence
KL(reference || scheme), and how often the top-1 token agrees. One model is in memory at a time (plus the
reference's log-probabilities).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..errors import SpecDecError
from ..models.registry import DEFAULT_TARGET
from ..utils import write_json_atomic, write_text_atomic


@dataclass
class QualityConfig:
    target: str = DEFAULT_TARGET
    schemes: list[str] = field(default_factory=lambda: ["int8", "int4"])
    dtype: str = "bfloat16"
    text: str = "sharegpt"          # "sharegpt" (seeded whole conversations) or a path to a UTF-8 text file
    num_tokens: int = 2048
    window: int = 512               # tokens per window; each is scored from an empty cache
    seed: int = 0
    threads: int | None = None
    out: str = "out/bench-quality"

    def __post_init__(self):
        from ..models.quantization import resolve_scheme

        self.schemes = [resolve_scheme(s) for s in self.schemes]
        if not self.schemes:
            raise SpecDecError("--schemes needs at least one scheme")
        if self.window < 2 or self.num_tokens < self.window:
            raise SpecDecError(f"need --tokens >= --window >= 2, got {self.num_tokens} and {self.window}")


def load_text(cfg: QualityConfig) -> str:
    if cfg.text == "sharegpt":
        from .datasets import sharegpt_text

        return sharegpt_text(num_chars=cfg.num_tokens * 6, seed=cfg.seed)
    path = Path(cfg.text)
    if not path.is_file():
        raise SpecDecError(f"--text: no such file '{path}' (or use 'sharegpt')")
    return path.read_text(encoding="utf-8")


def windows_of(ids: list[int], num_tokens: int, window: int) -> list[list[int]]:
    if len(ids) < num_tokens:
        raise SpecDecError(f"the text has {len(ids)} tokens, fewer than --tokens {num_tokens}")
    ids = ids[:num_tokens - num_tokens % window]
    return [ids[i: i + window] for i in range(0, len(ids), window)]


@torch.inference_mode()
def window_logprobs(model, windows: list[list[int]]) -> list[torch.Tensor]:
    """Per window: log-softmax of the next-token logits at every position but the last  # [T-1, V] fp32."""
    from ..models.runner import forward_once

    return [torch.log_softmax(forward_once(model, w)[:-1].float(), dim=-1) for w in windows]


def compare(ref: list[torch.Tensor], other: list[torch.Tensor], windows: list[list[int]]) -> dict:
    """Perplexity, KL(ref || other) and top-1 agreement over every scored position."""
    nll, kld, same = [], [], []
    for lp_ref, lp, w in zip(ref, other, windows):
        targets = torch.tensor(w[1:])
        nll.append(-lp.gather(1, targets[:, None])[:, 0])
        kld.append((lp_ref.exp() * (lp_ref - lp)).sum(-1))
        same.append(lp_ref.argmax(-1) == lp.argmax(-1))
    nll, kld, same = torch.cat(nll).double(), torch.cat(kld).double(), torch.cat(same)
    return {"positions": int(nll.numel()), "ppl": math.exp(float(nll.mean())), "mean_kld": float(kld.mean()),
            "p99_kld": float(torch.quantile(kld, 0.99)), "max_kld": float(kld.max()),
            "same_top1": float(same.float().mean())}


def run_quality(cfg: QualityConfig) -> dict:
    import gc

    from ..models.loader import load_model
    from .offline import machine_info

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    schemes = ["none"] + [s for s in cfg.schemes if s != "none"]
    ref_lp, windows, rows = None, None, []
    for scheme in schemes:
        t0 = time.perf_counter()
        loaded = load_model(cfg.target, cfg.dtype, "cpu", progress=False, quantization=scheme)
        if windows is None:
            windows = windows_of(loaded.tokenizer.encode(load_text(cfg)), cfg.num_tokens, cfg.window)
        lp = window_logprobs(loaded.model, windows)
        if ref_lp is None:
            ref_lp = lp
        row = {"scheme": scheme, "weight_gb": loaded.weight_bytes / 1e9, **compare(ref_lp, lp, windows),
               "seconds": time.perf_counter() - t0}
        rows.append(row)
        del loaded, lp
        gc.collect()
    base = rows[0]["ppl"]
    for r in rows:
        r["ppl_ratio"] = r["ppl"] / base
    result = {"config": asdict(cfg), "machine": machine_info(torch.get_num_threads()), "rows": rows}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "results.json", result)
    write_text_atomic(out / "report.md", render_quality(result))
    return result


def render_quality(result: dict) -> str:
    c = result["config"]
    lines = [
        "# Quantization quality against the runtime-dtype model", "",
        f"- target `{c['target']}`, dtype {c['dtype']}, text `{c['text']}` (seed {c['seed']}), "
        f"{result['rows'][0]['positions']} scored positions in windows of {c['window']} tokens, "
        "each from an empty cache",
        f"- machine: {result['machine'].get('cpu', '?')}, torch {result['machine'].get('torch', '?')}",
        "- KLD: KL(reference || scheme) per position, in nats; same top-1: the argmax token agrees with the "
        "reference's",
        "",
        "| scheme | weights GB | perplexity | ppl ratio | mean KLD | P99 KLD | max KLD | same top-1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        name = "none (reference)" if r["scheme"] == "none" else r["scheme"]
        lines.append(f"| {name} | {r['weight_gb']:.2f} | {r['ppl']:.4f} | {r['ppl_ratio']:.4f} | {r['mean_kld']:.5f} | "
                     f"{r['p99_kld']:.4f} | {r['max_kld']:.4f} | {r['same_top1'] * 100:.2f}% |")
    return "\n".join(lines) + "\n"
