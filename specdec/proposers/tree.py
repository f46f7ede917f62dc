"""Token trees for learned heads (EAGLE-2's dynamic trees): expand the likeliest guesses level by level, then keep
the nodes most likely to be accepted, and hand verification one tree.

A node's score is the log of the head's probability of its whole path (the product of its ancestors' and its own
probabilities): under a calibrated head that is the chance verification reaches it. Expansion grows the `topk`
best nodes of each level by their `topk` best children; re-ranking keeps the `budget` best nodes of everything
expanded. Scores only fall along a path, so the kept set holds every kept node's ancestors.

How many nodes to keep is a measurement (`row_cost`, the target's V(rows) from the cost model): each kept node
adds its probability to the expected accepted length and a row to the verification forward, so the tree stops
at the size whose expected tokens per unit of verification time is highest.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TreeNode:
    token: int                   # target vocabulary id
    parent: int                  # index in the builder's node list, -1 for a child of the newest token
    score: float                 # log-probability of the path down to this node
    depth: int                   # 1 for the first draft position
    slot: int = -1               # where the head cached this node's own row, once it was expanded


@dataclass
class TreeBuilder:
    """One sequence's tree while it is drafted."""
    topk: int
    nodes: list[TreeNode] = field(default_factory=list)
    frontier: list[int] = field(default_factory=list)     # the nodes of the newest level picked for expansion

    def add_top(self, parent: int, logprobs: list[float], tokens: list[int]) -> None:
        """Children of `parent` (-1: the newest token): the head's topk best guesses after it, best first, as their
        log-probabilities and target ids (the proposers take one top-k over many rows at once)."""
        base = self.nodes[parent].score if parent >= 0 else 0.0
        depth = self.nodes[parent].depth + 1 if parent >= 0 else 1
        for v, i in zip(logprobs, tokens):
            self.nodes.append(TreeNode(i, parent, base + v, depth))

    def pick_frontier(self, depth: int) -> list[int]:
        """The topk best nodes of level `depth`: the ones the next level grows from."""
        level = [i for i, n in enumerate(self.nodes) if n.depth == depth]
        self.frontier = sorted(level, key=lambda i: -self.nodes[i].score)[: self.topk]
        return self.frontier

    def path(self, node: int) -> list[int]:
        """node's ancestors, root side first, then node."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.nodes[node].parent
        return out[::-1]

    def _ranked(self) -> list[int]:
        return sorted(range(len(self.nodes)), key=lambda i: (-self.nodes[i].score, self.nodes[i].depth, i))

    def _size(self, ranked: list[int], budget: int, row_cost: Callable[[int], float] | None) -> int:
        """How many of the ranked nodes to keep: budget, or with row_cost the count whose expected tokens per unit
        of verification time, (1 + the kept nodes' path probabilities) / V(1 + kept), is highest."""
        if row_cost is None or not ranked:
            return budget
        best, expected = (1, 0.0), 1.0
        for n, i in enumerate(ranked[:budget], 1):
            expected += math.exp(self.nodes[i].score)
            rate = expected / row_cost(n + 1)
            if n == 1 or rate > best[1] + 1e-9:
                best = (n, rate)
        return best[0]

    def worth_growing(self, budget: int, row_cost: Callable[[int], float] | None = None) -> bool:
        """Whether expanding the frontier can still pay: some frontier node is among the nodes `select` would keep
        now. A child scores at most its parent, so below a node that is not kept nothing would be (short of a rare
        case where many children together would lengthen the kept list; then the tree is a little smaller)."""
        ranked = self._ranked()
        kept = set(ranked[: self._size(ranked, budget, row_cost)])
        return any(f in kept for f in self.frontier)

    def select(self, budget: int, row_cost: Callable[[int], float] | None = None) -> tuple[list[int], list[int]]:
        """The likeliest nodes, at most `budget`, as (tokens, parents) in verification order: by depth, parents
        first. With row_cost (V(n): a target forward over n rows relative to one), the number kept maximises
        (1 + the kept nodes' path probabilities) / V(1 + kept)."""
        ranked = self._ranked()
        budget = self._size(ranked, budget, row_cost)
        keep = set(ranked[:budget])
        for i in list(keep):                      # ties at -0.0 aside, ancestors are kept already
            keep.update(self.path(i))
        order = sorted(keep, key=lambda i: (self.nodes[i].depth, i))[:max(budget, 0)]
        at = {n: j for j, n in enumerate(order)}
        return ([self.nodes[n].token for n in order],
                [at.get(self.nodes[n].parent, -1) for n in order])
