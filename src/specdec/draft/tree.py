"""Token trees: several candidate continuations verified in one target pass.

Notation of Leviathan et al.: p target distribution, q draft distribution. A draft tree holds n
tokens in topological order, each with its parent (-1 = the root, the last token already in the
sequence), the q row it was drawn from and how it was drawn (specdec.verify.tree's modes). One
target pass scores every node (specdec.draft.proposal.RowProposals.score): the queries are the root
followed by the n nodes, a 4D attention mask lets each node see the whole prefix, its ancestors and
itself, and a node's position id is the position of the root plus its depth (Miao et al. 2023,
SpecInfer). accept_tree walks the tree with the exact rules; afterwards the target's KV cache keeps
only the accepted path (CachedLM.keep), never the rejected branches.

How much to draft (k="auto", specdec.choose.tree_cost.TreeCostModel): each round a depth d and a node budget N are
chosen from earlier rounds only; the drafter is asked for depth d and its tree cut to its first N nodes
by depth, then drafter order (prune_tree). d = 0 is a plain target step that calls no drafter.

Sliding-window layers (Gemma2, Mistral, Qwen2) get their own mask, which also hides keys more than
a window behind each query, so trees are exact there too. Attention backends that take no 4D mask
(FlashAttention, flex attention) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..choose.tree_cost import breadth_first, tree_depths
from ..verify.tree import DETERMINISTIC, IID, MODE_NAMES, children_of


@dataclass
class TreeDraft:
    """A draft tree of n nodes in topological order; a chain has parents [-1, 0, 1, ..., n-2]."""

    tokens: torch.Tensor  # (n,) long
    parents: torch.Tensor  # (n,) long, parents[i] in {-1, 0, ..., i-1}
    q: torch.Tensor  # (n, V) the row of q node i was drawn from (one-hot for deterministic candidates)
    modes: torch.Tensor  # (n,) long: DETERMINISTIC, IID or DISTINCT
    forwards: int = 0  # draft-model passes spent

    @property
    def size(self) -> int:
        return self.tokens.numel()

    def depths(self) -> list[int]:
        """Depth of each node: 1 for the root's children."""
        return tree_depths(self.parents.tolist())

    @property
    def is_chain(self) -> bool:
        """Whether every node's parent is the node before it (a chain, scored with a causal mask)."""
        return self.parents.tolist() == list(range(-1, self.size - 1))

    def check(self) -> None:
        """A valid tree (check_tree) unless empty (a plain step)."""
        if self.size:
            check_tree(self)

    def overlaps(self, p: torch.Tensor, path: list[int]) -> torch.Tensor:
        return path_overlaps(p, self, path)

    def ancestors(self) -> torch.Tensor:
        """(n, n) bool: [i, j] is True when node j is node i or one of its ancestors."""
        return ancestry(self.parents.tolist()).to(self.tokens.device)


def ancestry(parents: list[int]) -> torch.Tensor:
    """(n, n) bool: [i, j] when node j is node i or one of its ancestors (parents in topological order, -1: the
    root)."""
    seen = torch.eye(len(parents), dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            seen[i] |= seen[parent]
    return seen


def empty_tree(vocab_size: int, device: torch.device | str) -> TreeDraft:
    """A tree without nodes: the round becomes a plain target step."""
    none = torch.zeros(0, dtype=torch.long, device=device)
    return TreeDraft(none, none.clone(), torch.zeros(0, vocab_size, device=device), none.clone())


def chain(tokens: torch.Tensor, q: torch.Tensor, mode: int = IID, forwards: int = 0) -> TreeDraft:
    """The tree of a chain draft x_1..x_k (k,) with rows q (k, V); IID with one child is Leviathan's rule."""
    k = tokens.numel()
    parents = torch.arange(-1, k - 1, device=tokens.device)
    modes = torch.full((k,), mode, dtype=torch.long, device=tokens.device)
    return TreeDraft(tokens, parents, q, modes, forwards)


def merge(trees: list[TreeDraft]) -> TreeDraft:
    """One tree holding every given tree under the same root, their root children in the order given."""
    parents, start = [], 0
    for tree in trees:
        parents.append(torch.where(tree.parents >= 0, tree.parents + start, tree.parents))
        start += tree.size
    return TreeDraft(
        torch.cat([t.tokens for t in trees]),
        torch.cat(parents),
        torch.cat([t.q for t in trees]),
        torch.cat([t.modes for t in trees]),
        sum(t.forwards for t in trees),
    )


def check_tree(tree: TreeDraft, max_nodes: int | None = None) -> None:
    """A non-empty tree in topological order with consistent shapes, no wider than the pass limit."""
    n = tree.size
    if n == 0:
        raise ValueError("the tree is empty: verify at least one node, or take a plain target step instead")
    if tree.parents.shape != (n,) or tree.modes.shape != (n,) or tree.q.dim() != 2 or tree.q.shape[0] != n:
        raise ValueError(
            f"tree fields disagree: tokens {tuple(tree.tokens.shape)}, parents {tuple(tree.parents.shape)}, "
            f"modes {tuple(tree.modes.shape)}, q {tuple(tree.q.shape)}; need (n,), (n,), (n,), (n, V)"
        )
    parents = tree.parents.tolist()
    bad = [i for i, parent in enumerate(parents) if not -1 <= parent < i]
    if bad:
        i = bad[0]
        raise ValueError(
            f"node {i} has parent {parents[i]}: a parent must be -1 (the root) or an earlier node 0..{i - 1} "
            "(nodes in topological order)"
        )
    unknown = set(tree.modes.tolist()) - set(MODE_NAMES)
    if unknown:
        raise ValueError(f"unknown tree modes {sorted(unknown)}; choices: {MODE_NAMES}")
    if max_nodes is not None and n > max_nodes:
        raise ValueError(
            f"the tree has {n} nodes but the pass limit is max_nodes={max_nodes}: lower the drafter's node "
            "budget or raise max_nodes"
        )


def prune_tree(tree: TreeDraft, depth: int, nodes: int) -> TreeDraft:
    """The tree cut to depth <= `depth` and then to its first `nodes` nodes in breadth_first order (depth, then
    drafter order), node ids renumbered in their original order (still topological).

    The kept nodes form a subtree: each kept node's parent is shallower and its earlier siblings come before
    it at the same depth, so they are kept too; every node keeps its own q row and mode.

    Why the rules stay exact when depth and nodes are fixed before drafting: a node's place in the order
    depends only on how many nodes lie at smaller depths and which nodes precede it at its own depth, never
    on its own token or anything drafted below it. So at every node u, which of u's children are kept is
    decided by the tree above them (u's path and the nodes beside it), not by the children's draws. Given
    u's path, the kept children are therefore drawn as their mode says: deterministic candidates stay
    candidates fixed before p is seen; i.i.d. children stay i.i.d. draws from q; for children drawn without
    replacement the kept ones are the first draws in draw order, and the first j draws without replacement
    have the same law whether or not more draws follow, with the same rows q_1..q_j (recursive rejection
    sampling only uses the rows of the children it tries). Cutting siblings by anything that looks at their
    tokens (say, keep the likely ones) would break this; so would a drafter that orders nodes of one depth by
    their own tokens, which none of specdec.draft.trees does.
    """
    depths = tree.depths()
    keep = sorted([i for i in breadth_first(depths) if depths[i] <= depth][: max(0, nodes)])
    if len(keep) == tree.size:
        return tree
    new_id = {old: new for new, old in enumerate(keep)}
    parents = [new_id[p] if p >= 0 else -1 for p in tree.parents[keep].tolist()]
    index = torch.tensor(keep, dtype=torch.long, device=tree.tokens.device)
    return TreeDraft(
        tree.tokens[index],
        torch.tensor(parents, dtype=torch.long, device=tree.tokens.device),
        tree.q[index],
        tree.modes[index],
        tree.forwards,
    )


def path_overlaps(p: torch.Tensor, tree: TreeDraft, path: list[int]) -> torch.Tensor:
    """beta = sum_x min(p, q) at each node the walk visited (the root, then the accepted nodes) that has
    children, with q the row of its first sampled child, or of its first child when all are deterministic
    (one-hot: beta = p(x), as for a lookup chain). (visited,), on the device.

    This is Leviathan's alpha for the draft model's first try at each depth on the output path, comparable
    with a chain's. For a tree of deterministic candidates only (n-gram tries) it is p of the first
    candidate, which measures the lookup, not a draft distribution."""
    children = children_of(tree.parents.tolist())
    modes = tree.modes.tolist()
    rows, nodes = [], []
    for node in [-1, *path]:
        kids = children.get(node)
        if kids:
            sampled = [c for c in kids if modes[c] != DETERMINISTIC]
            rows.append((sampled or kids)[0])
            nodes.append(node + 1)
    if not rows:
        return torch.zeros(0, device=p.device)
    q = tree.q[rows].to(p.device)  # (visited, V)
    return torch.minimum(p[nodes], q).sum(dim=-1)
