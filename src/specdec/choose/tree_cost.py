"""How much to speculate with token trees: a depth and a node budget chosen each round (k="auto").

TreeCostModel is specdec.choose.cost's CostModel for trees: the same measured pass and draft costs, acceptance
learned per depth and sibling rank instead of per position, and a choice among the prefixes of the
expected tree (its docstring). The choice reads only earlier rounds, so the tree rules stay exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..draft.tree import breadth_first, tree_depths
from ..verify.tree import children_of
from .cost import Choice, CostModel, DraftCost, ObservedRound, Tokens


def sibling_ranks(parents: Sequence[int]) -> list[int]:
    """Position of each node among its parent's children, in drafter order (0 = tried first)."""
    seen: dict[int, int] = {}
    ranks = []
    for parent in parents:
        ranks.append(seen.get(parent, 0))
        seen[parent] = ranks[-1] + 1
    return ranks


class TreeCostModel(CostModel):
    """CostModel for token trees: each round a depth d in 0..k_max and a node budget, from the past only.

    Acceptance is learned per (depth i, sibling rank r): c_{i,r} = P(the r-th child of a node at depth
    i - 1 is accepted | the walk reached that node and rejected its children 0..r-1), from the children
    tried in earlier rounds (accept_tree tries children in order and stops at the first accepted one),
    decayed by `decay` per round and shrunk towards c_{i,r-1} (r > 0), c_{i-1,0} or `prior` by one
    pseudo-trial. A node at depth i and rank r is on the accepted path with probability

        v(node) = v(parent) * prod_{r' < r} (1 - c_{i,r'}) * c_{i,r}        (v(root) = 1)

    so a kept subtree (closed under parents and earlier siblings) emits E = 1 + sum_kept v tokens in
    expectation. The shape of the next proposal is unknown before drafting; the model uses the last
    non-empty proposal's shape (a chain of k_max before any), extended by a chain under its deepest node
    up to k_max. Candidate trees are the prefixes of that shape in breadth_first order (depth, then
    drafter order); the prefix of N nodes has depth d = depth of its last node and costs
    C = T_pass(N + 1) + T_draft(d), T_draft(d) per level drafted ("per_token") or per call ("per_call").
    The round takes the (d, N) maximising E / C, N = 0 (a plain step) included.

    The drafter is then asked for depth d and its tree cut to its first N nodes in the same order
    (prune_tree). Both numbers are fixed before drafting and the cut keeps a node by its place in that
    order, which depends only on the nodes above it: why the acceptance rules stay exact is in prune_tree.
    """

    trees = True  # prices trees: a depth and a node budget per round

    def __init__(self, k_max: int = 8, draft_cost: DraftCost = "per_token", *, max_nodes: int = 64, **kwargs):
        super().__init__(k_max, draft_cost, **kwargs)
        if max_nodes < 1:
            raise ValueError(f"max_nodes (tree nodes per target pass) must be >= 1, got {max_nodes}")
        self.max_nodes = max_nodes
        self.trial_sum: dict[tuple[int, int], float] = {}  # (depth, rank) -> decayed accepted trials
        self.trial_weight: dict[tuple[int, int], float] = {}  # (depth, rank) -> decayed trials
        self.shape: list[int] = list(range(-1, k_max - 1))  # parents of the last non-empty proposal

    # measurements -----------------------------------------------------------------------------------

    def record_trials(self, trials: Sequence[tuple[int, int, bool]]) -> None:
        """One round: (depth, rank, accepted) of every child the walk tried."""
        for key in self.trial_weight:
            self.trial_sum[key] *= self.decay
            self.trial_weight[key] *= self.decay
        for depth, rank, accepted in trials:
            key = (depth, rank)
            self.trial_sum[key] = self.trial_sum.get(key, 0.0) + float(accepted)
            self.trial_weight[key] = self.trial_weight.get(key, 0.0) + 1.0

    def observe(self, round: ObservedRound) -> None:
        """A finished tree round: the shape of the drafter's proposal, the children the walk tried in the
        verified (kept) tree, and its draft and verify seconds."""
        self.round += 1
        proposed, kept = round.proposed.rows[0].parents.tolist(), round.verified.rows[0].parents.tolist()
        if round.choice.k and proposed:
            self.shape = proposed
        if round.timed:  # not a round that compiled a graph (specdec.decoding.Round.timed)
            if round.choice.k:
                self.record_draft(max(tree_depths(proposed), default=0), round.seconds["draft"])
            self.record_pass(len(kept) + 1, round.seconds["verify"])
        self.record_trials(walk_trials(kept, round.path[0]))

    # estimates --------------------------------------------------------------------------------------

    def child_acceptance(self, depth: int, rank: int) -> float:
        """c_{depth,rank}: decayed mean of past trials, shrunk towards its neighbour by one pseudo-trial."""
        if rank > 0:
            previous = self.child_acceptance(depth, rank - 1)
        else:
            previous = self.prior if depth == 1 else self.child_acceptance(depth - 1, 0)
        key = (depth, rank)
        return (self.trial_sum.get(key, 0.0) + previous) / (self.trial_weight.get(key, 0.0) + 1.0)

    def reach(self, parents: Sequence[int]) -> list[float]:
        """v(node) of every node of a tree given by its parents: the probability it is accepted."""
        depths, ranks = tree_depths(parents), sibling_ranks(parents)
        cache: dict[tuple[int, int], float] = {}

        def c(depth: int, rank: int) -> float:
            if (depth, rank) not in cache:
                cache[depth, rank] = self.child_acceptance(depth, rank)
            return cache[depth, rank]

        values: list[float] = []
        for parent, depth, rank in zip(parents, depths, ranks):
            miss = 1.0
            for earlier in range(rank):
                miss *= 1.0 - c(depth, earlier)
            values.append((1.0 if parent < 0 else values[parent]) * miss * c(depth, rank))
        return values

    def template(self) -> list[int]:
        """Parents of the tree the next proposal is expected to look like: the last one, extended by a
        chain under its deepest node to depth k_max."""
        parents = list(self.shape)
        depths = tree_depths(parents)
        deepest = max(range(len(parents)), key=lambda i: (depths[i], -i)) if parents else -1
        depth = depths[deepest] if parents else 0
        while depth < self.k_max:
            parents.append(deepest)
            deepest, depth = len(parents) - 1, depth + 1
        return parents

    # the rule ---------------------------------------------------------------------------------------

    def choose(self, limit: int, rows: int = 1, tokens: Tokens = None) -> Choice:
        """Depth and node budget for the next round (one row): depth at most `limit` (the budget) and k_max, at most
        max_nodes nodes. Reads only earlier rounds."""
        limit = min(limit, self.k_max)
        if not self.ready:  # warm-up: a plain step, then the deepest unpruned tree, until both are timed
            return Choice(limit, self.max_nodes) if 1 in self.pass_times and limit else Choice(0, 0)
        parents = self.template()
        depths, values = tree_depths(parents), self.reach(parents)
        best = Choice(0, 0, 1.0, self.pass_seconds(1))
        expected = 1.0
        for n, node in enumerate(breadth_first(depths)[: self.max_nodes], start=1):
            if depths[node] > limit:
                break
            expected += values[node]
            seconds = self.proposal_seconds(n + 1, depths[node])
            if expected / seconds > best.expected_tokens / best.seconds:
                best = Choice(depths[node], n, expected, seconds)
        return best


def walk_trials(parents: Sequence[int], path: Sequence[int]) -> list[tuple[int, int, bool]]:
    """(depth, rank, accepted) of every child accept_tree tried: at the root and at each accepted node, its
    children in order up to the accepted one (all of them when none was accepted)."""
    children = children_of(list(parents))
    trials, node, depth = [], -1, 0
    for step in [*path, None]:
        kids = children.get(node, [])
        for rank, kid in enumerate(kids):
            trials.append((depth + 1, rank, kid == step))
            if kid == step:
                break
        if step is None:
            break
        node, depth = step, depth + 1
    return trials
