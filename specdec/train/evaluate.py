"""`python -m specdec.train.evaluate`: how often learned heads would be accepted on held-out prompts, teacher-forced.

The target answers the prompts greedily (batched, no speculation). One teacher-forced pass of the target over each
prompt and answer gives the states every head reads. Each head then guesses, at every position of the answer, the
k tokens a chain drafted from there would hold (EAGLE-3 unrolled as in training, each step on the tokens before it;
Medusa's heads side by side), and a greedy chain of k is replayed over the answer: draft from the newest token,
accept while the guesses match the answer, then the target's own token. At greedy that is the engine's accepted
length for a chain of k (shipped EAGLE-3 head, int4 target, builtin + humaneval:20 code-gen, 128 tokens: 2.050
replayed, 2.046 served by `bench offline`), at the cost of one prefill per prompt rather than a decode per head,
and every head is judged on the same answers. Heads run in float32 here (the engine runs bf16, 8-bit or 4-bit blocks).

    python -m specdec.train.evaluate --quantization int4 --prompts builtin,humaneval:20 --categories code-gen \\
        --head eagle3=specdec/heads/qwen2.5-coder-1.5b-instruct/eagle3 --head medusa=OTHER/medusa

`--calibrate` also reports, per sibling rank of a token tree, how well the head's probabilities predict that its
guess is the answer's token (mean probability, hit rate, and the exponent a that makes p^a the hit rate): token
trees are sized by those probabilities (proposers/tree.py). `--data SOURCES` judges on training sources' asks (e.g.
`functions:pydash[200:280]`, which no shipped head was trained on) instead of the benchmark's prompts.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import torch

from ..errors import SpecDecError
from ..proposers.eagle import EAGLE, EAGLE3
from ..proposers.medusa import METHOD as MEDUSA


@dataclass
class Answer:
    tokens: torch.Tensor            # [T] prompt then the target's greedy answer
    prompt_len: int
    capped: bool                    # the answer stopped at its token limit (the engine drafts fewer near it)
    states: dict[int, torch.Tensor] = field(default_factory=dict)    # layer -> [T, H] the target's states


@dataclass
class Acceptance:
    mean_accepted_length: float     # 1 + accepted / chain steps (the bonus token included, as the engine counts)
    per_position: list[float]       # acceptance at chain position 1..k (accepted / drafted there)
    agree: list[float]              # top-1 agreement of guess j with the answer at every answer position
    in_vocab: float                 # answer tokens the head can propose at all
    steps: int


def head_layers(method: str, head, num_layers: int) -> tuple[int, ...]:
    """The target layers a head reads (models/runner's numbering: num_layers = the final normed state)."""
    return tuple(head.cfg.aux_layers) if method in (EAGLE3.name, EAGLE.name) else (num_layers,)


@torch.inference_mode()
def teacher_forced(model, answered: list[tuple[list[int], list[int], bool]], layers: tuple[int, ...]) -> list[Answer]:
    """(prompt ids, the target's greedy answer, whether it stopped at its token limit) per prompt -> the target's
    states over prompt + answer at `layers`, in one forward each."""
    from .features import teacher_forced_pass

    done = []
    for prompt, answer, capped in answered:
        ids = list(prompt) + list(answer)
        _, hidden = teacher_forced_pass(model, ids, layers)
        done.append(Answer(torch.tensor(ids), len(prompt), capped, {i: hidden[i].clone() for i in layers}))
    return done


@torch.inference_mode()
def step_logits(method: str, head, embed: torch.nn.Embedding, answer: Answer, k: int,
                num_layers: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The head's logits for k draft steps over the answer, k x [T, V'] (row t of step j: token t + j + 2, as in
    `guesses`), and its map from the V' draft ids to target ids."""
    x = answer.tokens
    states = torch.cat([answer.states[i] for i in head_layers(method, head, num_layers)], -1)[None].float()
    if method == MEDUSA.name:                                                                  # states [1, T, H]
        return [lg[0] for lg in head(states, k)], head.token_map
    emb = embed(torch.cat([x[1:], x[-1:]])[None]).float()                                   # x_{t+1} per row t
    logits = head.train_forward(emb, head.fuse(states), k)                                  # states [1, T, 3H]
    return [lg[0] for lg in logits], head.draft_to_target


@torch.inference_mode()
def guesses(method: str, head, embed: torch.nn.Embedding, answer: Answer, k: int, num_layers: int) -> torch.Tensor:
    """[k, T] target ids: row j, column t is the head's guess for token t + j + 2 from the states up to t and the
    tokens up to t + j + 1 (a chain drafted after token t + 1 holds guesses 0..k-1 of column t)."""
    logits, to_target = step_logits(method, head, embed, answer, k, num_layers)
    return torch.stack([to_target[lg.argmax(-1)] for lg in logits])


def replay_chain(tokens: torch.Tensor, prompt_len: int, guess: torch.Tensor, k: int,
                 capped: bool = False) -> list[tuple[int, int]]:
    """Greedy chains of k over the answer tokens[prompt_len:] -> (tokens drafted, tokens accepted) per chain step.
    The first answer token comes from the prefill; each step drafts from the newest token n - 1 (guess column
    n - 2). capped: the answer ends at its token limit, so, as the engine does, a step drafts at most one token
    fewer than remain (none when one remains: a plain forward, not a chain step)."""
    T, n, steps = len(tokens), prompt_len + 1, []
    while n < T:
        kk = min(k, T - n - 1) if capped else k
        if kk <= 0:
            break
        a = 0
        while a < kk and n + a < T and int(guess[a, n - 2]) == int(tokens[n + a]):
            a += 1
        steps.append((kk, a))
        n += a + 1
    return steps


def chain_steps(match: list[bool], k: int) -> tuple[int, int]:
    """(drafts accepted, chain steps) of greedy chains of k over an answer where match[i] says whether a proposer
    reading the answer's first i tokens guesses its token i: each step accepts the run of matches (at most k), then
    the target adds one token (the benchmark scripts' teacher-forced replays of a whole draft model)."""
    p = steps = accepted = 0
    while p < len(match):
        a = 0
        while a < k and p + a < len(match) and match[p + a]:
            a += 1
        steps, accepted, p = steps + 1, accepted + a, p + a + 1
    return accepted, steps


@torch.inference_mode()
def acceptance(method: str, head, embed: torch.nn.Embedding, done: list[Answer], k: int,
               num_layers: int) -> Acceptance:
    """A head's teacher-forced acceptance over the answers, for greedy chains of k."""
    drafted, hits, agree, seen, inside, steps = [0] * k, [0] * k, [0] * k, [0] * k, 0, []
    can = torch.zeros(head.cfg.vocab_size, dtype=torch.bool)                 # [vocab] what the head can propose
    can[head.token_map if method == MEDUSA.name else head.draft_to_target] = True
    for ans in done:
        g = guesses(method, head, embed, ans, k, num_layers)
        x, P, T = ans.tokens, ans.prompt_len, len(ans.tokens)
        for j in range(k):
            cols = torch.arange(P - 1, T - j - 2)                       # guesses of answer tokens after the first
            agree[j] += int((g[j, cols] == x[cols + j + 2]).sum())
            seen[j] += len(cols)
        inside += int(can[x[P:]].sum())
        for kk, a in replay_chain(x, P, g, k, ans.capped):
            steps.append(a)
            for i in range(kk):
                drafted[i] += 1
                hits[i] += int(a > i)
    answer_tokens = sum(len(a.tokens) - a.prompt_len for a in done)
    return Acceptance(1 + sum(steps) / max(1, len(steps)), [h / max(1, d) for h, d in zip(hits, drafted)],
                      [a / max(1, s) for a, s in zip(agree, seen)], inside / max(1, answer_tokens), len(steps))


@torch.inference_mode()
def tree_guesses(method: str, head, embed: torch.nn.Embedding, done: list[Answer], depth: int, topk: int,
                 num_layers: int) -> list[list[tuple[float, bool]]]:
    """Per sibling rank r < topk: (the head's probability of its r-th guess, whether that guess is the answer's
    token) at every draft step a greedy token tree could test it. Step j of column t counts when the answer's
    tokens of steps 0..j-1 were each among their step's topk guesses: the tree can hold the answer's path there,
    and verification reaches the step exactly when the guesses above it were right."""
    pairs: list[list[tuple[float, bool]]] = [[] for _ in range(topk)]
    for ans in done:
        logits, to_target = step_logits(method, head, embed, ans, depth, num_layers)
        x, P, T = ans.tokens, ans.prompt_len, len(ans.tokens)
        cols = torch.arange(P - 1, T - 2)                                   # drafting after answer token t + 1
        reach = torch.ones(len(cols), dtype=torch.bool)
        for j in range(depth):
            m = reach & (cols + j + 2 < T)
            lp, idx = torch.log_softmax(logits[j][cols].float(), -1).topk(topk, -1)     # [C, topk]
            hit = to_target[idx] == x[(cols + j + 2).clamp(max=T - 1)][:, None]          # [C, topk]
            for r in range(topk):
                pairs[r] += zip(lp[m, r].exp().tolist(), hit[m, r].tolist())
            reach = m & hit.any(-1)
    return pairs


def fit_exponent(logp: torch.Tensor, hit: torch.Tensor) -> float:
    """The a in [0.5, 3] (steps of 0.05) that maximises the Bernoulli likelihood of hits [N] (bool) under p^a,
    logp [N] = log p."""
    grid = torch.arange(0.5, 3.0001, 0.05, dtype=torch.float64)
    lq = grid[:, None] * logp.double().clamp(max=0.0)[None]                             # [A, N] log p^a
    ll = torch.where(hit[None], lq, torch.log1p(-lq.exp().clamp(max=1 - 1e-9))).sum(-1)
    return round(float(grid[int(ll.argmax())]), 2)


def calibration(method: str, head, embed: torch.nn.Embedding, done: list[Answer], depth: int, topk: int,
                num_layers: int) -> tuple[list[float], list[tuple[float, float, int]]]:
    """Per sibling rank, the exponent a that makes p^a the hit rate of the head's guesses, and (mean probability, hit
    rate, guesses) as measured."""
    pairs = tree_guesses(method, head, embed, done, depth, topk, num_layers)
    seen = [(sum(p for p, _ in ps) / max(1, len(ps)), sum(h for _, h in ps) / max(1, len(ps)), len(ps))
            for ps in pairs]
    exps = [fit_exponent(torch.tensor([p for p, _ in ps]).log(), torch.tensor([h for _, h in ps])) if ps else 1.0
            for ps in pairs]
    return exps, seen


def prompts_from_sources(sources: str, tokenizer) -> list[dict]:
    """Training sources (train.data's syntax) -> their conversations' asks (up to the first user turn), as prompts."""
    from .data import first_ask, load_source

    out = []
    for part in [s.strip() for s in sources.split(",") if s.strip()]:
        for doc in load_source(part, tokenizer):
            if not doc or not isinstance(doc[0], dict):
                raise SpecDecError(f"--data {part}: held-out prompts need conversations (not plain text or code)")
            ask = first_ask(doc)
            if ask is not None:
                out.append({"messages": ask, "category": part})
    return out


def main(argv: list[str] | None = None) -> None:
    from ..bench.datasets import load_prompts
    from ..config import PLAIN, SpeculativeConfig
    from ..llm import LLM
    from ..models.heads import load_head, shipped_head
    from ..proposers.registry import get_method
    from ..sampling_params import SamplingParams

    ap = argparse.ArgumentParser(prog="python -m specdec.train.evaluate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quantization", default="none", choices=["none", "int8", "int4"], help="the target's linears")
    ap.add_argument("--prompts", default="builtin,humaneval:20")
    ap.add_argument("--data", default=None, metavar="SOURCES",
                    help="judge on these training sources' asks instead of --prompts (train-head's syntax, e.g. "
                         "functions:pydash[200:]): held-out text for --calibrate")
    ap.add_argument("--categories", default=None, help="comma list: keep only these prompt categories")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4, help="chain length (Medusa: at most its number of heads)")
    ap.add_argument("--head", action="append", default=[], metavar="METHOD[=DIR]",
                    help="a head to judge (repeatable); without DIR the one shipped for the target")
    ap.add_argument("--calibrate", action="store_true",
                    help="also report how well each head's probabilities predict acceptance in a token tree of --topk "
                         "guesses per node and --k levels (per sibling rank: the exponent a that makes p^a the hit "
                         "rate)")
    ap.add_argument("--topk", type=int, default=4, help="--calibrate: guesses per node")
    args = ap.parse_args(argv)
    prog = "python -m specdec.train.evaluate"
    heads = [(h.partition("=")[0], h.partition("=")[2] or None) for h in args.head or [EAGLE3.name, MEDUSA.name]]
    bad = [m for m, _ in heads if m not in (EAGLE3.name, MEDUSA.name)]
    if bad or args.k < 1 or args.max_tokens < 2 or not 1 <= args.topk <= 16:
        raise SystemExit(f"{prog}: heads must be eagle3 or medusa (got {bad}), --k >= 1, --max-tokens >= 2, "
                         "--topk in 1..16")
    llm = LLM(quantization=args.quantization, progress=False)
    try:
        prompts = prompts_from_sources(args.data, llm.tokenizer) if args.data else load_prompts(args.prompts)
    except SpecDecError as e:
        raise SystemExit(f"{prog}: {e}") from None
    if args.categories:
        prompts = [p for p in prompts if p.get("category") in args.categories.split(",")]
    if not prompts:
        raise SystemExit(f"{prog}: no prompts in {args.data or args.prompts} of categories {args.categories}")
    model = llm.target.model
    try:
        loaded = [(m, d, load_head(d or shipped_head(m, llm.target.name, get_method(m).trainable), model,
                                   torch.float32).module) for m, d in heads]
    except SpecDecError as e:
        raise SystemExit(f"{prog}: {e}") from None
    layers = tuple(sorted({i for m, _, h in loaded for i in head_layers(m, h, model.config.num_layers)}))
    outs = llm.generate([p["messages"] for p in prompts], SamplingParams(max_tokens=args.max_tokens, temperature=0.0),
                        spec=SpeculativeConfig(method=PLAIN))
    done = teacher_forced(model, [(o.prompt_token_ids, o.token_ids, o.finish_reason == "length") for o in outs],
                          layers)
    print(f"{len(done)} prompts, {sum(len(a.tokens) - a.prompt_len for a in done)} answer tokens; "
          f"target {llm.target.name} ({args.quantization}); chains of k = {args.k}, teacher-forced replay")
    print("| head | dir | mean accepted length | acceptance per position | guess agreement per step | in vocab |")
    print("|---|---|---|---|---|---|")
    steps = [min(args.k, h.cfg.num_heads) if m == MEDUSA.name else args.k for m, _, h in loaded]   # per head
    for (m, d, h), k in zip(loaded, steps):
        r = acceptance(m, h, model.embed_tokens, done, k, model.config.num_layers)
        print(f"| {m} | {d or 'shipped'} | {r.mean_accepted_length:.3f} | "
              f"{' / '.join(f'{p:.3f}' for p in r.per_position)} | {' / '.join(f'{a:.3f}' for a in r.agree)} | "
              f"{r.in_vocab:.3f} |")
    if not args.calibrate:
        return
    print(f"\ntoken-tree calibration: {args.topk} guesses per node, {args.k} levels; per sibling rank: mean "
          "probability -> hit rate (guesses), fitted exponent")
    for (m, d, h), k in zip(loaded, steps):
        exps, seen = calibration(m, h, model.embed_tokens, done, k, args.topk, model.config.num_layers)
        ranks = "; ".join(f"{p:.3f} -> {q:.3f} ({n}) a={a:.2f}" for a, (p, q, n) in zip(exps, seen))
        print(f"- {m} ({d or 'shipped'}): {ranks}")


if __name__ == "__main__":
    main()
