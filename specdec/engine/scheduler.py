"""Which sequences run in the next forward, and how many tokens each brings.

nano-vllm's schedule -> run -> postprocess, with chunked prefill beside decodes (vLLM's V1 shape): every running
sequence that decodes gets its row (plus its draft, decided later), and the rest of the step's token budget
(`max_num_batched_tokens`) goes to prompt chunks: first prompts that finish this step (a short request is not queued
behind a long one), then the chunks of longer running prompts, then waiting ones admitted in FIFO order while
`max_num_seqs` and the KV budget allow. While sequences decode, a step's prompt tokens are also capped so that
the step takes about `itl_target_s` (on a CPU a 512-token chunk takes seconds, and every stream waits for the step
that carries it): the cap follows what prompt tokens were measured to cost at the context the chunk starts at
(ChunkCost: a token's linears cost the same anywhere, its attention grows with the keys before it). A request
that does not fit waits; when a decoding sequence cannot grow, the newest running sequence is preempted (its cache
freed, recomputed later from its tokens: vLLM's recompute preemption), so a step never fails for lack of KV.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

import numpy as np

from ..models.kv_manager import KVManager
from ..models.prefix_cache import Hit, common_prefix
from .sequence import Sequence

# The default step-time target while streams decode. Each step also pays costs that do not shrink with its prompt
# chunk (the streams' drafts and rows, a forward's fixed part), so a shorter target slows the long prompt itself: on
# a 2-core CPU 0.8 s keeps a running stream's gaps under 1 s and the long prompt within 25% of its time alone
# (docs/benchmarks/stall).
ITL_TARGET_S = 0.8


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8                 # sequences in one forward at most (vLLM's name)
    max_num_batched_tokens: int = 512     # prompt-chunk + decode rows per step (drafts come on top)
    max_total_tokens: int = 65536         # KV positions of all sequences together (SGLang's name); allocated as
                                          # sequences grow, so the default costs nothing until requests use it
    itl_target_s: float | None = ITL_TARGET_S   # while sequences decode, prompt chunks are sized so a step takes
                                          # about this long (the streams' inter-token latency); None: no cap

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.itl_target_s is not None and self.itl_target_s <= 0:
            raise ValueError(f"itl_target_s must be > 0, got {self.itl_target_s}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({self.max_num_seqs})")


@dataclass
class ScheduledBatch:
    decodes: list[Sequence] = field(default_factory=list)                   # one row each, + their drafts
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)      # (sequence, tokens of its chunk)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def num_rows(self) -> int:
        return len(self.decodes) + sum(n for _, n in self.prefills)


# a new request waits for a running one's prefill when they share at least this many prompt tokens it has not
# computed yet (then copies them), instead of computing them a second time beside it
SHARE_MIN = 64
MIN_CHUNK = 16          # prompt tokens a step carries at least, however slow the machine (progress is guaranteed)


class ChunkCost:
    """Seconds a prompt chunk adds to a step: n tokens starting at position s cost n * (a + b * (s + n / 2)) (the
    linears a per token; attention b per token and key before it, the chunk's rows reading s + n / 2 keys on
    average). a and b are fitted by least squares over the steps that carried chunks, older steps weighing DECAY
    less each. Where the chunks seen so far all sat at about one context, the two cannot be told apart: the cost per
    token at that context is taken (b as last fitted, or 0), which is right at that context."""

    DECAY = 0.8

    def __init__(self):
        self.sums = np.zeros(5)             # weighted sums of N^2, N X, X^2, N t, X t (X = sum n (s + n / 2))
        self.a: float | None = None
        self.b = 0.0

    def observe(self, chunks: list[tuple[int, int]], seconds: float) -> None:
        """A step's prompt chunks as (start position, tokens), and the seconds they took."""
        n = float(sum(k for _, k in chunks))
        x = float(sum(k * (s + k / 2) for s, k in chunks))
        self.sums = self.DECAY * self.sums + np.array([n * n, n * x, x * x, n * seconds, x * seconds])
        snn, snx, sxx, snt, sxt = self.sums
        det = snn * sxx - snx * snx
        if det > 1e-3 * snn * sxx:                   # the contexts varied enough to separate a from b
            a, b = (snt * sxx - sxt * snx) / det, (snn * sxt - snx * snt) / det
            if a > 0 and b >= 0:
                self.a, self.b = a, b
                return
        a = (snt - self.b * snx) / snn               # keep the attention slope, refit the rest
        self.a, self.b = (a, self.b) if a > 0 else (snt / snn, 0.0)

    def tokens_within(self, seconds: float, start: int) -> int:
        """The most prompt tokens a chunk starting at `start` may carry to take at most `seconds`."""
        if self.a is None or seconds <= 0:
            return 0
        lin = self.a + self.b * start                # n * lin + (b / 2) n^2 = seconds
        if self.b <= 0:
            return int(seconds / lin)
        return int((-lin + math.sqrt(lin * lin + 2 * self.b * seconds)) / self.b)

    def seconds(self, start: int, n: int) -> float:
        return 0.0 if self.a is None else n * (self.a + self.b * (start + n / 2))


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVManager, exact_rows: bool = False):
        self.cfg = cfg
        self.kv = kv
        self.exact_rows = exact_rows                    # generated tokens' K/V is reusable as computed (runner.py)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.chunk_cost = ChunkCost()                   # fitted over steps that carried prompt chunks
        self.decode_step_s: float | None = None         # measured (EMA) over steps that carried none

    def observe(self, chunks: list[tuple[int, int]], seconds: float) -> None:
        """The engine's last step: its prompt chunks as (start position, tokens), and how long it took."""
        tokens = sum(n for _, n in chunks)
        if tokens == 0:
            self.decode_step_s = seconds if self.decode_step_s is None else 0.7 * self.decode_step_s + 0.3 * seconds
        elif tokens >= MIN_CHUNK:
            self.chunk_cost.observe(chunks, max(seconds - (self.decode_step_s or 0.0), seconds / 2))

    def prompt_budget(self, budget: int, decoding: bool, start: int = 0) -> int:
        """Prompt tokens this step may carry: the budget, or with streams decoding what fits in itl_target_s for a
        chunk that starts at position `start`."""
        if not decoding or self.cfg.itl_target_s is None or self.chunk_cost.a is None:
            return budget
        room = self.cfg.itl_target_s - (self.decode_step_s or 0.0)
        return max(min(MIN_CHUNK, budget), min(budget, self.chunk_cost.tokens_within(room, start)))

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence, extras: dict | None = None) -> None:
        """Take a finished or aborted sequence out of the queues and free its cache; with `extras` (its proposers'
        caches, possibly none) its cache becomes a prefix entry instead."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.prefix_hit is not None:                 # removed between scheduling and the step's restore
            self.kv.unpin(seq.prefix_hit)
            seq.prefix_hit = None
        if extras is not None:
            # its prompt's K/V was computed as prompt rows (or copied from exact ones): reusable bit for bit, and so
            # are its generated tokens' where rows are exact. A finished sequence's last token (no K/V yet) joins
            # the entry (settled, where rows are not exact); an aborted one keeps only what it computed
            tokens = seq.token_ids if seq.finished else seq.token_ids[:seq.num_computed]
            exact = seq.num_computed if self.exact_rows else min(seq.num_computed, len(seq.prompt_ids))
            self.kv.keep(seq.seq_id, tokens, exact, extras, seq.cache_salt)
        else:
            self.kv.free_seq(seq.seq_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt_newest(self, keep: Sequence) -> Sequence | None:
        for victim in reversed(self.running):
            if victim is not keep:
                self.running.remove(victim)
                self.kv.free_seq(victim.seq_id)
                victim.num_computed = 0
                self.waiting.appendleft(victim)
                return victim
        return None

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.cfg.max_num_batched_tokens
        # decoding sequences first: each needs room for its newest token and up to k drafts
        for seq in list(self.running):
            if seq not in self.running or seq.prefilling:
                continue
            need = seq.num_computed + 1 + seq.spec.k
            while self.kv.extra_needed(seq.seq_id, need) > self.kv.free:
                victim = self._preempt_newest(keep=seq)
                if victim is None:
                    break
                batch.preempted.append(victim)
                if victim in batch.decodes:
                    batch.decodes.remove(victim)
            self.kv.ensure(seq.seq_id, need)
            batch.decodes.append(seq)
            budget -= 1
        # priced at the furthest context a running prompt has reached: its chunk's rows read the most keys
        start = max((s.num_computed for s in self.running if s.prefilling), default=0)
        budget = self.prompt_budget(budget, bool(batch.decodes), start)
        # then prompt chunks: prompts that finish this step first (running, then waiting), then running sequences
        # mid-prefill, then newly admitted ones
        left = lambda seq: len(seq.token_ids) - seq.num_computed   # noqa: E731
        for seq in [s for s in self.running if s.prefilling]:
            if 0 < left(seq) <= budget and self._chunk(seq, budget, batch):
                budget -= batch.prefills[-1][1]
        for seq in list(self.waiting):
            if len(self.running) >= self.cfg.max_num_seqs or budget <= 0:
                break
            if left(seq) <= budget and self._chunk(seq, budget, batch):
                self.waiting.remove(seq)
                self.running.append(seq)
                budget -= batch.prefills[-1][1]
        chunked = {id(s) for s, _ in batch.prefills}
        for seq in self.running:
            if budget <= 0:
                break
            if seq.prefilling and id(seq) not in chunked and self._chunk(seq, budget, batch):
                budget -= batch.prefills[-1][1]
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            if not self._chunk(seq, budget, batch):
                break                                    # does not fit now: it waits (FIFO among long prompts)
            self.waiting.popleft()
            self.running.append(seq)
            budget -= batch.prefills[-1][1]
        return batch

    def _find_prefix(self, seq: Sequence) -> Hit | None | bool:
        """Where a new (or preempted) sequence's prefill may start: the longest exact prefix a prefix entry or a
        running sequence's computed prompt shares with it (the prompt's last token is computed in any case, for its
        logits). False: wait, a running sequence is still prefilling a long prefix this one shares (two requests
        with one system prompt compute it once)."""
        limit = len(seq.prompt_ids) - 1
        hit = self.kv.lookup(seq.token_ids, limit, seq.cache_salt)
        if seq.prefix_bound is not None:           # entries only, as far as that proposer's cache in them reaches
            if hit is not None:
                own = hit.entry.extras.get(seq.prefix_bound)
                hit.target = min(hit.target, own.length if own is not None else 0)
                if hit.target == 0 or not self.kv.usable(hit):
                    self.kv.unpin(hit)
                    hit = None
            return hit
        best = hit.target if hit is not None else 0
        ids = np.asarray(seq.prompt_ids[:limit], dtype=np.int64)
        for r in self.running:
            if r.seq_id not in self.kv.caches or r.cache_salt != seq.cache_salt:    # another tenant's
                continue
            shared = common_prefix(np.asarray(r.prompt_ids[:len(ids)], dtype=np.int64), ids)
            have = min(r.num_computed, len(r.prompt_ids), shared)    # computed as prompt rows, and shared
            # (and still held: a sliding-window model's local layers keep only their recent positions)
            if have > best and self.kv.usable(candidate := Hit(None, have, have, source_seq=r.seq_id)):
                if hit is not None:
                    self.kv.unpin(hit)
                hit, best = candidate, have
            # ... or the running one computes all this prompt can reuse (n choices of one prompt: one prefill)
            gain = shared - max(best, r.num_computed)
            if r.prefilling and gain > 0 and (gain >= SHARE_MIN or shared == limit):
                if hit is not None:
                    self.kv.unpin(hit)
                return False
        return hit

    def _chunk(self, seq: Sequence, budget: int, batch: ScheduledBatch) -> bool:
        hit = None
        if seq.num_computed == 0 and seq.reuse_prefix:
            hit = self._find_prefix(seq)
            if hit is False:
                return False
        start = hit.target if hit is not None else seq.num_computed
        n = min(budget, len(seq.token_ids) - start)
        # a chunk that completes the prompt samples the first token; keep room for that step's drafts too
        need = start + n + (1 + seq.spec.k if n == len(seq.token_ids) - start else 0)
        if seq.num_computed == 0:
            self.kv.start_at(seq.seq_id, start)
        if self.kv.extra_needed(seq.seq_id, need) > self.kv.free:
            if hit is not None:
                self.kv.unpin(hit)
            return False
        self.kv.ensure(seq.seq_id, need)
        if seq.num_computed == 0 and seq.reuse_prefix:
            self.kv.prefix.queries += len(seq.prompt_ids) - 1
        if hit is not None:
            self.kv.adopt(seq.seq_id, hit)
            self.kv.prefix.hits += hit.target
            seq.num_computed = hit.target
            seq.prefix_hit = hit               # the engine copies the proposers' part, then unpins it
        batch.prefills.append((seq, n))
        return True
