"""An HF directory (bf16 safetensors + tokenizer) made from one of specdec's built-in GGUF models, for the peers that
read HF directories (vLLM, optimum-intel's OpenVINO export): transformers dequantises the GGUF blocks
(GgufConfig(dequantize=True); without it the blocks stay packed and save_pretrained refuses).

    .venv/bin/python docs/benchmarks/peers/hf_dir.py OUT_DIR [--model target|draft]
"""
import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from specdec.models.registry import BUILTIN_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET, assemble

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--model", choices=("target", "draft"), default="target")
args = ap.parse_args()
gguf = Path(assemble(BUILTIN_MODELS[DEFAULT_TARGET if args.model == "target" else DEFAULT_DRAFT]))
tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16,
                                             quantization_config=GgufConfig(dequantize=True))
model.save_pretrained(args.out)
tok.save_pretrained(args.out)
