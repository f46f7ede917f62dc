"""`specdec generate | models`: the command line. Bad input -> one line on stderr, non-zero exit."""
from __future__ import annotations

import sys

from .cli_args import build_parser
from .config import PLAIN
from .errors import SpecDecError
from .proposers.registry import head_methods
from .utils import write_json_atomic


def cmd_models(args) -> int:
    from .models.registry import BUILTIN_MODELS, assembled_path, is_assembled, part_paths

    for m in BUILTIN_MODELS.values():
        parts = part_paths(m)
        installed = sum(p is not None for p in parts)
        state = "assembled" if is_assembled(m) else ("installed" if installed == m.num_parts else "not installed")
        print(f"{m.name:32s} {state:14s} parts {installed}/{m.num_parts}  {m.description}")
        if is_assembled(m):
            print(f"{'':32s} {assembled_path(m)}")
    from .models.families import FAMILIES, REFUSED

    print("\nany local GGUF file or HF directory of these families (--target / --draft PATH):")
    for f in FAMILIES:
        print(f"  {f.name:18s} model_type {', '.join(f.model_types)}; GGUF {', '.join(f.gguf_archs)}")
        print(f"  {'':18s} RoPE: {f.rope}")
        print(f"  {'':18s} {f.notes}")
    print(f"refused at load: {REFUSED}")
    return 0


def cmd_generate(args) -> int:
    from . import LLM, EngineArgs, SamplingParams

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise SpecDecError("the prompt is empty")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, min_p=args.min_p, seed=args.seed, stop=args.stop)
    llm = LLM(EngineArgs.from_cli_args(args))
    out = sys.stdout
    final, token_ids = None, []
    for delta in llm.stream(prompt, params, chat=not args.no_chat):
        token_ids += delta.token_ids
        if not args.quiet and delta.text:
            out.write(delta.text)
            out.flush()
        final = delta
    if not args.quiet:
        out.write("\n")
        out.flush()
    stats = final.stats
    record = {"target": llm.target.name, "draft": llm.draft.name if llm.draft else None, **stats.to_dict()}
    if args.compare:
        base = llm.generate(prompt, params, chat=not args.no_chat, spec=PLAIN)[0]
        record["baseline"] = base.stats.to_dict()
        record["parity"] = token_ids == base.token_ids
        record["speedup"] = (stats.decode_tok_s / base.stats.decode_tok_s) if base.stats.decode_tok_s else None
    print(_summary(stats), file=sys.stderr)
    if args.compare:
        print(f"baseline decode {record['baseline']['decode_tok_s']:.2f} tok/s; speedup {record['speedup']:.2f}x; "
              f"parity {record['parity']}", file=sys.stderr)
    if args.stats_json:
        write_json_atomic(args.stats_json, record)
    return 0


def _csv(value: str, kind, flag: str) -> list:
    try:
        return [kind(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise SpecDecError(f"{flag} takes comma-separated {kind.__name__} values, got '{value}'") from None


def cmd_bench_offline(args) -> int:
    from .bench.offline import OfflineBenchConfig, run_offline
    from .bench.report import recommend
    from .engine_args import p_min_of

    cfg = OfflineBenchConfig(
        prompts=args.prompts, categories=_csv(args.categories, str, "--categories") if args.categories else None,
        methods=_csv(args.methods, str, "--methods"), ks=_csv(args.k, int, "--k"),
        temperatures=_csv(args.temperature, float, "--temperature"), max_tokens=args.max_tokens,
        repeats=args.repeats, seed=args.seed, out=args.out, peers=_csv(args.peers, str, "--peers"),
        target=args.target, draft=args.draft, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
        threads=args.threads, prompt_lookup_max=args.prompt_lookup_max, prompt_lookup_min=args.prompt_lookup_min,
        draft_quantization=args.draft_quantization, draft_vocab_size=args.draft_vocab_size,
        draft_mlp_bits=args.draft_mlp_bits, **p_min_of(args),
        quantization=args.quantization, head_quantization=args.head_quantization, progress=not args.no_progress,
        heads={m: getattr(args, f"{m}_head") for m in head_methods() if getattr(args, f"{m}_head")},
        eagle_topk=args.eagle_topk, num_steps=args.num_steps,
        tree_tokens=_csv(args.tree_tokens, int, "--tree-tokens") if args.tree_tokens else [])
    result = run_offline(cfg)
    for d in recommend(result["summary"]):
        verdict = f"enable {d['method']} k={d['k']} ({d['expected_speedup']:.2f}x)" if d["enable"] else "off"
        print(f"T={d['temperature']:g} {d['category']:12s} {verdict}: {d['why']}")
    print(f"wrote {args.out}/results.json, report.md and plots")
    return 0


def cmd_bench_serve(args) -> int:
    from .bench.serve import ServeBenchConfig, render_serve_report, run_serve_bench
    from .utils import parse_json_object

    if args.duration is not None:
        return _bench_load(args)
    extra = [parse_json_object(text, "--extra-body") for text in args.extra_body]
    cfg = ServeBenchConfig(endpoints=args.endpoint, dataset=args.dataset, model=args.model,
                           concurrency=_csv(args.concurrency or "1", int, "--concurrency"), max_tokens=args.max_tokens,
                           temperature=args.temperature, seed=args.seed, out=args.out, labels=args.label,
                           extra_body=extra, api_key=args.api_key, interleave=args.interleave, turns=args.turns,
                           think_time_s=args.think_time, prediction=args.prediction, wait_idle=args.wait_idle,
                           rounds=args.rounds)
    result = run_serve_bench(cfg)
    if cfg.turns:
        from .bench.conversations import render_conversation_report

        print(render_conversation_report(result))
        print(f"wrote {args.out}/results.json and report.md")
        return 0
    print(render_serve_report(result, []))
    print(f"wrote {args.out}/results.json, report.md and plots")
    return 0


def _bench_load(args) -> int:
    from .bench.load import LoadConfig, render_load_report, run_load_bench

    if len(args.endpoint) != 1:
        raise SpecDecError("--duration runs against one --endpoint")
    clients = _csv(args.concurrency, int, "--concurrency")[0] if args.concurrency else 16
    cfg = LoadConfig(args.endpoint[0], args.duration, clients=clients,
                     model=args.model, api_key=args.api_key, max_tokens=args.max_tokens, seed=args.seed,
                     replay=args.replay)
    result = run_load_bench(cfg, args.out)
    print(render_load_report(result["summary"], result["samples"]))
    print(f"wrote {args.out}/results.json and report.md")
    return 0


def cmd_bench_quality(args) -> int:
    from .bench.quality import QualityConfig, render_quality, run_quality

    cfg = QualityConfig(target=args.target, schemes=_csv(args.schemes, str, "--schemes"), dtype=args.dtype,
                        text=args.text, num_tokens=args.tokens, window=args.window, seed=args.seed,
                        threads=args.threads, out=args.out)
    print(render_quality(run_quality(cfg)))
    print(f"wrote {args.out}/results.json and report.md")
    return 0


def cmd_train_head(args) -> int:
    import os

    import torch

    from .models.loader import load_model
    from .train.head_trainer import HeadTrainer, TrainConfig

    cfg = TrainConfig(args.method, args.data, args.out, args.seq_len, args.doc_len, args.max_tokens, args.epochs,
                      args.batch_seqs,
                      args.lr, args.warmup_steps, 0.0, 0.5, args.draft_vocab, args.intermediate_size, args.ttt_steps,
                      args.num_heads, args.topk, args.checkpoint_every, args.resume, args.int8, args.seed,
                      args.regenerate, init=args.init, refresh_vocab=args.refresh_vocab)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    target = load_model(args.target, dtype=args.dtype, device=args.device, progress=not args.no_progress,
                        quantization=args.quantization)
    for method, info in HeadTrainer(cfg, target, progress=not args.no_progress).run().items():
        print(f"{method} head for {info['target']}: {info['tokens']} tokens in {info['windows']} windows, "
              f"{info['steps']} steps; features {info['feature_s']} s, training {info['train_s']} s; final loss "
              f"{info['final_loss']}, top-1 agreement per step {info['final_agree']} -> {cfg.out_dir(method)}")
    return 0


def cmd_bench(args) -> int:
    if args.bench_command == "offline":
        return cmd_bench_offline(args)
    if args.bench_command == "quality":
        return cmd_bench_quality(args)
    return cmd_bench_serve(args)


def _summary(s) -> str:
    parts = [f"[{s.method}] {s.prompt_tokens} prompt + {s.completion_tokens} completion tokens ({s.finish_reason})",
             f"TTFT {s.ttft_s * 1000:.0f} ms", f"TPOT {s.tpot_s * 1000:.1f} ms", f"decode {s.decode_tok_s:.2f} tok/s"]
    if s.acceptance_rate is not None:
        parts.append(f"acceptance {s.acceptance_rate:.2f}, mean accepted length {s.mean_accepted_length:.2f}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "models":
            return cmd_models(args)
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "train-head":
            return cmd_train_head(args)
        if args.command == "serve":
            from .server.serve import run_server

            return run_server(args)
    except (SpecDecError, ValueError) as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
