"""Sequence-level exactness: speculative sampling draws whole continuations from the target's distribution.

Tiny random models over a 5-token vocabulary; every 3-token continuation is enumerated and its exact
probability under the processed target distribution computed; N_SAMPLES speculative samples must
pass a chi-square goodness-of-fit test (fixed seeds, so the outcome is deterministic). The same test
rejects the article's draft-then-score, whose output is the draft model's distribution, and a subtly
wrong rule that resamples from p instead of norm(max(0, p - q)) after a rejection. Its power against
that wrong rule is computed exactly for every case (test_every_case_is_powered).

With 3 new tokens a round drafts at most 2 (speculative_generate never drafts past the budget), so
k = 2 is the longest draft these cases exercise; the k = 6 case checks that clamping.
"""

import pytest
import torch
from goodness_of_fit import (
    N_SAMPLES,
    PASS,
    REJECT,
    batch_counts,
    chi_square_pvalue,
    in_make_test,
    power,
    rule_distribution,
)

from specdec import (
    GREEDY,
    ModelDrafter,
    NGramDrafter,
    Sampling,
    autoregressive_generate,
    speculative_generate,
)
from specdec.draft.model import can_read_cache
from specdec.exact import sequence_distribution, sequence_index
from specdec.naive import draft_then_score
from specdec.runtime.cached import CachedLM
from specdec.verify import token as token_rule
from specdec.verify.token import residual

N_TOKENS = 3
PROMPT = torch.tensor([[0, 3, 1]])

CASES = [
    pytest.param(Sampling(1.0), 1, id="T1-k1"),
    pytest.param(Sampling(1.0), 2, id="T1-k2"),
    pytest.param(Sampling(0.5), 2, id="T0.5-k2"),
    pytest.param(Sampling(1.5), 2, id="T1.5-k2"),
    pytest.param(Sampling(1.0, top_k=3), 2, id="top_k3-k2"),
    pytest.param(Sampling(1.0, top_p=0.8), 2, id="top_p0.8-k2"),
    pytest.param(Sampling(1.5, top_k=4, top_p=0.9), 6, id="T1.5-top_k4-top_p0.9-k6"),
]


def resample_from_p(p_i: torch.Tensor, q_i: torch.Tensor) -> torch.Tensor:
    """A wrong rule: after a rejection, draw from p instead of norm(max(0, p - q))."""
    return p_i


def speculative_counts(
    target, draft, sampling: Sampling, k: int, seed: int, reads_target_cache: bool = False
) -> torch.Tensor:
    drafter = ModelDrafter(draft, reads_target_cache=reads_target_cache)

    def generate(g, n):
        return speculative_generate(
            target, drafter, PROMPT.expand(n, -1), k=k, sampling=sampling, max_new_tokens=N_TOKENS, generator=g
        ).tokens

    return batch_counts(generate, 5, N_TOKENS, seed=seed)


@pytest.mark.parametrize("sampling, k", in_make_test(CASES, ("T1-k1", "T1.5-top_k4-top_p0.9-k6")))
def test_speculative_matches_target_distribution(small_vocab_pair, sampling, k):
    target, draft = small_vocab_pair
    counts = speculative_counts(target, draft, sampling, k, seed=k)
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) > PASS
    # the draft really differs from the target, so this is not a trivial pass
    assert chi_square_pvalue(counts, sequence_distribution(draft, PROMPT, N_TOKENS, sampling)) < REJECT


@pytest.mark.exhaustive  # make test: a model tree reading the target's cache keeps it (tests/test_shared_cache.py)
def test_a_draft_reading_the_target_cache_keeps_the_target_distribution(small_vocab_pair):
    """The draft drafts from the target's KV cache (same shapes, so it reads it): still exact."""
    target, draft = small_vocab_pair
    assert can_read_cache(CachedLM(draft), CachedLM(target))
    sampling = Sampling(1.0)
    counts = speculative_counts(target, draft, sampling, 2, seed=11, reads_target_cache=True)
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) > PASS
    assert chi_square_pvalue(counts, sequence_distribution(draft, PROMPT, N_TOKENS, sampling)) < REJECT


@pytest.mark.parametrize("sampling, k", CASES)
def test_every_case_is_powered(small_vocab_pair, sampling, k):
    """At N_SAMPLES the test above catches resampling from p with probability >= 0.98, in every case.

    The enumerated distribution of the right rule (with specdec's residual) is the target's, which checks
    the enumeration; the wrong rule's distribution gives the power.
    """
    target, draft = small_vocab_pair
    exact = sequence_distribution(target, PROMPT, N_TOKENS, sampling)
    right = rule_distribution(target, draft, PROMPT, N_TOKENS, sampling, k, residual)
    torch.testing.assert_close(right, exact, atol=1e-6, rtol=0)
    wrong = rule_distribution(target, draft, PROMPT, N_TOKENS, sampling, k, resample_from_p)
    assert power(exact, wrong, N_SAMPLES, PASS) >= 0.98
    assert power(exact, sequence_distribution(draft, PROMPT, N_TOKENS, sampling), N_SAMPLES, REJECT) >= 0.999


def test_chi_square_rejects_resampling_from_p(small_vocab_pair, monkeypatch):
    """The same test, same size, on speculative_generate with the wrong residual patched in: rejected."""
    target, draft = small_vocab_pair
    monkeypatch.setattr(token_rule, "residual", resample_from_p)
    sampling = Sampling(1.0)
    counts = speculative_counts(target, draft, sampling, 2, seed=2)
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) < REJECT
    wrong = rule_distribution(target, draft, PROMPT, N_TOKENS, sampling, 2, resample_from_p)
    assert chi_square_pvalue(counts, wrong) > PASS  # and it is exactly the wrong rule's distribution


def test_chi_square_rejects_the_articles_method(small_vocab_pair):
    """Draft-then-score returns the draft's sample: the same test that passes speculative sampling fails it."""
    target, draft = small_vocab_pair
    sampling = Sampling(1.0)

    def generate(g, n):
        return draft_then_score(target, draft, PROMPT.expand(n, -1), sampling=sampling, max_new_tokens=N_TOKENS,
                                generator=g).tokens

    counts = batch_counts(generate, 5, N_TOKENS, seed=3)
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) < REJECT
    assert chi_square_pvalue(counts, sequence_distribution(draft, PROMPT, N_TOKENS, sampling)) > PASS


@pytest.mark.exhaustive  # make test: the n-gram drafter's chi-square under k=auto (tests/test_adaptive.py)
def test_ngram_drafter_is_exact(small_vocab_pair):
    """A deterministic drafter's q is one-hot; the rule stays exact."""
    target, _ = small_vocab_pair
    prompt = torch.tensor([[0, 3, 1, 2, 3, 1, 2, 4, 3, 1]])
    sampling = Sampling(1.0)
    exact = sequence_distribution(target, prompt, N_TOKENS, sampling)

    def generate(g, n):
        return speculative_generate(
            target, NGramDrafter(), prompt.expand(n, -1), k=3, sampling=sampling, max_new_tokens=N_TOKENS, generator=g
        ).tokens

    assert chi_square_pvalue(batch_counts(generate, 5, N_TOKENS, seed=7), exact) > PASS


def test_autoregressive_baseline_matches_target_distribution(small_vocab_pair):
    target, _ = small_vocab_pair
    sampling = Sampling(1.0)
    exact = sequence_distribution(target, PROMPT, N_TOKENS, sampling)

    def generate(g, n):
        return autoregressive_generate(target, PROMPT.expand(n, -1), sampling=sampling, max_new_tokens=N_TOKENS,
                                       generator=g).tokens

    assert chi_square_pvalue(batch_counts(generate, 5, N_TOKENS, seed=11), exact) > PASS


def test_greedy_speculative_is_deterministic_target_argmax(small_vocab_pair):
    target, draft = small_vocab_pair
    exact = sequence_distribution(target, PROMPT, N_TOKENS, GREEDY)
    tokens = speculative_generate(target, ModelDrafter(draft), PROMPT, k=3, sampling=GREEDY, max_new_tokens=N_TOKENS)
    assert exact.max() == 1.0
    assert sequence_index(tokens.tokens, 5) == int(exact.argmax())
