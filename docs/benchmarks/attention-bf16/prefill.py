"""The attention of a 2k-token prompt read in four chunks of 512 (how the engine prefills it: bf16 and int4 prompt
rows take the row-by-row kernel, so a token's K/V does not depend on the chunking), on the fp32 walk and on the
AVX-512 BF16 one, interleaved in one process: 28 layers of Qwen2.5-1.5B's attention, ms, best of 2, two rounds.

    python docs/benchmarks/attention-bf16/prefill.py
"""
from specdec.bench.attention import attention_ms

for rnd in range(2):
    res = {impl: attention_ms([0, 512, 1024, 1536], [512], 2, impl=impl) for impl in ("avx512", "avx512bf16")}
    for impl, m in res.items():
        chunks = ", ".join(f"{k[0]}: {v:.0f}" for k, v in m.items())
        print(f"round {rnd + 1} {impl}: chunk after <context>: ms {{{chunks}}}; the prompt {sum(m.values()):.0f} ms")
