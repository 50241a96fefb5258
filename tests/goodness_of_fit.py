"""Chi-square goodness of fit for sampled continuations, and the power of that test at N_SAMPLES.

Shared by the exactness tests (import it: `from goodness_of_fit import N_SAMPLES, chi_square_pvalue`).
The power is computed, not simulated: the exact output distribution of a speculative round rule is
enumerated over every draft and every acceptance outcome, and the chi-square statistic of N samples
from a distribution a, tested against p, is approximately noncentral chi-square with
lambda = N * sum_b (a_b - p_b)^2 / p_b over the same pooled bins (Cohen 1988, ch. 7).
Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import torch
from scipy.stats import chi2, chisquare, ncx2
from transformers import PreTrainedModel

from specdec import Sampling
from specdec.exact import sequence_index
from specdec.sampling import probabilities

N_SAMPLES = 800  # enough for power >= 0.98 against a wrong residual in every case of test_exactness.py
PASS = 1e-3  # a right rule must give p > PASS
REJECT = 1e-6  # a wrong distribution must give p < REJECT


def pooled(counts: torch.Tensor, probs: torch.Tensor, n: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Bins with expected count >= 5 kept, the others pooled into one; returns (observed, p) per bin."""
    small = probs * n < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    p = torch.cat([probs[~small], probs[small].sum()[None]])
    keep = p > 0
    return obs[keep], p[keep]


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of counts (n_outcomes,) to probs (n_outcomes,), pooling bins expected below 5."""
    if counts[probs == 0].sum() > 0:
        return 0.0  # an outcome the hypothesis calls impossible was observed
    probs = probs / probs.sum()  # float rounding: renormalise
    obs, p = pooled(counts, probs, float(counts.sum()))
    return float(chisquare(obs.numpy(), (p * counts.sum()).numpy()).pvalue)


def sample_counts(generate: Callable, vocab: int, n_tokens: int, seed: int, n: int = N_SAMPLES) -> torch.Tensor:
    """Histogram (vocab**n_tokens,) of n continuations drawn by generate(generator) -> tokens (n_tokens,)."""
    g = torch.Generator().manual_seed(seed)
    return histogram([generate(g) for _ in range(n)], vocab, n_tokens)


def histogram(continuations: list[torch.Tensor], vocab: int, n_tokens: int) -> torch.Tensor:
    """Counts (vocab**n_tokens,) of the continuations, each n_tokens long."""
    counts = torch.zeros(vocab**n_tokens, dtype=torch.float64)
    for tokens in continuations:
        assert tokens.numel() == n_tokens
        counts[sequence_index(tokens, vocab)] += 1
    return counts


def batch_counts(generate: Callable, vocab: int, n_tokens: int, seed: int, n: int = N_SAMPLES) -> torch.Tensor:
    """Histogram (vocab**n_tokens,) of n continuations drawn as the n rows of one batch: generate(generator, n) ->
    n token tensors (n_tokens,). Rows are independent draws (tests/test_batch_power.py), so this is the same test as
    sample_counts at a fraction of its time; the loop's one-row path keeps its own chi-square tests (the online
    choice, auto trees and other vocabularies choose for one sequence and sample with sample_counts)."""
    rows = list(generate(torch.Generator().manual_seed(seed), n))
    assert len(rows) == n
    return histogram(rows, vocab, n_tokens)


def power(probs: torch.Tensor, alternative: torch.Tensor, n: int = N_SAMPLES, alpha: float = PASS) -> float:
    """Probability that chi_square_pvalue of n samples from `alternative` falls below alpha (tested against probs)."""
    probs = probs / probs.sum()
    if float(alternative[probs == 0].sum()) * n > 5:  # the alternative hits impossible outcomes: almost surely seen
        return 1.0
    _, p = pooled(probs, probs, n)
    a, _ = pooled(alternative, probs, n)
    df = p.numel() - 1
    lam = float(n * ((a - p) ** 2 / p).sum())
    return float(ncx2.sf(chi2.isf(alpha, df), df, lam))


RoundRule = Callable[[Callable[[int], torch.Tensor], Callable[[int], torch.Tensor], tuple[int, ...]],
                     list[tuple[tuple[int, ...], float]]]  # (p after xs[:n], q after xs[:n], draft xs) -> outcomes


def token_round(residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> RoundRule:
    """One round of Leviathan's token-level rule on a draft xs: (emitted tokens, probability) of every outcome,
    given the draft. Accept x_i with min(1, p/q), resample from residual(p, q) at the first rejection, bonus
    token from p when all are accepted."""

    def outcomes(p_of, q_of, xs):
        out, weight = [], 1.0  # weight: probability of accepting the first n tokens
        for n in range(len(xs) + 1):
            p = p_of(n)
            if n == len(xs):
                return out + [(xs + (y,), weight * float(p[y])) for y in range(p.numel())]
            q = q_of(n)
            accepted = min(1.0, float(p[xs[n]] / q[xs[n]]))
            r = residual(p, q)
            out += [(xs[:n] + (y,), weight * (1 - accepted) * float(r[y])) for y in range(p.numel())]
            weight *= accepted
        return out

    return outcomes


def block_round(residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> RoundRule:
    """One round of block verification (Sun et al. 2025) on a draft xs, computed from its definition: weights
    w_i = min(1, w_{i-1} p/q); going back from i = k, stop at i with probability h_i (w_k at the end,
    s_i / (s_i + 1 - w_i) before it) and draw the next token from residual(w_i p, q) (p after the whole block)."""

    def outcomes(p_of, q_of, xs):
        k, weights = len(xs), [1.0]
        for i, x in enumerate(xs):
            weights.append(min(1.0, weights[-1] * float(p_of(i)[x] / q_of(i)[x])))
        out, reach = [], 1.0  # reach: probability that no later stopping point was taken
        for i in range(k, -1, -1):
            p = p_of(i)
            if i == k:
                h, r = weights[k], p
            else:
                s = float((weights[i] * p - q_of(i)).clamp_min(0).sum())
                h = s / (s + 1 - weights[i]) if s + 1 - weights[i] > 0 else 1.0
                r = residual(weights[i] * p, q_of(i))
            if h > 0:
                out += [(xs[:i] + (y,), reach * h * float(r[y])) for y in range(p.numel())]
            reach *= 1 - h
        return out

    return outcomes


@torch.inference_mode()
def rule_distribution(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompt: torch.Tensor,
    n_tokens: int,
    sampling: Sampling,
    k: int,
    residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    rule: Callable[[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]], RoundRule] = token_round,
) -> torch.Tensor:
    """Exact distribution (V^n,) of the loop's output when each round drafts min(k, budget - 1) tokens from q and
    verifies them with `rule` (token_round: Leviathan's; block_round) whose rejections resample from
    residual. Only for tiny V and n.
    """
    vocab = int(target.config.vocab_size)
    verify = rule(residual)

    @functools.cache
    def dist(model: PreTrainedModel, prefix: tuple[int, ...]) -> torch.Tensor:  # (V,)
        logits = model(input_ids=torch.cat([prompt[0], torch.tensor(prefix, dtype=torch.long)])[None]).logits
        return probabilities(logits[0, -1, :vocab], sampling).double()

    @functools.cache
    def completions(prefix: tuple[int, ...]) -> dict[tuple[int, ...], float]:
        budget = n_tokens - len(prefix)
        if budget == 0:
            return {(): 1.0}
        out: dict[tuple[int, ...], float] = {}
        for xs in itertools.product(range(vocab), repeat=min(k, budget - 1)):
            drafted = 1.0  # probability of drafting xs
            for i, x in enumerate(xs):
                drafted *= float(dist(draft, prefix + xs[:i])[x])
            if drafted == 0:
                continue
            outcomes = verify(lambda n, xs=xs: dist(target, prefix + xs[:n]), lambda n, xs=xs: dist(draft, prefix + xs[:n]), xs)
            for tokens, weight in outcomes:
                if weight:
                    for tail, w in completions(prefix + tokens).items():
                        out[tokens + tail] = out.get(tokens + tail, 0.0) + drafted * weight * w
        return out

    probs = torch.zeros(vocab**n_tokens, dtype=torch.float64)
    for tokens, w in completions(()).items():
        probs[sequence_index(torch.tensor(tokens), vocab)] += w
    return probs


@torch.inference_mode()
def first_round_tokens(
    target: PreTrainedModel, draft: PreTrainedModel, prompt: torch.Tensor, sampling: Sampling, k: int, verify: RoundRule
) -> float:
    """Expected tokens one round emits after the prompt (accepted drafts + 1) with k drafts, enumerated."""
    vocab = int(target.config.vocab_size)

    @functools.cache
    def dist(model: PreTrainedModel, prefix: tuple[int, ...]) -> torch.Tensor:  # (V,)
        logits = model(input_ids=torch.cat([prompt[0], torch.tensor(prefix, dtype=torch.long)])[None]).logits
        return probabilities(logits[0, -1, :vocab], sampling).double()

    expected = 0.0
    for xs in itertools.product(range(vocab), repeat=k):
        drafted = 1.0
        for i, x in enumerate(xs):
            drafted *= float(dist(draft, xs[:i])[x])
        if drafted:
            outcomes = verify(lambda n, xs=xs: dist(target, xs[:n]), lambda n, xs=xs: dist(draft, xs[:n]), xs)
            expected += drafted * sum(w * len(tokens) for tokens, w in outcomes)
    return expected


def in_make_test(cases: list, keep: tuple[str, ...]) -> list:
    """The cases with ids in `keep` run in `make test`; the others are marked `exhaustive` (`make test-all`)."""
    import pytest

    return [c if c.id in keep else pytest.param(*c.values, id=c.id, marks=(*c.marks, pytest.mark.exhaustive))
            for c in cases]  # fmt: skip
