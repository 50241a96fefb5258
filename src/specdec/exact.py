"""Small exact objects for the notebooks and tests: exact sequence distributions of tiny models by
enumeration, total-variation distance, empirical histograms, one round on fixed distributions; for
token trees, the exact output distribution of a tree rule (enumerating the drafting and every
accept/reject) and one round on a random toy tree.

Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from transformers import PreTrainedModel

from .sampling import Sampling, probabilities, sample
from .speculative import Draft, accept
from .tree_accept import DETERMINISTIC, DISTINCT, IID, SiblingRule, accept_tree, iid_rule, siblings, without


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    """TV(p, q) = 1/2 sum_x |p(x) - q(x)| over the last dimension, averaged over any leading ones."""
    return float(0.5 * (p.double() - q.double()).abs().sum(-1).mean())


def histogram(samples: torch.Tensor, n_outcomes: int) -> torch.Tensor:
    """Empirical distribution (n_outcomes,) of integer samples in [0, n_outcomes)."""
    counts = torch.bincount(samples.flatten().long(), minlength=n_outcomes).double()
    return counts / counts.sum()


def sequence_index(tokens: torch.Tensor, vocab_size: int) -> int:
    """Position of a continuation (n,) in the lexicographic order of V^n used by sequence_distribution."""
    index = 0
    for t in tokens.tolist():
        index = index * vocab_size + int(t)
    return index


@torch.inference_mode()
def sequence_distribution(
    model: PreTrainedModel, prompt_ids: torch.Tensor, n_tokens: int, sampling: Sampling
) -> torch.Tensor:
    """Exact probability (V^n,) of every n-token continuation of prompt (1, L) under the processed distribution.

    Enumerates all V^n continuations in one batched forward pass, so only for tiny V and n.
    """
    vocab = int(model.config.vocab_size)
    continuations = torch.tensor(list(itertools.product(range(vocab), repeat=n_tokens)))  # (V^n, n)
    ids = torch.cat([prompt_ids.expand(len(continuations), -1), continuations], dim=-1)  # (V^n, L + n)
    logits = model(input_ids=ids).logits[:, prompt_ids.shape[-1] - 1 : -1, :vocab]  # (V^n, n, V)
    probs = probabilities(logits, sampling)  # (V^n, n, V)
    return probs.gather(-1, continuations[..., None]).squeeze(-1).double().prod(-1)  # (V^n,)


def fixed_round(
    p: torch.Tensor, q: torch.Tensor, k: int, generator: torch.Generator | None, acceptance: object = None
) -> torch.Tensor:
    """One speculative round when p and q (V,) are the same at every position; returns the emitted tokens.

    Drafts k tokens from q and applies specdec.speculative.accept (or an acceptance rule of the loop, e.g.
    specdec.BlockVerification()); emits accepted + 1 tokens.
    """
    draft = sample(q.expand(k, -1), generator)  # (k,)
    if acceptance is not None:
        path, next_token = acceptance.accept(p.expand(k + 1, -1), Draft(draft, q.expand(k, -1)), generator)
        return torch.cat([draft[: len(path)], next_token])
    n, next_token = accept(p.expand(k + 1, -1), q.expand(k, -1), draft, generator)
    return torch.cat([draft[:n], next_token])


# Token trees: the exact output distribution of a tree rule, enumerating the drafting and the coins.

Conditional = Callable[[tuple[int, ...]], torch.Tensor]  # tokens after the round's start -> (V,)


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


def target_sequence_distribution(
    p_of: Conditional, n_tokens: int, prefix: tuple[int, ...] = ()
) -> torch.Tensor:
    """Exact probability (V^n,) of the next n tokens under the target, in the order of sequence_index."""
    if n_tokens == 0:
        return torch.ones(1, dtype=torch.float64)
    p = p_of(prefix)  # (V,)
    return torch.cat(
        [p[y] * target_sequence_distribution(p_of, n_tokens - 1, prefix + (y,)) for y in range(p.numel())]
    )


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
    tree = SimpleNamespace(  # duck-typed like specdec.tree.TreeDraft: what accept_tree reads
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
    """One round on a freshly drafted toy tree with specdec.tree_accept.accept_tree; the emitted tokens."""
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


def traversal_round_distribution(
    p_of: Conditional, q_of: Conditional, shape: list[Branching], n_tokens: int, update: object = None
) -> torch.Tensor:
    """Exact probability (V^n,) of the first n tokens emitted from a tree of the given shape verified with
    traversal verification (specdec.traversal) and its `update` (default: after_failure), enumerating the
    drafted children and every accept/reject the way the visit makes them.

    Tokens after the round come from the target, as tree_round_distribution's. Equals
    target_sequence_distribution iff the update is exact.
    """
    from .traversal import after_failure, child_weight  # the library's own steps; the visit order is here

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
    from .traversal import TraversalVerification, after_failure

    p, tree = toy_tree(p_of, q_of, shape, generator)  # (n+1, V)
    path, next_token = TraversalVerification(update or after_failure).accept(p, tree, generator)
    return torch.cat([tree.tokens[path], next_token])


def expected_accepted_tree_rules(p: torch.Tensor, tree: object, rule: SiblingRule = siblings) -> float:
    """Exact expected number of draft tokens accept_tree accepts on one drafted tree, p (n+1, V)."""
    from .tree_accept import children_of

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


def traversal_outcomes(p: torch.Tensor, tree: object, update: object = None) -> list[tuple[list[int], torch.Tensor]]:
    """Every way traversal verification can end on one drafted tree, p (n+1, V): (accepted node ids, next token
    sub-distribution (V,)), the vector's mass the probability of stopping on that path."""
    from .traversal import after_failure, child_weight, proposal
    from .tree_accept import children_of

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
