"""Exact distributions of traversal verification on tiny toy pairs, by enumeration.
"""

from __future__ import annotations

import functools

import torch

from ..verify.tree import DISTINCT, without
from .chains import Conditional, target_sequence_distribution
from .trees import Branching, top_ranked, toy_tree


def traversal_round_distribution(
    p_of: Conditional, q_of: Conditional, shape: list[Branching], n_tokens: int, update: object = None
) -> torch.Tensor:
    """Exact probability (V^n,) of the first n tokens emitted from a tree of the given shape verified with
    traversal verification (specdec.verify.traversal) and its `update` (default: after_failure), enumerating the
    drafted children and every accept/reject the way the visit makes them.

    Tokens after the round come from the target, as tree_round_distribution's. Equals
    target_sequence_distribution iff the update is exact.
    """
    from ..verify.traversal import (  # the library's own steps; the visit order is here
        after_failure,
        child_weight,
    )

    update = update or after_failure
    vocab = p_of(()).numel()

    @functools.cache
    def after(prefix: tuple[int, ...]) -> torch.Tensor:
        return target_sequence_distribution(p_of, max(n_tokens - len(prefix), 0), prefix)

    def stop(prefix: tuple[int, ...], w: float, p_u: torch.Tensor) -> torch.Tensor:  # u accepted, next ~ p_u
        if len(prefix) >= n_tokens:
            return torch.tensor([w], dtype=torch.float64)
        return w * torch.cat([p_u[y] * after(prefix + (y,)) for y in range(vocab)])

    def visit(prefix: tuple[int, ...], w: float, p_u: torch.Tensor, i: int, running: torch.Tensor) -> torch.Tensor:
        """What u's subtree emits from its i-th child on, in state (w, p_u): a sub-distribution whose mass is
        the probability that it accepts something."""
        depth = len(prefix)
        branching = shape[depth] if depth < len(shape) else Branching()
        top = top_ranked(q_of(prefix), branching.deterministic)
        size = vocab ** max(n_tokens - depth, 0)
        if w == 0:
            return torch.zeros(size, dtype=torch.float64)
        if i == len(top) + branching.sampled or (i >= len(top) and running.sum() <= 0):
            return stop(prefix, w, p_u)
        if i < len(top):
            x = top[i]
            draws = [(1.0, x, torch.nn.functional.one_hot(torch.tensor(x), vocab).double(), running)]
        else:
            rest = (lambda x: without(running, x)) if branching.mode == DISTINCT else (lambda x: running)
            draws = [(float(running[x]), x, running, rest(x)) for x in range(vocab) if running[x] > 0]
        out = torch.zeros(size, dtype=torch.float64)
        for weight, x, q_c, running_next in draws:
            w_c = child_weight(w, p_u, q_c, x)
            child = visit(prefix + (x,), w_c, p_of(prefix + (x,)), 0, q_of(prefix + (x,)))
            if depth < n_tokens:
                out.view(vocab, -1)[x] += weight * child
            else:
                out += weight * child
            w_next, p_next = update(w, p_u, q_c, x)
            out += weight * (1 - float(child.sum())) * visit(prefix, w_next, p_next, i + 1, running_next)
        return out

    return visit((), 1.0, p_of(()), 0, q_of(()))


def traversal_round(
    p_of: Conditional, q_of: Conditional, shape: list[Branching], generator: torch.Generator | None, update: object = None
) -> torch.Tensor:
    """One round on a freshly drafted toy tree with specdec.TraversalVerification; the emitted tokens."""
    from ..verify.traversal import TraversalVerification, after_failure

    p, tree = toy_tree(p_of, q_of, shape, generator)  # (n+1, V)
    path, next_token = TraversalVerification(update or after_failure).accept(p, tree, generator)
    return torch.cat([tree.tokens[path], next_token])


def traversal_outcomes(p: torch.Tensor, tree: object, update: object = None) -> list[tuple[list[int], torch.Tensor]]:
    """Every way traversal verification can end on one drafted tree, p (n+1, V): (accepted node ids, next token
    sub-distribution (V,)), the vector's mass the probability of stopping on that path."""
    from ..verify.traversal import after_failure, child_weight, proposal
    from ..verify.tree import children_of

    update = update or after_failure
    children, tokens, modes = children_of(tree.parents.tolist()), tree.tokens.tolist(), tree.modes.tolist()

    def visit(u: int, w: float, p_u: torch.Tensor) -> list[tuple[list[int], torch.Tensor]]:
        """u's subtree from state (w, p_u): its outcomes, with masses summing to P(it accepts something)."""
        out, fails, running = [], 1.0, None
        for c in children.get(u, []):
            q_c = proposal(tree.q[c], modes[c], tokens[c], running)
            w_c = child_weight(w, p_u, q_c, tokens[c])
            below = visit(c, w_c, p[c + 1]) if w_c > 0 else []
            out += [([c] + path, fails * mass) for path, mass in below]
            fails *= 1 - sum(float(mass.sum()) for _, mass in below)
            w, p_u = update(w, p_u, q_c, tokens[c])
            running = without(q_c, tokens[c]) if modes[c] == DISTINCT else running
        return out + [([], fails * (1.0 if u == -1 else w) * p_u)]

    return visit(-1, 1.0, p[0])


def expected_accepted_traversal(p: torch.Tensor, tree: object, update: object = None) -> float:
    """Exact expected number of draft tokens traversal verification accepts on one drafted tree, p (n+1, V)."""
    return sum(len(path) * float(mass.sum()) for path, mass in traversal_outcomes(p, tree, update))
