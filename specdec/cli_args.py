"""`specdec`'s command line: every subcommand's flags (the commands themselves are in cli.py). Bad input here is one
line on stderr and exit 2 (Parser)."""
from __future__ import annotations

import argparse

from .config import AUTO, DRAFT_MLP_BITS, PLAIN, QUANTIZATIONS
from .engine.scheduler import ITL_TARGET_S
from .proposers.registry import METHOD_TABLE, head_methods, method_names


def add_model_args(p: argparse.ArgumentParser) -> None:
    from .models.registry import DEFAULT_TARGET

    p.add_argument("--target", default=DEFAULT_TARGET, help="built-in name, .gguf file or HF directory")
    p.add_argument("--draft", default=None, help="draft model for --method draft (default: the 0.5B of the pair)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--max-model-len", type=int, default=None, help="context window (default: the model's)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--quantization", default=None, choices=list(QUANTIZATIONS),
                   help="target weights: none (runtime dtype), int8, or int4 (a GGUF's 4/5/6/8-bit blocks kept as "
                        "they are; our CPU kernel). Default: int4 for a block-quantized GGUF on a CPU where the "
                        "compiled kernels run 4-bit codes vectorized (AVX-512 VNNI or AVX2), else none")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="keep finished requests' K/V (target and draft) and start a prompt that shares a prefix with "
                        "one after it: a conversation's next turn, a shared system prompt (default on; "
                        "--no-enable-prefix-caching: off, vLLM's flag)")
    p.add_argument("--head-quantization", default=None, choices=list(QUANTIZATIONS),
                   help="learned heads' linears (eagle3, eagle, medusa): runtime dtype, or 8-/4-bit blocks on our CPU "
                        "kernel. Default: int4 for a bf16 head on CPU where the compiled kernels run 4-bit codes "
                        "vectorized (AVX-512 VNNI or AVX2), else int8 where they run 8-bit codes so, else none")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default=PLAIN, choices=list(method_names()),
                   help=f"speculative method ({AUTO}: the policy picks method and k from a measured cost model)")
    p.add_argument("--k", "--num-speculative-tokens", dest="k", type=int, default=None,
                   help="draft tokens per step (default: the method's: "
                        + ", ".join(f"{m.name} {m.default_k}" for m in METHOD_TABLE.values() if m.default_k)
                        + "); a token tree's nodes")
    p.add_argument("--eagle-topk", type=int, default=1,
                   help="eagle3/medusa: draft a token tree, this many guesses per node (greedy requests; 1: a chain)")
    p.add_argument("--num-steps", type=int, default=None, help="eagle3/medusa token tree: its depth")
    add_proposer_args(p)


def add_proposer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt-lookup-max", type=int, default=4)
    p.add_argument("--prompt-lookup-min", type=int, default=1)
    p.add_argument("--draft-quantization", default=None, choices=list(QUANTIZATIONS),
                   help="draft model weights: runtime dtype, weight-only int8 or int4 (CPU; 4-bit throughout: "
                        "a GGUF's 6/8-bit blocks are re-quantized, since a draft only needs to be fast). Default: "
                        "int4 for a bf16 model on CPU when the compiled kernels are installed, else none")
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="the draft model's output head keeps the N tokens its target emits most (a ranking ships "
                        "for the default target; FR-Spec). Default: 32768 where a ranking ships; 0: the whole head")
    p.add_argument("--draft-mlp-bits", type=int, default=None, choices=list(DRAFT_MLP_BITS),
                   help="the int4 draft model's MLP linears at 3 or 4 bits (re-quantized: fewer bytes a draft step, "
                        "some acceptance; docs/benchmarks/draft-bits). Default: 4")
    p.add_argument("--draft-p-min", type=float, default=None, metavar="P",
                   help="the draft model's chain stops after a token it gives less than P (llama.cpp's flag; "
                        "docs/benchmarks/draft-confidence). Default: 0.75; 0: chains of k")


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + error
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specdec", description="Speculative decoding, measured honestly.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    g = sub.add_parser("generate", help="generate text for one prompt, streaming it to stdout")
    g.add_argument("prompt", help="the prompt ('-' reads it from stdin); a user message unless --no-chat")
    add_model_args(g)
    add_spec_args(g)
    g.add_argument("--no-chat", action="store_true", help="raw text prompt, no chat template")
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--stats-json", default=None, help="write this request's stats as JSON here")
    g.add_argument("--compare", action="store_true",
                   help="also run the request with --method none; add baseline, parity and speedup to the stats")
    g.add_argument("--quiet", action="store_true", help="do not print the generated text")

    sub.add_parser("models", help="list built-in models and what is installed / assembled")

    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server with speculative decoding")
    add_model_args(sv)
    sv.add_argument("--speculative-config", default=None,
                    help='vLLM-style JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 5}\' '
                         '(default: {"method": "auto"}: the policy picks none/ngram/draft and k per request)')
    sv.add_argument("--spec-heads", default=None,
                    help="learned heads loaded beside the default method, METHOD[=DIR] comma-separated (e.g. "
                         "'eagle3,medusa=DIR'; a method alone: its shipped head): requests may name them, and auto "
                         "weighs them. Default: the heads shipped for the target when the method is auto; "
                         "'none' loads none")
    sv.add_argument("--suffix-cache", default=None,
                    help="suffix decoding: keep each spec_pool's past outputs in this file (read at start when it "
                         "exists, written atomically every 16 finished requests and at shutdown)")
    sv.add_argument("--spec-traffic-fraction", type=float, default=1.0,
                    help="share of requests (stable by request id) that may speculate; the rest decode plainly")
    sv.add_argument("--spec-max-load", type=int, default=4,
                    help="auto: running + waiting requests above this decode plainly")
    sv.add_argument("--spec-min-acceptance", type=float, default=0.4,
                    help="auto: a pool whose windowed acceptance falls below this falls back to plain decoding")
    sv.add_argument("--max-num-seqs", type=int, default=8,
                    help="sequences decoded together in one forward (continuous batching)")
    sv.add_argument("--max-num-batched-tokens", type=int, default=512,
                    help="prompt-chunk + decode rows per engine step (long prompts are prefilled in chunks)")
    sv.add_argument("--max-total-tokens", type=int, default=None,
                    help="KV positions of all sequences together (default 65536; allocated as sequences grow)")
    sv.add_argument("--itl-target-ms", type=float, default=ITL_TARGET_S * 1000,
                    help="while requests decode, a step's prompt chunk is sized (from the measured prefill speed) so "
                         "the step takes about this long: a long prompt cannot stall the running streams; 0: chunks "
                         "of --max-num-batched-tokens")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--max-queued", type=int, default=64, help="requests waiting beyond this get 429")
    sv.add_argument("--served-model-name", default=None, help="model id clients use (default: the target's name)")
    sv.add_argument("--api-key", action="append", default=None,
                    help="require 'Authorization: Bearer KEY' on /v1/*; repeat for several keys, each its own tenant "
                         "(its own prefix cache and suffix pools)")
    sv.add_argument("--api-key-file", default=None,
                    help="more keys, a line each: 'KEY [TENANT]' (keys naming one tenant share its caches)")
    sv.add_argument("--drain-timeout", type=float, default=30.0,
                    help="seconds SIGTERM waits for in-flight requests; the rest end with an error")
    sv.add_argument("--max-request-bytes", type=int, default=2 * 1024 * 1024,
                    help="larger request bodies get 413 (default 2 MiB: ~7x a full 32k-token prompt)")
    sv.add_argument("--max-spec-pools", type=int, default=32,
                    help="distinct spec_pool tags kept; later new tags share the pool 'other'")
    sv.add_argument("--export-vllm-metrics", action="store_true",
                    help="/metrics also carries every specdec: family under vLLM's vllm: name with its engine label, "
                         "so dashboards and alerts written for vLLM work unchanged")
    sv.add_argument("--no-dashboard", action="store_true",
                    help="no live page (GET /dashboard) and no /v1/dashboard/data")
    sv.add_argument("--log-interval", type=float, default=10.0, help="seconds between speculative-decoding log lines")
    ray = sv.add_argument_group("scale-out on Ray Serve (pip install 'specdec[ray]')")
    ray.add_argument("--replicas", type=int, default=None,
                     help="run N engine replicas behind one endpoint on Ray Serve (each loads the models; "
                          "--threads per replica defaults to cores / N)")
    ray.add_argument("--ray-address", default=None,
                     help="join this Ray cluster (e.g. auto, or HEAD_IP:6379 after `ray start --head`) instead of "
                          "starting a local one")
    ray.add_argument("--autoscaling-config", default=None,
                     help='Ray Serve autoscaling JSON for the engine replicas, e.g. \'{"min_replicas": 1, '
                          '"max_replicas": 4, "target_ongoing_requests": 4}\'')

    from .models.registry import DEFAULT_TARGET

    th = sub.add_parser("train-head", help="train an EAGLE-3 or Medusa draft head for a target on this machine")
    trainable = [m for m in method_names() if METHOD_TABLE[m].trainable]
    th.add_argument("--method", required=True, choices=[*trainable, ",".join(trainable)],
                    help=f"{','.join(trainable)}: every trainable head from one pass over the target (saved to "
                         "OUT/METHOD each)")
    th.add_argument("--target", default=DEFAULT_TARGET, help="built-in name, .gguf file or HF directory")
    th.add_argument("--data", required=True,
                    help="comma list: sharegpt:N, sharegpt-code[A:B], humaneval[A:B], stdlib-functions[A:B], "
                         "functions:PACKAGE[A:B] (an installed package's documented functions, e.g. "
                         "functions:algorithms), a .jsonl file (messages | text | prompt+completion), or a source "
                         "file or folder")
    th.add_argument("--out", required=True, help="the head's directory (written atomically)")
    th.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    th.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    th.add_argument("--threads", type=int, default=None)
    th.add_argument("--quantization", default="none", choices=list(QUANTIZATIONS),
                    help="the target's weights while extracting features (use what the head will serve with)")
    for flag, typ, default, text in [
            ("--seq-len", int, 512, "tokens per training window"),
            ("--doc-len", int, 2048, "tokens of context per document for the target's features"),
            ("--max-tokens", int, None, "cap on training tokens, spread over the sources"),
            ("--epochs", float, 1.0, "passes over the windows"), ("--batch-seqs", int, 4, "windows per step"),
            ("--lr", float, 5e-4, "peak learning rate (AdamW; warm-up, then cosine to 10%%)"),
            ("--warmup-steps", int, 20, ""), ("--draft-vocab", int, 8192, "draft / truncated vocabulary size"),
            ("--intermediate-size", int, None, "EAGLE-3 MLP width (default: the target's)"),
            ("--ttt-steps", int, 3, "EAGLE-3 training-time-test steps"), ("--num-heads", int, 3, "Medusa heads"),
            ("--topk", int, 16, "target probabilities kept per token"),
            ("--checkpoint-every", int, 50, "steps between checkpoints"), ("--seed", int, 0, ""),
            ("--regenerate", int, 0, "answer chat sources' first turns with the target (greedy, up to N tokens) "
                                     "and train on those answers")]:
        th.add_argument(flag, type=typ, default=default, help=text or None)
    th.add_argument("--resume", action="store_true", help="continue from OUT.checkpoint.pt")
    th.add_argument("--init", default=None,
                    help="start from a trained head directory (its weights and draft vocabulary): train it further "
                         "on more data; with --method eagle3,medusa, INIT/eagle3 and INIT/medusa")
    th.add_argument("--refresh-vocab", type=int, default=0, metavar="N",
                    help="with --init: swap up to N of the head's draft tokens that are rarest in this data for the "
                         "most frequent ones it lacks")
    th.add_argument("--int8", action="store_true", help="store 2-D weights as int8 + per-row scale")
    th.add_argument("--no-progress", action="store_true")

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench_command", required=True, parser_class=Parser)
    bo = bsub.add_parser("offline", help="A/B evaluation on real prompts: results.json, report.md, plots")
    add_model_args(bo)
    bo.add_argument("--prompts", default="builtin",
                    help="builtin | structured | humaneval[:N] | humaneval-twice[:N] (N problems, then the same N "
                         "in other words, one pool) | sharegpt[:N] | a JSONL file of {messages, category[, pool]}; "
                         "several joined with commas")
    bo.add_argument("--categories", default=None, help="comma-separated categories to keep (default: all)")
    bo.add_argument("--methods", default="none,ngram,draft",
                    help=f"comma-separated: {','.join(method_names())}; METHOD-tree for a method that drafts "
                         "token trees runs it drafting trees (greedy requests; sampled ones verify a chain)")
    bo.add_argument("--k", default="4", help="comma-separated k values for the speculative methods")
    bo.add_argument("--temperature", default="0", help="comma-separated temperatures")
    bo.add_argument("--max-tokens", type=int, default=128)
    bo.add_argument("--repeats", type=int, default=1)
    bo.add_argument("--seed", type=int, default=0)
    bo.add_argument("--peers", default="", help="comma-separated peers measured in the same run: hf,llamacpp")
    bo.add_argument("--out", default="out/bench-offline", help="output directory")
    bo.add_argument("--no-progress", action="store_true")
    for m in head_methods():
        bo.add_argument(f"--{m}-head", default=None,
                        help=f"method {m}'s head directory (default: the one shipped for the target, if any)")
    bo.add_argument("--eagle-topk", type=int, default=4, help="tree methods: guesses expanded per node")
    bo.add_argument("--num-steps", type=int, default=None, help="tree methods: tree depth (default: min(k, 4))")
    bo.add_argument("--tree-tokens", default=None,
                    help="tree methods: comma-separated node counts verified per step (their k; default: --k)")
    add_proposer_args(bo)

    bq = bsub.add_parser("quality", help="quantization quality vs the runtime-dtype model: perplexity, KL divergence, "
                                         "top-1 agreement")
    bq.add_argument("--target", default=DEFAULT_TARGET, help="built-in name, .gguf file or HF directory")
    bq.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    bq.add_argument("--schemes", default="int8,int4", help="comma-separated quantization schemes compared with none")
    bq.add_argument("--text", default="sharegpt", help="sharegpt (seeded whole conversations) or a UTF-8 text file")
    bq.add_argument("--tokens", type=int, default=2048, help="tokens of the text scored")
    bq.add_argument("--window", type=int, default=512, help="tokens per window, each scored from an empty cache")
    bq.add_argument("--seed", type=int, default=0)
    bq.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    bq.add_argument("--out", default="out/bench-quality", help="output directory")

    bs = bsub.add_parser("serve", help="serving benchmark against OpenAI-compatible endpoints")
    bs.add_argument("--endpoint", action="append", default=[], help="base URL, e.g. http://127.0.0.1:8000 (repeatable)")
    bs.add_argument("--label", action="append", default=[], help="a name per --endpoint (default: its URL)")
    bs.add_argument("--extra-body", action="append", default=[],
                    help='JSON merged into every request: once for all endpoints or once per --endpoint, e.g. '
                         '\'{"speculative": {"method": "none"}}\'')
    bs.add_argument("--model", default=None, help="model id (default: the first of each endpoint's /v1/models)")
    bs.add_argument("--dataset", default="builtin",
                    help="builtin | long[:N] (retrieval over ~2k-token documents, whole-module edits) | edits[:N] "
                         "(stdlib functions to edit, each with its predicted output: --prediction) | structured "
                         "(20 JSON-schema requests) | humaneval[:N] | shared-prefix[:N] (N requests behind one "
                         "~1k-token system prompt) | sharegpt[:N] | a JSONL file; several joined with commas")
    bs.add_argument("--concurrency", default=None,
                    help="comma-separated concurrency levels (default 1); with --duration, the clients (default 16)")
    bs.add_argument("--max-tokens", type=int, default=128)
    bs.add_argument("--temperature", type=float, default=0.0)
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--api-key", default=None)
    bs.add_argument("--out", default="out/bench-serve", help="output directory")
    bs.add_argument("--no-interleave", dest="interleave", action="store_false",
                    help="run each endpoint through the whole set in turn (default: prompt i, or round i of "
                         "`concurrency` prompts, goes to every endpoint before the next)")
    bs.add_argument("--prediction", action="append", default=[], metavar="LABEL",
                    help="send each prompt's predicted output (OpenAI's `prediction`; dataset edits, or a JSONL "
                         "`prediction`) to the endpoint with this --label (repeatable); the others get the same "
                         "requests without it")
    bs.add_argument("--no-wait-idle", dest="wait_idle", action="store_false",
                    help="send each round at once; by default it waits (up to 30 s) until at most 10%% of the CPUs "
                         "are busy, so a server still busy with its last answer does not slow the next request")
    bs.add_argument("--rounds", type=int, default=1,
                    help="cut the prompts into N consecutive rounds (each interleaved over the endpoints) and report "
                         "each round's median decode tok/s and ratio, and the median ratio over rounds with its "
                         "spread (disjoint slices: a prompt sent twice would meet what a server learned from it)")
    bs.add_argument("--turns", type=int, default=0,
                    help="multi-turn conversations of N turns, each resending the history (--dataset builtin: a "
                         "module's source then questions about it; sharegpt[:N]: ShareGPT conversations); reports "
                         "TTFT per turn. Interleaved by turn unless --no-interleave (turns back to back)")
    bs.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                    help="sustained load instead (bench/load.py): --concurrency clients (default 16) send a mix of "
                         "requests (streams, long prompts, structured outputs, sampled, client aborts; a method each) "
                         "to the first --endpoint for SECONDS, then greedy answers are replayed alone and compared")
    bs.add_argument("--replay", type=int, default=24, help="--duration: greedy requests replayed alone afterwards")
    bs.add_argument("--think-time", type=float, default=0.0,
                    help="--turns: seconds to pause after each answer before the next request (a user reading)")
    return parser
