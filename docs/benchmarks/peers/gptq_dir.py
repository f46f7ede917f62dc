"""vLLM's int4 format for CPU, made from the bf16 HF directory without calibration data: the decoder layers' linears
rounded to 4-bit symmetric groups of 128 (round to nearest, what GPTQ's packing stores when no Hessian correction is
applied) and written in the GPTQ checkpoint layout, which vLLM's CPU backend runs with its W4A16 kernel
(CPUWNA16, `int4_scaled_mm_cpu`). Embedding, norms, biases and the output head stay bf16, as GPTQ checkpoints keep
them. Runs in vLLM's venv (torch, safetensors).

    PEER_ENV/bin/python docs/benchmarks/peers/gptq_dir.py HF_DIR OUT_DIR
"""
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

BITS, GROUP = 4, 128
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def pack_rows(q: torch.Tensor) -> torch.Tensor:
    """[n, m] values 0..15 -> int32 [n // 8, m]: eight consecutive rows per word, the first in the low bits."""
    q = q.to(torch.int64).view(q.shape[0] // 8, 8, q.shape[1])
    word = torch.zeros(q.shape[0], q.shape[2], dtype=torch.int64)
    for i in range(8):
        word |= q[:, i, :] << (BITS * i)
    return word.to(torch.uint32).view(torch.int32) if hasattr(torch, "uint32") else word.to(torch.int32)


def quantize(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """A Linear weight [out, in] as GPTQ's qweight, qzeros, scales and g_idx (symmetric: zero point 8)."""
    wt = w.float().t().contiguous()                                   # [in, out], GPTQ's orientation
    n_in, n_out = wt.shape
    groups = wt.view(n_in // GROUP, GROUP, n_out)
    scale = (groups.abs().amax(dim=1) * 2 / 15).clamp(min=1e-8)      # [groups, out]
    q = torch.clamp(torch.round(groups / scale[:, None, :]) + 8, 0, 15).view(n_in, n_out)
    zeros = torch.full((n_in // GROUP, n_out), 7, dtype=torch.int64)  # the v1 layout stores zero - 1
    return {"qweight": pack_rows(q), "qzeros": pack_rows(zeros.t().contiguous()).t().contiguous(),
            "scales": scale.to(torch.float16), "g_idx": torch.arange(n_in, dtype=torch.int32) // GROUP}


def write_checkpoint(src: Path, out: Path, quantize, quantization_config: dict) -> None:
    """OUT: SRC's directory with every decoder linear's weight replaced by what `quantize` makes of it (a dict of
    tensors named beside the module), config.json given `quantization_config`; the rest copied (also int8_dir.py's)."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(src / "model.safetensors"))
    result = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and module.rsplit(".", 1)[-1] in LINEARS:
            for key, value in quantize(t).items():
                result[f"{module}.{key}"] = value
        else:
            result[name] = t
    save_file(result, str(out / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, out / f.name)


def main(src: Path, out: Path) -> None:
    write_checkpoint(src, out, quantize, {"quant_method": "gptq", "bits": BITS, "group_size": GROUP, "desc_act": False,
                                          "sym": True, "checkpoint_format": "gptq"})


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
