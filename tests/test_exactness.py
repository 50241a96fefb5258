"""Sequence-level exactness: speculative sampling draws whole continuations from the target's distribution.

Tiny random models over a 5-token vocabulary; every 3-token continuation is enumerated and its exact
probability under the processed target distribution computed; thousands of speculative samples must
pass a chi-square goodness-of-fit test (fixed seeds, so the outcome is deterministic). The same test
rejects the article's draft-then-score, whose output is the draft model's distribution.
"""

import pytest
import torch
from scipy.stats import chisquare

from specdec import (
    GREEDY,
    ModelDrafter,
    NGramDrafter,
    Sampling,
    autoregressive_generate,
    speculative_generate,
)
from specdec.naive import draft_then_score
from specdec.toy import sequence_distribution, sequence_index

N_TOKENS = 3
N_SAMPLES = 3000
PROMPT = torch.tensor([[0, 3, 1]])


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit, pooling outcomes whose expected count is below 5 into one bin."""
    if counts[probs == 0].sum() > 0:
        return 0.0  # an outcome the hypothesis calls impossible was observed
    expected = probs / probs.sum() * counts.sum()  # float rounding: renormalise
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    return float(chisquare(obs[keep].numpy(), exp[keep].numpy()).pvalue)


def sample_counts(generate, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(vocab**N_TOKENS, dtype=torch.float64)
    for _ in range(N_SAMPLES):
        tokens = generate(g)
        assert tokens.numel() == N_TOKENS
        counts[sequence_index(tokens, vocab)] += 1
    return counts


CASES = [
    pytest.param(Sampling(1.0), 1, id="T1-k1"),
    pytest.param(Sampling(1.0), 3, id="T1-k3"),
    pytest.param(Sampling(1.0), 6, id="T1-k6"),
    pytest.param(Sampling(0.5), 3, id="T0.5-k3"),
    pytest.param(Sampling(1.5), 3, id="T1.5-k3"),
    pytest.param(Sampling(1.0, top_k=3), 3, id="top_k3-k3"),
    pytest.param(Sampling(1.0, top_p=0.8), 3, id="top_p0.8-k3"),
    pytest.param(Sampling(1.5, top_k=4, top_p=0.9), 6, id="T1.5-top_k4-top_p0.9-k6"),
]


@pytest.mark.parametrize("sampling, k", CASES)
def test_speculative_matches_target_distribution(small_vocab_pair, sampling, k):
    target, draft = small_vocab_pair
    exact = sequence_distribution(target, PROMPT, N_TOKENS, sampling)
    drafter = ModelDrafter(draft)

    def generate(g):
        return speculative_generate(
            target, drafter, PROMPT, k=k, sampling=sampling, max_new_tokens=N_TOKENS, generator=g
        ).tokens

    counts = sample_counts(generate, 5, seed=k)
    assert chi_square_pvalue(counts, exact) > 1e-3
    # the draft really differs from the target, so this is not a trivial pass
    assert chi_square_pvalue(counts, sequence_distribution(draft, PROMPT, N_TOKENS, sampling)) < 1e-6


def test_ngram_drafter_is_exact(small_vocab_pair):
    """A deterministic drafter's q is one-hot; the rule stays exact."""
    target, _ = small_vocab_pair
    prompt = torch.tensor([[0, 3, 1, 2, 3, 1, 2, 4, 3, 1]])
    sampling = Sampling(1.0)
    exact = sequence_distribution(target, prompt, N_TOKENS, sampling)

    def generate(g):
        return speculative_generate(
            target, NGramDrafter(), prompt, k=3, sampling=sampling, max_new_tokens=N_TOKENS, generator=g
        ).tokens

    assert chi_square_pvalue(sample_counts(generate, 5, seed=7), exact) > 1e-3


def test_autoregressive_baseline_matches_target_distribution(small_vocab_pair):
    target, _ = small_vocab_pair
    sampling = Sampling(1.0)
    exact = sequence_distribution(target, PROMPT, N_TOKENS, sampling)

    def generate(g):
        return autoregressive_generate(target, PROMPT, sampling=sampling, max_new_tokens=N_TOKENS, generator=g).tokens

    assert chi_square_pvalue(sample_counts(generate, 5, seed=11), exact) > 1e-3


def test_chi_square_rejects_the_articles_method(small_vocab_pair):
    """Draft-then-score returns the draft's sample: the same test that passes speculative sampling fails it."""
    target, draft = small_vocab_pair
    sampling = Sampling(1.0)

    def generate(g):
        return draft_then_score(target, draft, PROMPT, sampling=sampling, max_new_tokens=N_TOKENS, generator=g).tokens

    counts = sample_counts(generate, 5, seed=3)
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) < 1e-6
    assert chi_square_pvalue(counts, sequence_distribution(draft, PROMPT, N_TOKENS, sampling)) > 1e-3


def test_greedy_speculative_is_deterministic_target_argmax(small_vocab_pair):
    target, draft = small_vocab_pair
    exact = sequence_distribution(target, PROMPT, N_TOKENS, GREEDY)
    tokens = speculative_generate(target, ModelDrafter(draft), PROMPT, k=3, sampling=GREEDY, max_new_tokens=N_TOKENS)
    assert exact.max() == 1.0
    assert sequence_index(tokens.tokens, 5) == int(exact.argmax())
