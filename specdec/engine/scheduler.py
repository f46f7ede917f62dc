"""Which sequences run in the next forward, and how many tokens each brings.

nano-vllm's schedule -> run -> postprocess, with chunked prefill beside decodes (vLLM's V1 shape): every running
sequence that decodes gets its row (plus its draft, decided later), and the rest of the step's token budget
(`max_num_batched_tokens`) goes to prompt chunks, of running sequences first, then of waiting ones admitted in
FIFO order while `max_num_seqs` and the KV budget allow. A request that does not fit waits; when a decoding
sequence cannot grow, the newest running sequence is preempted (its cache freed, recomputed later from its
tokens: vLLM's recompute preemption), so a step never fails for lack of KV.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from .kv_manager import KVManager
from .sequence import Sequence


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8                 # sequences in one forward at most (vLLM's name)
    max_num_batched_tokens: int = 512     # prompt-chunk + decode rows per step (drafts come on top)
    max_total_tokens: int = 65536         # KV positions of all sequences together (SGLang's name); allocated as
                                          # sequences grow, so the default costs nothing until requests use it

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
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


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVManager):
        self.cfg = cfg
        self.kv = kv
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of the queues and free its cache."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
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
        # then prompt chunks: running sequences mid-prefill, then newly admitted ones
        for seq in self.running:
            if budget <= 0:
                break
            if seq.prefilling and self._chunk(seq, budget, batch):
                budget -= batch.prefills[-1][1]
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            if not self._chunk(seq, budget, batch):
                break                                    # does not fit now: it waits (FIFO: nothing overtakes it)
            self.waiting.popleft()
            self.running.append(seq)
            budget -= batch.prefills[-1][1]
        return batch

    def _chunk(self, seq: Sequence, budget: int, batch: ScheduledBatch) -> bool:
        n = min(budget, len(seq.token_ids) - seq.num_computed)
        # a chunk that completes the prompt samples the first token; keep room for that step's drafts too
        need = seq.num_computed + n + (1 + seq.spec.k if n == len(seq.token_ids) - seq.num_computed else 0)
        if self.kv.extra_needed(seq.seq_id, need) > self.kv.free:
            return False
        self.kv.ensure(seq.seq_id, need)
        batch.prefills.append((seq, n))
        return True
