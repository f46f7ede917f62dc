"""vLLM's int8 format for CPU, made from the bf16 HF directory without calibration data: the decoder layers' linears
rounded to nearest in symmetric int8 with one scale per output channel, activations quantized per token at run time
(W8A8, "dynamic token"), written as a compressed-tensors checkpoint (`format: int-quantized`), which vLLM's CPU
backend runs through its int8 scaled matmul (oneDNN). No SmoothQuant step: the activations' outliers cost accuracy,
not speed, and this is a speed comparison. Embedding, norms, biases and the output head stay bf16. Runs in vLLM's
venv (torch, safetensors).

    PEER_ENV/bin/python docs/benchmarks/peers/int8_dir.py HF_DIR OUT_DIR
"""
import sys
from pathlib import Path

import torch
from gptq_dir import write_checkpoint  # this folder: run as a script, its directory is on sys.path


def quantize(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """A Linear weight [out, in] as int8 codes and a float scale per output channel ([out, 1])."""
    wf = w.float()
    scale = (wf.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-8)
    q = torch.clamp(torch.round(wf / scale), -127, 127).to(torch.int8)
    return {"weight": q, "weight_scale": scale.to(w.dtype)}


def scheme() -> dict:
    int8 = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None, "block_structure": None,
            "actorder": None, "observer": None, "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "kv_cache_scheme": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "output_activations": None,
                                          "weights": {**int8, "strategy": "channel", "dynamic": False},
                                          "input_activations": {**int8, "strategy": "token", "dynamic": True}}}}


def main(src: Path, out: Path) -> None:
    write_checkpoint(src, out, quantize, scheme())


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
