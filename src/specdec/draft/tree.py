"""Token trees: several candidate continuations verified in one target pass; how a tree is cut and grown.

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

Growing a tree (grow_tree) from a drafter that gives next-token logits after any path (a small model, a
trained head): the drafter supplies `logits_after(sequence, path)` (its next-token logits (V,) after the
sequence followed by the path) and its tree shape: `branches[d]` children per node at depth d (the root is
depth 0), `depth`, `nodes`, and `mode`, how siblings are picked (DETERMINISTIC top-b by logit with one-hot q
rows, IID draws from q, DISTINCT draws without replacement). After the branching depths the most likely branch
goes on as a chain.

The tree drafters live with their chain families: NGramTreeDrafter in specdec.draft.ngram, ModelTreeDrafter
and HybridTreeDrafter in specdec.draft.model, HeadTreeDrafter in specdec.draft.head_drafter, and
ChainTreeDrafter (any chain drafter as a tree drafter) in specdec.draft.base.

Sliding-window layers (Gemma2, Mistral, Qwen2) get their own mask, which also hides keys more than
a window behind each query, so trees are exact there too. Attention backends that take no 4D mask
(FlashAttention, flex attention) are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..checks import check_counts
from ..sampling import Sampling, probabilities, sample
from ..verify.tree import DETERMINISTIC, DISTINCT, IID, MODE_NAMES, children_of
from .head import spread_over

CHILDREN = {"top": DETERMINISTIC, "iid": IID, "distinct": DISTINCT}  # how a drafter picks siblings


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


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (1 for the root's children) from its parent ids (-1 = the root)."""
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


def breadth_first(depths: Sequence[int]) -> list[int]:
    """Node ids sorted by (depth, drafter order): every prefix is a subtree holding each kept node's parent
    and earlier siblings (parents are shallower, earlier siblings have smaller ids at the same depth)."""
    return sorted(range(len(depths)), key=lambda i: (depths[i], i))


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


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(n,) -> (n, V) rows of q for deterministic candidates."""
    q = torch.zeros(tokens.numel(), vocab_size, device=tokens.device)
    q[torch.arange(tokens.numel(), device=tokens.device), tokens] = 1.0
    return q


def deterministic_tree(tokens: list[int], parents: list[int], vocab_size: int, device: torch.device) -> TreeDraft:
    ids = torch.tensor(tokens, dtype=torch.long, device=device)
    modes = torch.full((len(tokens),), DETERMINISTIC, dtype=torch.long, device=device)
    return TreeDraft(ids, torch.tensor(parents, dtype=torch.long, device=device), one_hot(ids, vocab_size), modes)


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
    their own tokens, which none of specdec's tree drafters does.
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


def tree_shape(branches, depth: int, nodes: int, children: str) -> tuple[tuple[int, ...], int]:
    """Refuse a bad tree shape (the error names the setting); the branches as a tuple and the children's mode."""
    if children not in CHILDREN:
        raise ValueError(f"children must be one of {sorted(CHILDREN)}, got {children!r}")
    check_counts(depth=depth, nodes=nodes)
    if isinstance(branches, (str, int)) or not len(branches):
        raise ValueError(f"branches must be a non-empty list of integers >= 1, got {branches!r}")
    check_counts(**{f"branches[{i}]": b for i, b in enumerate(branches)})
    return tuple(branches), CHILDREN[children]


def pick_children(logits: torch.Tensor, b: int, mode: int, sampling: Sampling, vocab_size: int, generator) -> tuple:
    """b children of one node: tokens (b',), q rows (b', V); b' < b when q has fewer tokens to draw."""
    logits = logits[:vocab_size]
    if mode == DETERMINISTIC:
        tokens = logits.topk(min(b, int(torch.isfinite(logits).sum()))).indices
        return tokens, one_hot(tokens, vocab_size)
    q = probabilities(logits, sampling)  # (V,)
    if mode == IID:
        return sample(q.expand(b, -1), generator), q.expand(b, -1)
    tokens, rows = [], []
    for _ in range(min(b, int((q > 0).sum()))):  # without replacement: q_{i+1} = q_i without x_i
        x = sample(q[None], generator)
        tokens.append(x)
        rows.append(q)
        q = q.clone()
        q[x] = 0.0
        q = q / q.sum()
    return torch.cat(tokens), torch.stack(rows)


class Growth:
    """A tree being grown: nodes in order with their parents, q rows and modes; each node's path and score (the
    draft's log-probability of its path)."""

    def __init__(self):
        self.tokens, self.parents, self.rows, self.modes = [], [], [], []
        self.paths, self.score = {-1: []}, {-1: 0.0}

    def add(self, parent: int, token: int, row: torch.Tensor, mode: int, logq: float) -> int:
        node = len(self.tokens)
        self.paths[node] = self.paths[parent] + [token]
        self.score[node] = self.score[parent] + logq
        self.tokens.append(token)
        self.parents.append(parent)
        self.rows.append(row)
        self.modes.append(mode)
        return node

    def tree(self, forwards: int, vocab_size: int, device: torch.device, ids: torch.Tensor | None = None
             ) -> TreeDraft:
        """The tree; its q rows spread from the draft vocabulary `ids` onto the whole vocabulary (None: they are)."""
        rows = torch.stack(self.rows).to(device) if self.rows else torch.zeros(0, vocab_size, device=device)
        return TreeDraft(
            torch.tensor(self.tokens, dtype=torch.long, device=device),
            torch.tensor(self.parents, dtype=torch.long, device=device),
            rows if ids is None or not self.rows else spread_over(ids, rows, vocab_size),
            torch.tensor(self.modes, dtype=torch.long, device=device),
            forwards,
        )


def grow_tree(drafter, sequence: torch.Tensor, depth: int, sampling: Sampling, vocab_size: int,
              generator: torch.Generator | None) -> TreeDraft:
    """The drafter's tree after sequence (1, L): branching for len(drafter.branches) depths, then the most likely
    branch as a chain, at most drafter.nodes nodes and `depth` depth. A drafter with `draft_ids(vocab_size)` (its
    draft vocabulary S, outside which q is 0) gives logits on S alone, and the tree is grown there: the same tree
    without a pass over the whole vocabulary per node."""
    ids = drafter.draft_ids(vocab_size) if hasattr(drafter, "draft_ids") else None
    token = (lambda x: x) if ids is None else (lambda x: int(ids[x]))  # a draft index -> its token id
    width = vocab_size if ids is None else ids.numel()
    g, frontier, forwards = Growth(), [-1], 0
    for level in range(min(len(drafter.branches), depth)):
        grown = []
        for node in frontier:
            room = drafter.nodes - len(g.tokens)
            if room <= 0:
                break
            logits = drafter.logits_after(sequence, g.paths[node])
            forwards += 1
            picked, q = pick_children(logits, min(drafter.branches[level], room), drafter.mode, sampling, width,
                                      generator)
            logq = logits[:width].float().log_softmax(-1)
            grown += [g.add(node, token(x), row, drafter.mode, float(logq[x])) for x, row in zip(picked.tolist(), q)]
        frontier = grown
    if frontier:  # extend the most likely branch as a chain: one child per node
        parent = max(frontier, key=g.score.get)
        while len(g.paths[parent]) < depth and len(g.tokens) < drafter.nodes:
            logits = drafter.logits_after(sequence, g.paths[parent])
            forwards += 1
            picked, q = pick_children(logits, 1, drafter.mode, sampling, width, generator)
            parent = g.add(parent, token(int(picked[0])), q[0], drafter.mode, 0.0)
    return g.tree(forwards, vocab_size, sequence.device, ids)
