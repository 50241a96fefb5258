"""Exact distributions of token-tree rounds on tiny toy pairs, by enumeration.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from ..sampling import Sampling, probabilities, sample
from ..verify.tree import DETERMINISTIC, DISTINCT, IID, SiblingRule, accept_tree, iid_rule, siblings, without
from .chains import Conditional, sequence_index, target_sequence_distribution


@dataclass(frozen=True)
class Branching:
    """How every node at one depth of a toy tree drafts its children: first the `deterministic` tokens
    ranked highest by q (top-b), then `sampled` children drawn from q i.i.d. (IID) or without
    replacement (DISTINCT, stopping early if q runs out of tokens)."""

    deterministic: int = 0
    sampled: int = 0
    mode: int = IID


def toy_pair(
    seed: int, vocab: int, sampling: Sampling, noise: float = 1.0
) -> tuple[Conditional, Conditional]:
    """Random target p(. | prefix) and a draft q with `noise` extra logit noise, both processed by sampling.

    Each prefix gets its own logits (seeded by seed and the prefix); rows are float64 and sum to 1.
    """

    @functools.cache
    def pair(prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(
            seed * 1_000_003 + 10_007 * len(prefix) + sequence_index(torch.tensor(prefix), vocab)
        )
        z = 2.0 * torch.randn(vocab, generator=g)  # (V,) target logits
        z_draft = z + noise * torch.randn(vocab, generator=g)
        probs = probabilities(torch.stack([z, z_draft]), sampling).double()  # (2, V)
        return tuple(probs / probs.sum(-1, keepdim=True))

    return (lambda prefix: pair(prefix)[0]), (lambda prefix: pair(prefix)[1])


def top_ranked(q: torch.Tensor, b: int) -> list[int]:
    """The b tokens with the largest q (ties by token id): deterministic top-b children."""
    return torch.argsort(q, descending=True, stable=True)[:b].tolist()


def children_draws(q: torch.Tensor, branching: Branching) -> list[tuple[float, list[int], list[int]]]:
    """Every way a node drafts its children, as (probability, tokens, modes); q (V,)."""
    top = top_ranked(q, branching.deterministic)
    draws: list[tuple[float, list[int]]] = [(1.0, [])]
    q_i = [q] * len(draws)
    for _ in range(branching.sampled):
        grown, grown_q = [], []
        for (w, xs), q_cur in zip(draws, q_i):
            if q_cur.sum() <= 0:  # DISTINCT drew every token q allows: no more children
                grown, grown_q = grown + [(w, xs)], grown_q + [q_cur]
                continue
            for x in range(q.numel()):
                if q_cur[x] > 0:
                    grown.append((w * float(q_cur[x]), xs + [x]))
                    grown_q.append(without(q_cur, x) if branching.mode == DISTINCT else q_cur)
        draws, q_i = grown, grown_q
    return [(w, top + xs, [DETERMINISTIC] * len(top) + [branching.mode] * len(xs)) for w, xs in draws]


def tree_round_distribution(
    p_of: Conditional, q_of: Conditional, shape: list[Branching], n_tokens: int, rule: SiblingRule = siblings
) -> torch.Tensor:
    """Exact probability (V^n,) of the first n tokens emitted from a tree of the given shape (one
    Branching per depth) verified with rule, enumerating the drafted children and every accept/reject.

    Tokens after the round (a rejection or a leaf's bonus ends it) come from the target, as an exact next
    round would emit them. Every child's q row is the draft's q: the correct rule ignores it for
    deterministic children, the wrong rule uses it. Equals target_sequence_distribution iff rule is exact.
    """
    vocab = p_of(()).numel()

    @functools.cache
    def after(prefix: tuple[int, ...]) -> torch.Tensor:  # the rest of the n tokens once the round ended
        return target_sequence_distribution(p_of, n_tokens - len(prefix), prefix)

    @functools.cache
    def node(prefix: tuple[int, ...]) -> torch.Tensor:  # (V^(n - len(prefix)),) from the node at prefix
        depth = len(prefix)
        if depth == n_tokens:
            return torch.ones(1, dtype=torch.float64)
        if depth == len(shape) or shape[depth].deterministic + shape[depth].sampled == 0:
            return after(prefix)  # a leaf: the bonus token comes from p
        p, q = p_of(prefix), q_of(prefix)  # (V,), (V,)
        out = torch.zeros(vocab, vocab ** (n_tokens - depth - 1), dtype=torch.float64)
        for w, tokens, modes in children_draws(q, shape[depth]):
            a, targets = rule(p, tokens, q.expand(len(tokens), -1), modes)  # (m,), (m+1, V)
            reach = w  # P(this draw, and every child before x_i rejected)
            for a_i, x in zip(a, tokens):
                out[x] += reach * a_i * node(prefix + (x,))
                reach = reach * (1 - a_i)
            out += reach * targets[-1][:, None] * torch.stack([after(prefix + (y,)) for y in range(vocab)])
        return out.flatten()

    return node(())


def toy_tree(
    p_of: Conditional, q_of: Conditional, shape: list[Branching], generator: torch.Generator | None
) -> tuple[torch.Tensor, SimpleNamespace]:
    """Draft one random tree of the given shape; returns p (n+1, V) and the tree (tokens, parents, q, modes)."""
    tokens, parents, rows, modes, prefixes = [], [], [], [], [()]

    def grow(node: int, prefix: tuple[int, ...]) -> None:
        depth = len(prefix)
        if depth == len(shape):
            return
        q = q_of(prefix)  # (V,)
        kids = top_ranked(q, shape[depth].deterministic)
        q_cur = q
        for _ in range(shape[depth].sampled):
            if q_cur.sum() <= 0:
                break
            x = int(sample(q_cur[None], generator))
            kids.append(x)
            q_cur = without(q_cur, x) if shape[depth].mode == DISTINCT else q_cur
        n_top = shape[depth].deterministic
        for i, x in enumerate(kids):
            tokens.append(x)
            parents.append(node)
            rows.append(q)
            modes.append(DETERMINISTIC if i < n_top else shape[depth].mode)
            prefixes.append(prefix + (x,))
        first = len(tokens) - len(kids)
        for i, x in enumerate(kids):
            grow(first + i, prefix + (x,))

    grow(-1, ())
    tree = SimpleNamespace(  # duck-typed like specdec.draft.tree.TreeDraft: what accept_tree reads
        tokens=torch.tensor(tokens, dtype=torch.long),  # (n,)
        parents=torch.tensor(parents, dtype=torch.long),  # (n,) each parent before its children
        q=torch.stack(rows) if rows else torch.zeros(0, p_of(()).numel(), dtype=torch.float64),  # (n, V)
        modes=torch.tensor(modes, dtype=torch.long),  # (n,)
    )
    return torch.stack([p_of(prefix) for prefix in prefixes]), tree


def tree_round(
    p_of: Conditional,
    q_of: Conditional,
    shape: list[Branching],
    generator: torch.Generator | None,
    rule: SiblingRule = siblings,
) -> torch.Tensor:
    """One round on a freshly drafted toy tree with specdec.verify.tree.accept_tree; the emitted tokens."""
    p, tree = toy_tree(p_of, q_of, shape, generator)  # (n+1, V)
    path, next_token = accept_tree(p, tree, generator, rule=rule)
    return torch.cat([tree.tokens[path], next_token])


def wrong_iid_rule_with_original_q(
    p: torch.Tensor, tokens: list[int], q: torch.Tensor, modes: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """WRONG on purpose, to show that the tests can tell: SpecInfer's i.i.d. rule applied to every child
    with its stored q row, whatever its mode. Exact for i.i.d. children only; biased for children drawn
    without replacement or top-b children whose row is the original q. Same signature as siblings."""
    accept, targets = [], [p]
    for x, q_row in zip(tokens, q):
        a, p = iid_rule(p, q_row, x)
        accept.append(a)
        targets.append(p)
    return torch.stack(accept), torch.stack(targets)


def expected_accepted_tree_rules(p: torch.Tensor, tree: object, rule: SiblingRule = siblings) -> float:
    """Exact expected number of draft tokens accept_tree accepts on one drafted tree, p (n+1, V)."""
    from ..verify.tree import children_of

    children, tokens, modes = children_of(tree.parents.tolist()), tree.tokens.tolist(), tree.modes.tolist()

    def node(u: int) -> float:
        kids = children.get(u, [])
        if not kids:
            return 0.0
        a, _ = rule(p[u + 1], [tokens[c] for c in kids], tree.q[kids], [modes[c] for c in kids])
        expected, reach = 0.0, 1.0
        for a_i, c in zip(a.tolist(), kids):
            expected += reach * a_i * (1 + node(c))
            reach *= 1 - a_i
        return expected

    return node(-1)


def drafted_trees(
    p_of: Conditional, q_of: Conditional, shape: list[Branching]
) -> list[tuple[float, torch.Tensor, SimpleNamespace]]:
    """Every tree of the given shape the draft can draft, with its probability and p (n+1, V), as toy_tree
    returns them: for expectations over the drafting of quantities of one tree (only for tiny V and shapes)."""

    def grow(prefix: tuple[int, ...]) -> list[tuple[float, list[tuple[int, tuple[int, ...], int, int]]]]:
        """(probability, nodes) of every subtree below prefix; a node is (token, prefix, mode, parent offset)."""
        depth = len(prefix)
        if depth == len(shape):
            return [(1.0, [])]
        q = q_of(prefix)
        out = []
        for w, tokens, modes in children_draws(q, shape[depth]):
            combos = [(w, [(x, prefix, m, -1) for x, m in zip(tokens, modes)])]
            for i, x in enumerate(tokens):  # each child's subtree, appended after the siblings
                combos = [
                    (cw * sw, nodes + [(t, pre, m, i if parent == -1 else parent + len(nodes)) for t, pre, m, parent in sub])
                    for cw, nodes in combos
                    for sw, sub in grow(prefix + (x,))
                ]
            out += combos
        return out

    trees = []
    for w, nodes in grow(()):
        parents, prefixes = [], [()]
        for i, (token, prefix, mode, parent) in enumerate(nodes):
            parents.append(parent)
            prefixes.append(prefix + (token,))
        tree = SimpleNamespace(
            tokens=torch.tensor([n[0] for n in nodes], dtype=torch.long),
            parents=torch.tensor(parents, dtype=torch.long),
            q=torch.stack([q_of(n[1]) for n in nodes]) if nodes else torch.zeros(0, p_of(()).numel(), dtype=torch.float64),
            modes=torch.tensor([n[2] for n in nodes], dtype=torch.long),
        )
        trees.append((w, torch.stack([p_of(prefix) for prefix in prefixes]), tree))
    return trees
