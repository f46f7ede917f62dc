"""The step's drafting: which proposer drafts for each decoding sequence, and how many tokens (stage 2 of
`LLMEngine.step()`), with what a request needs for it when it arrives (method auto's decision, a combining method's
step controller) and what the proposers read beside the target (prompt chunks, hidden states).

A sequence drafts with its method's proposer; a request run by a step controller (auto's when it speculates with a
model proposer and prompt lookup, hybrid's) with the step-choice proposer, which asks the controller and drafts
through what it picks. So each step asks every proposer once, for all its sequences: one path.

One object, built by the engine over its proposers: `assign` at add_request, `propose` each step, `read_prompts`
after the forward; `uses` and `reader` tell the committer which proposers observe a sequence.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..config import AUTO
from ..errors import SpecDecError
from ..policy.cost_model import StepBudget
from ..policy.decide import Decision, RequestFeatures, prior_alpha
from ..proposers.base import Draft, ProposalContext, Proposer, empty_draft, tree_allowed
from ..proposers.registry import draft_model_method, get_method, lookup_method
from ..proposers.step_choice import StepChoiceProposer
from .commit import FORCED, Plan
from .sequence import Sequence

READ_BACK = 16         # tokens before a prompt chunk handed to proposers that read prompts (see read_prompts)


class Drafting:
    def __init__(self, proposers: dict[str, Proposer], policy_factory: Callable[[], object] | None = None,
                 row_cost: Callable[..., float] | None = None):
        self.proposers = proposers                 # one per loaded method ({method: Proposer})
        # methods auto (a request it speculates on with a model proposer and prompt lookup) and hybrid draft through
        # their request's step controller: one proposer for both, asked like the others
        self.step_choice = StepChoiceProposer(proposers)
        self._policy_factory = policy_factory
        self._policy = None
        # row_cost(n, context=c): V(n) after c tokens, a target forward over n rows relative to one (the cost
        # model's): sizes learned heads' token trees; None keeps num_speculative_tokens nodes
        self.row_cost = row_cost

    def assign(self, seq: Sequence, load: int) -> None:
        """A new request's drafting: method auto decides its method and k (`load`: running + waiting requests); a
        combining method (hybrid) gets its step controller; a fixed method needs nothing."""
        method = get_method(seq.spec.method)
        if method.kind == "policy":
            self._decide(seq, load)
        elif method.combines:
            self._combine(seq, method)

    @property
    def policy(self):
        """The speculation policy of method auto (built on first use: it measures or reads the cost model)."""
        if self._policy is None:
            if self._policy_factory is None:
                raise SpecDecError(f"method '{AUTO}' needs a speculation policy; this engine was built without one")
            self._policy = self._policy_factory()
        return self._policy

    def observe_forward(self, rows: int, context: int, seconds: float) -> None:
        """A decode step's forward, timed: the policy's clock (only once auto has a policy)."""
        if self._policy is not None:
            self._policy.observe_forward(rows, context, seconds)

    def runs(self, name: str) -> bool:
        """Whether this engine can draft with a method: its proposer is loaded (for a combining method, its model
        proposer's)."""
        method = get_method(name)
        return (method.combines[0] if method.combines else name) in self.proposers

    def _decide(self, seq: Sequence, load: int) -> None:
        """Method auto: the policy picks a method (or plain decoding) and k for this request (pool and load
        aware)."""
        policy, p, sp = self.policy, seq.params, seq.spec
        d = policy.decide(seq.request_id, sp.pool, RequestFeatures(p.temperature, p.top_p, p.max_tokens, load,
                                                                   len(seq.prompt_ids)))
        sp.decision = d
        seq.stats.method, seq.stats.num_speculative_tokens, seq.stats.policy_reason = d.method, d.k, d.reason
        chosen = get_method(d.method)
        if chosen.kind == "plain":
            sp.method, sp.k = d.method, 0
        elif chosen.free and d.method != lookup_method():
            # a cache (suffix decoding) chosen: no model proposer pays beside it here, and it drafts token trees alone
            sp.method, sp.k = d.method, d.k
        else:   # the draft (when chosen) and the longest lookup match side by side; the controller picks per step
            sp.k = policy.cfg.k_max
            free = [m for m in policy.available if get_method(m).free]
            sp.controller = policy.controller(d, sp.pool, p.temperature, len(seq.prompt_ids),
                                              self._longest_match(seq, free), p.max_tokens)

    def _combine(self, seq: Sequence, method) -> None:
        """A combining method (hybrid): the step controller runs its model proposer with the request's k and, each
        step, weighs the longest match of its free proposers against it (auto's per-step machinery, without a
        per-request decision)."""
        sp, p = seq.spec, seq.params
        model, *free = method.combines
        sp.k = sp.k or method.default_k
        alpha = prior_alpha(model, p.temperature, self.policy.cfg)
        decision = Decision(model, sp.k, 1.0, f"{method.name}: {model} or the longest match per step", alpha)
        sp.controller = self.policy.controller(decision, sp.pool, p.temperature, len(seq.prompt_ids),
                                               self._longest_match(seq, free))

    def _longest_match(self, seq: Sequence, methods: list[str]):
        """The step controller's guesser: the longest match among these free proposers' (prompt lookup, suffix
        decoding), as (match length, tokens); None when none is loaded."""
        finders = [self.proposers[m] for m in methods if m in self.proposers]
        if not finders:
            return None
        sp, p = seq.spec, seq.params

        def longest(ids, room, constraint):
            ctx = ProposalContext(seq.seq_id, ids, p, None, constraint, prompt_lookup_max=sp.prompt_lookup_max,
                                  prompt_lookup_min=sp.prompt_lookup_min, corpus=seq.corpus)
            return max((f.match(ctx, room) for f in finders), key=lambda m: (m[0], len(m[1])))
        return longest

    def drafter_of(self, method: str) -> Proposer | None:
        """The proposer a sequence of this method drafts with (auto's and a combining method's: the step-choice
        proposer); None for plain decoding or a method whose proposer is not loaded."""
        if method == AUTO or (get_method(method).combines and self.runs(method)):
            return self.step_choice
        return self.proposers.get(method)

    def uses(self, seq: Sequence) -> list[Proposer]:
        """The proposers that may draft for this sequence (its method's; for a step controller's, the one that asks it
        and those it picks among): they observe its verifications."""
        drafter = self.drafter_of(seq.spec.method)
        if drafter is None:
            return []
        if drafter is not self.step_choice or seq.spec.controller is None:
            return [drafter]
        return [drafter] + [self.proposers[n] for n in seq.spec.controller.uses if n in self.proposers]

    def reader(self, seq: Sequence) -> Proposer | None:
        """The learned head among the sequence's proposers, if any: it reads the sequence's hidden states at every
        step."""
        return next((p for p in self.uses(seq) if p.target_hidden), None)

    def release(self, seq: Sequence) -> None:
        """The sequence left the running set (finished, aborted or preempted): nothing planned for it is pending."""
        self.step_choice.release(seq.seq_id)

    def read_prompts(self, prefills: list[tuple[Sequence, int]]) -> None:
        """The step's prompt chunks, to the proposers that read prompts themselves (a draft model), in the step that
        prefills them in the target -- for a sequence of that proposer's method. A sequence whose step controller
        picks its proposer per step (auto, hybrid) leaves the draft's read of its prompt until a step first picks the
        draft, which then catches up in chunks (DraftModelProposer.propose): no first token waits for a read the
        policy may never use (a request that prompt lookup serves, a short answer)."""
        for name, proposer in self.proposers.items():
            # each chunk starts a few tokens early: after a prefix cache hit the draft's own cache may end a little
            # before the target's (it lacks the newest token's K/V), and the overlap lets it catch up here, in the
            # prefill, instead of in its first decode step (a proposer skips what its cache already holds)
            chunks = [(s.seq_id, max(0, s.num_computed - READ_BACK), s.token_ids[max(0, s.num_computed - READ_BACK):
                                                                                 s.num_computed + n])
                      for s, n in prefills if s.spec.method == name]
            if chunks:
                proposer.prefill(chunks)

    def propose(self, seqs: list[Sequence], rows: int) -> list[Plan]:
        """Each decoding sequence's draft for this step: the grammar's forced tokens where it has some, else its
        method's proposer's draft, every proposer asked once for all its sequences. The step-choice proposer (auto,
        hybrid) is asked last, with the rows the others' drafts add to the step."""
        plans = [Plan() for _ in seqs]
        # method auto under load: past the policy's max_load running sequences every step of theirs is plain (the
        # per-request gate, applied per step: a request admitted at low load stops drafting once the batch fills;
        # the draft model's catch-up forwards are not in the step budget, so it would underprice them)
        auto_off = self._policy is not None and len(seqs) > self._policy.cfg.max_load
        # a lone sequence alone in its step, when the clock has not timed a plain step for a while: one plain step,
        # the moment's reference for pricing its rows and the draft's chains (a controller's choice either way)
        probe = self._policy is not None and len(seqs) == 1 and rows <= 1 and self._policy.wants_plain_step()
        asked: dict[Proposer, list[tuple[int, int]]] = {}   # proposer -> (index, k), asked together below
        for i, seq in enumerate(seqs):
            sp = seq.spec
            room = min(sp.k, seq.room)
            if room > 0 and seq.constraint is not None:
                forced = seq.constraint.forced(room)          # the grammar's next tokens: verified without drafting
                if forced:
                    plans[i].draft, plans[i].source = Draft(torch.tensor(forced, dtype=torch.long)), FORCED
                    rows += len(forced)
                    continue
            drafter = self.drafter_of(sp.method)
            if drafter is None:
                continue
            k = max(0, room)
            if drafter is self.step_choice:                 # its controller picks k within the room, every step
                k = 0 if auto_off or probe else k
            elif k == 0:
                continue
            elif sp.topk > 1 and not tree_allowed(sp.topk, seq.params, seq.constraint):
                k = min(k, sp.depth)                        # a tree request verified as a chain: the tree's depth
            asked.setdefault(drafter, []).append((i, k))
        for drafter in sorted(asked, key=lambda d: d is self.step_choice):
            ctxs = [self.context(seqs[i], k) for i, k in asked[drafter]]
            if drafter is self.step_choice and self._policy is not None:
                context = max(len(s.token_ids) for s in seqs)     # the longest attention prices the rows
                budget = StepBudget(self._policy.cost.at(context), rows=rows, tokens=float(len(seqs)))
                for ctx in ctxs:
                    ctx.budget = budget
            drafts = drafter.propose(ctxs, [k for _, k in asked[drafter]])
            model = self.proposers.get(draft_model_method())     # its chain, timed: its step as the machine runs now
            timing = model.take_timing() if model is not None else None
            if timing is not None and self._policy is not None:
                self._policy.observe_draft(*timing)
            for (i, _), draft in zip(asked[drafter], drafts):
                # only a greedy request without a grammar or penalties is verified as a tree (exactly: by argmax)
                seq = seqs[i]
                plans[i].draft = draft if draft.parents is None or tree_allowed(2, seq.params, seq.constraint) \
                    else empty_draft()
                plans[i].source = draft.source or drafter.name
                rows += len(plans[i].draft)
        return plans

    def context(self, seq: Sequence, k: int) -> ProposalContext:
        sp = seq.spec
        # a tree is sized by what its rows cost at this sequence's context
        rows = functools.partial(self.row_cost, context=len(seq.token_ids)) if self.row_cost is not None else None
        return ProposalContext(seq.seq_id, seq.token_ids, seq.params, seq.generator, seq.constraint, sp.topk,
                               min(sp.depth, k), rows, sp.prompt_lookup_max, sp.prompt_lookup_min, seq.corpus,
                               sp.prediction, seq.penalties, controller=sp.controller, p_min=sp.p_min)

