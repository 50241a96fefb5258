"""Traversal verification for token trees (Weng, Hu, Chen, Liu, Mei, Qiu, Tian, Shi; NeurIPS 2025, arXiv
2505.12398): the tree is verified from the leaves back to the root, each path as a whole, instead of token
by token from the root down. On a chain it is block verification (Sun et al., specdec.BlockVerification).

Notation of Leviathan et al.: p target distribution, q draft distribution. The derivation below is this
repository's own (notebooks/01_derivation, section 11, walks through it and checks it by enumeration).

Every node u carries a weight w_u in [0, 1] and a distribution p_u over its next token: the root has w = 1
and p_u = the target's p after it; a child c of u with token x, drawn from the proposal q_c, gets

    w_c = min(1, w_u p_u(x) / q_c(x))        p_c = the target's p after c (one row of the verification pass)

where q_c is the draft's row for i.i.d. children, the draft's row without the earlier siblings for children
drawn without replacement, and the point mass at x for deterministic children (n-gram, top-b). The visit of
u tries its children in order, each child's subtree before the next child (post-order); when a child's
subtree accepts nothing, u's state becomes

    p_u := norm(max(0, w_u p_u - q_c))       w_u := s / (s + 1 - w_u),  s = sum_x max(0, w_u p_u(x) - q_c(x))

and the next child is tried from that state. Once every child of u has failed, u's own path is accepted with
probability w_u (always at the root) and the next token drawn from p_u. Invariant (by induction from the
leaves): for u reached by the draft, the visit of u's subtree accepts something and emits a continuation s
after u with probability w_u p_u(s_1) p(s_2.. | u, s_1), the target's continuation scaled by w_u. At the root
(w = 1, p_u = p) that is the target's distribution: the rule is exact. The update keeps the invariant
because a child drawn from q_c accepts, summed over its token x, min(w_u p_u(x), q_c(x)) of the mass, fails
with probability 1 - w_u + s, and leaves exactly max(0, w_u p_u - q_c) = (1 - w_u + s) w_u' p_u' to the rest
of the visit. On a chain the weights are block verification's and w_u' is its h_i: the same rule.

A subtree whose weight is 0 cannot accept; it is skipped, not visited (its failure still updates the parent).
At temperature 0 (one-hot p and greedy drafts) every weight is 0 or 1 and the rule accepts the path the
token-level rules accept.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..sampling import sample
from .base import AcceptanceRule
from .tree import DETERMINISTIC, DISTINCT, Tree, check_sibling_modes, children_of, normalise, without

# (w_u, p_u, q_c, x) -> (w_u', p_u'): u's state after its child with token x, drawn from q_c, accepted nothing
Update = Callable[[float, torch.Tensor, torch.Tensor, int], tuple[float, torch.Tensor]]


def child_weight(w: float, p_u: torch.Tensor, q_c: torch.Tensor, x: int) -> float:
    """w_c = min(1, w_u p_u(x) / q_c(x)); a drafted token has q_c(x) > 0 (else 1 if p_u(x) > 0, 0 if not)."""
    p_x, q_x = float(p_u[x]), float(q_c[x])  # the visit's host sync, one per child tried
    if q_x <= 0:
        return 1.0 if w * p_x > 0 else 0.0
    return min(1.0, w * p_x / q_x)


def after_failure(w: float, p_u: torch.Tensor, q_c: torch.Tensor, x: int) -> tuple[float, torch.Tensor]:
    """u's state once a child drawn from q_c accepted nothing: p_u := norm(max(0, w p_u - q_c)),
    w := s / (s + 1 - w). Where nothing is left to fail on (1 - w + s = 0 up to rounding) the state is kept."""
    r = (w * p_u - q_c).clamp_min(0.0)  # (V,)
    s = float(r.sum())
    rest = s + 1.0 - w
    if rest <= 0:
        return w, p_u
    return s / rest, normalise(r, p_u)


def proposal(q_row: torch.Tensor, mode: int, x: int, running: torch.Tensor | None) -> torch.Tensor:
    """The distribution child x was drawn from: q for i.i.d. children, q without the earlier siblings for
    distinct ones (running, built from the first distinct sibling's row), the point mass at x for
    deterministic ones."""
    if mode == DETERMINISTIC:
        return torch.nn.functional.one_hot(torch.tensor(x, device=q_row.device), q_row.numel()).to(q_row.dtype)
    if mode == DISTINCT and running is not None:
        return running
    return q_row


class TraversalVerification(AcceptanceRule):
    """Traversal verification as the loop's acceptance rule for token trees (and chains as trees)."""

    trees = True  # verifies token trees; the loop keeps per-pass tree sizes and depths

    def __init__(self, update: Update = after_failure):
        self.update = update  # injectable so that tests can show a wrong update caught; leave it at the default

    def accept(self, p: torch.Tensor, tree: Tree, generator: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
        """p (n+1, V): p[0] after the root, p[1+i] after node i. Returns the accepted node ids in path order and
        the next token (1,)."""
        children = children_of(tree.parents.tolist())
        tokens, modes = tree.tokens.tolist(), tree.modes.tolist()
        for kids in children.values():
            check_sibling_modes([modes[c] for c in kids])

        def visit(node: int, w: float, p_u: torch.Tensor) -> tuple[list[int], torch.Tensor] | None:
            running = None  # q without the earlier distinct siblings
            for c in children.get(node, []):
                x, mode = tokens[c], modes[c]
                q_c = proposal(tree.q[c], mode, x, running)
                w_c = child_weight(w, p_u, q_c, x)
                found = visit(c, w_c, p[c + 1]) if w_c > 0 else None
                if found is not None:
                    return [c] + found[0], found[1]
                w, p_u = self.update(w, p_u, q_c, x)
                running = without(q_c, x) if mode == DISTINCT else running
            if node == -1 or float(torch.rand((), generator=generator, device=p.device)) < w:
                return [], sample(p_u[None], generator)
            return None

        return visit(-1, 1.0, p[0])
