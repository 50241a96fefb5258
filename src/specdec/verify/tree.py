"""Exact acceptance rules for token trees: walk from the root, try each node's children in order.

Notation of Leviathan et al.: p target distribution, q draft distribution. At a node the target's
distribution p is known (one row of the verification pass); its children x_1..x_m are tried in order.
Each child is accepted with a probability a_i computed from the current p; on rejection p is replaced
by a residual and the next child is tried. After the last rejection the next token is drawn from the
final residual; an accepted child becomes the new node. Three rules, by how the children were drafted:

- DETERMINISTIC (n-gram candidates, top-b by rank): a_i = p(x_i); on rejection p(x_i) := 0, renormalise.
- IID (children drawn i.i.d. from q; SpecInfer's multi-step speculative sampling, Miao et al. 2023,
  arXiv 2305.09781): a_i = min(1, p(x_i) / q(x_i)); on rejection p := norm(max(0, p - q)).
- DISTINCT (children drawn from q without replacement; recursive rejection sampling, Jeon et al. 2024,
  arXiv 2402.14160): a_i = min(1, p(x_i) / q_i(x_i)); on rejection p := norm(max(0, p - q_i)) and
  q_{i+1} := q_i without x_i, renormalised (q_1 = q).

A node may hold deterministic children first and then sampled ones (a hybrid tree): the sampled ones
are tried on the residual the deterministic rejections left. Each rule emits exactly p from any
starting p, so the whole walk emits the target's distribution (derivations in notebooks/01_derivation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from ..sampling import sample
from .base import AcceptanceRule

DETERMINISTIC, IID, DISTINCT = 0, 1, 2
MODE_NAMES = {DETERMINISTIC: "deterministic", IID: "iid", DISTINCT: "distinct"}


class Tree(Protocol):
    """What accept_tree reads from a draft tree (specdec.draft.tree.TreeDraft has these fields)."""

    tokens: torch.Tensor  # (n,) long, nodes in topological order
    parents: torch.Tensor  # (n,) long, -1 = the root (the last token already in the sequence)
    q: torch.Tensor  # (n, V) the q row each node was drawn from
    modes: torch.Tensor  # (n,) long: DETERMINISTIC, IID or DISTINCT


# (p, tokens, q rows, modes) of one node's children -> (acceptance probabilities (m,), targets (m+1, V))
SiblingRule = Callable[[torch.Tensor, list[int], torch.Tensor, list[int]], tuple[torch.Tensor, torch.Tensor]]


def children_of(parents: list[int]) -> dict[int, list[int]]:
    """Children of every node in sibling order; key -1 is the root, nodes without children are absent."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    return children


def normalise(r: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """r / sum(r), or fallback when r has no mass left; no host sync."""  # (V,)
    total = r.sum()
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), fallback)


def ratio(p: torch.Tensor, q: torch.Tensor, x: int) -> torch.Tensor:
    """min(1, p(x) / q(x)); a drawn token has q(x) > 0, q(x) = 0 gives 1 if p(x) > 0 else 0 (no division by 0)."""
    safe = torch.where(q[x] > 0, q[x], torch.ones_like(q[x]))
    return torch.where(q[x] > 0, (p[x] / safe).clamp_max(1.0), (p[x] > 0).to(p.dtype))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); p itself when p == q up to rounding, as specdec.verify.token.residual."""  # (V,)
    return normalise((p - q).clamp_min(0.0), p)


def without(q: torch.Tensor, x: int) -> torch.Tensor:
    """q with token x removed, renormalised (all zeros if x held all the mass: nothing else can be drawn)."""
    r = q.clone()
    r[x] = 0.0
    return normalise(r, r)


def deterministic_rule(p: torch.Tensor, x: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate x chosen without sampling: accept w.p. p(x); on rejection p(x) := 0, renormalised."""
    r = p.clone()
    r[x] = 0.0
    return p[x], normalise(r, p)


def iid_rule(p: torch.Tensor, q: torch.Tensor, x: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x ~ q i.i.d. with its siblings (SpecInfer): accept w.p. min(1, p(x)/q(x)); on rejection norm(max(0, p - q))."""
    return ratio(p, q, x), residual(p, q)


def distinct_rule(
    p: torch.Tensor, q_i: torch.Tensor, x: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x ~ q_i, the draft without the earlier siblings (recursive rejection sampling): accept w.p.
    min(1, p(x)/q_i(x)); on rejection p := norm(max(0, p - q_i)) and q_{i+1} := q_i without x."""
    return ratio(p, q_i, x), residual(p, q_i), without(q_i, x)


def check_sibling_modes(modes: list[int]) -> None:
    """Deterministic children first, then sampled children that all share one mode."""
    sampled = [m for m in modes if m != DETERMINISTIC]
    if any(m not in MODE_NAMES for m in modes):
        raise ValueError(f"tree modes must be {MODE_NAMES}, got {modes}")
    if modes[len(modes) - len(sampled) :] != sampled or len(set(sampled)) > 1:
        names = [MODE_NAMES[m] for m in modes]
        raise ValueError(
            f"siblings must be deterministic children first, then sampled children of one mode; got {names}"
        )


def siblings(
    p: torch.Tensor, tokens: list[int], q: torch.Tensor, modes: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact rule for one node's children x_1..x_m, tried in order.

    p (V,) is the target after the node, q (m, V) the rows the children were drawn from. Returns a (m,),
    a_i = P(accept x_i | x_1..x_{i-1} rejected), and targets (m+1, V): targets[i] is the p in force
    when x_{i+1} is tried, targets[m] the residual the next token is drawn from when all are rejected.
    For DISTINCT children the q_i are built from the first sampled sibling's row, so rows holding
    q or holding q_i give the same result.
    """
    check_sibling_modes(modes)
    accept, targets = [], [p]
    q_i = None
    for x, q_row, mode in zip(tokens, q, modes):
        if mode == DETERMINISTIC:
            a, p = deterministic_rule(p, x)
        elif mode == IID:
            a, p = iid_rule(p, q_row, x)
        else:
            a, p, q_i = distinct_rule(p, q_row if q_i is None else q_i, x)
        accept.append(a)
        targets.append(p)
    return torch.stack(accept), torch.stack(targets)


def first_accepted(a: torch.Tensor, generator: torch.Generator | None) -> int:
    """Index of the first child whose uniform falls below its acceptance probability, or len(a)."""
    u = torch.rand(a.shape, generator=generator, device=a.device, dtype=a.dtype)  # (m,) one per child
    kept = torch.cat([u < a, torch.ones(1, dtype=torch.bool, device=a.device)])  # (m+1,) sentinel: none
    return int(kept.long().argmax())  # the node's one host sync


def accept_tree(
    p: torch.Tensor, tree: Tree, generator: torch.Generator | None, *, rule: SiblingRule = siblings
) -> tuple[list[int], torch.Tensor]:
    """Walk from the root, trying each node's children with the rule of their mode.

    p (n+1, V): p[0] the target after the root, p[1+i] after node i. Returns the accepted node ids in
    path order (possibly empty) and the next token (1,): drawn from the residual left at the last
    accepted node when all its children are rejected, or from p of a leaf (the bonus token).
    `rule` exists so that tests can show a wrong rule being caught; leave it at the default.
    """
    children = children_of(tree.parents.tolist())
    tokens, modes = tree.tokens.tolist(), tree.modes.tolist()
    path: list[int] = []
    node = -1
    while node in children:
        kids = children[node]
        a, targets = rule(p[node + 1], [tokens[c] for c in kids], tree.q[kids], [modes[c] for c in kids])
        j = first_accepted(a, generator)
        if j == len(kids):
            return path, sample(targets[j][None], generator)
        node = kids[j]
        path.append(node)
    return path, sample(p[node + 1][None], generator)


class TreeRules(AcceptanceRule):
    """The exact tree rules as the decoding loop's acceptance rule: accept_tree on a tree (or a chain, whose
    i.i.d. children make it Leviathan's rule, one host sync per accepted node)."""

    trees = True  # the loop keeps per-pass tree sizes and depths

    def __init__(self, rule: SiblingRule = siblings):
        self.rule = rule

    def accept(self, p: torch.Tensor, tree: Tree, generator: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
        return accept_tree(p, tree, generator, rule=self.rule)
