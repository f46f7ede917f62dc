"""The attention of verification rows on the two AVX-512 walks, interleaved in one process: the fp32 walk
(`impl="avx512"`) and the AVX-512 BF16 one (`impl="avx512bf16"`, what auto runs for bf16 caches on such a CPU).
28 layers of Qwen2.5-1.5B's attention (12 query / 2 KV heads of 128, bf16 caches), ms, best of REPS, ROUNDS rounds.

    python docs/benchmarks/attention-bf16/ab.py [ROUNDS] [REPS]
"""
import sys

from specdec.bench.attention import attention_ms

CONTEXTS, ROWS = [256, 1024, 2048], [1, 2, 3, 5, 8]


def main(rounds: int, reps: int) -> None:
    print("| round | walk | " + " | ".join(f"{c} ctx, {r} rows" for c in CONTEXTS for r in ROWS) + " |")
    print("|---|---|" + "---|" * (len(CONTEXTS) * len(ROWS)))
    for i in range(rounds):
        ms = {impl: attention_ms(CONTEXTS, ROWS, reps, impl=impl) for impl in ("avx512", "avx512bf16")}
        for impl, m in ms.items():
            print(f"| {i + 1} | {impl} | " + " | ".join(f"{m[c, r]:.2f}" for c in CONTEXTS for r in ROWS) + " |")
        print(f"| {i + 1} | ratio | " + " | ".join(f"{ms['avx512bf16'][c, r] / ms['avx512'][c, r]:.2f}"
                                                   for c in CONTEXTS for r in ROWS) + " |", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2, int(sys.argv[2]) if len(sys.argv) > 2 else 30)
