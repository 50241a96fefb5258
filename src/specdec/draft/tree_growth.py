"""Growing a token tree from a drafter that gives next-token logits after any path (a small model, a trained head).

The drafter supplies `logits_after(sequence, path)` (its next-token logits (V,) after the sequence followed by the
path) and its tree shape: `branches[d]` children per node at depth d (the root is depth 0), `depth`, `nodes`, and
`mode`, how siblings are picked (specdec.verify.tree: DETERMINISTIC top-b by logit with one-hot q rows, IID draws
from q, DISTINCT draws without replacement). After the branching depths the most likely branch goes on as a chain.
"""

from __future__ import annotations

import torch

from ..checks import check_counts
from ..sampling import Sampling, probabilities, sample
from ..verify.tree import DETERMINISTIC, DISTINCT, IID
from .head import spread_over
from .tree import TreeDraft

CHILDREN = {"top": DETERMINISTIC, "iid": IID, "distinct": DISTINCT}  # how a drafter picks siblings


def tree_shape(branches, depth: int, nodes: int, children: str) -> tuple[tuple[int, ...], int]:
    """Refuse a bad tree shape (the error names the setting); the branches as a tuple and the children's mode."""
    if children not in CHILDREN:
        raise ValueError(f"children must be one of {sorted(CHILDREN)}, got {children!r}")
    check_counts(depth=depth, nodes=nodes)
    if isinstance(branches, (str, int)) or not len(branches):
        raise ValueError(f"branches must be a non-empty list of integers >= 1, got {branches!r}")
    check_counts(**{f"branches[{i}]": b for i, b in enumerate(branches)})
    return tuple(branches), CHILDREN[children]


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(n,) -> (n, V) rows of q for deterministic candidates."""
    q = torch.zeros(tokens.numel(), vocab_size, device=tokens.device)
    q[torch.arange(tokens.numel(), device=tokens.device), tokens] = 1.0
    return q


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
