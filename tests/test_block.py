"""Block verification (specdec.BlockVerification, Sun et al. 2025) as the loop's acceptance rule for chains:
its exact output distribution is the target's (enumerated), samples of it pass the chi-square test, the test
rejects a wrong variant with demonstrated power, greedy output equals the target's, and it accepts at least as
many tokens per round as the token-level rule."""

import pytest
import torch
from goodness_of_fit import (
    N_SAMPLES,
    PASS,
    REJECT,
    batch_counts,
    block_round,
    chi_square_pvalue,
    first_round_tokens,
    in_make_test,
    power,
    rule_distribution,
    token_round,
)
from test_exactness import CASES, N_TOKENS, PROMPT
from test_greedy import PROMPT as GREEDY_PROMPT

from specdec import BlockVerification, ModelDrafter, Sampling, speculative_generate
from specdec.exact import sequence_distribution
from specdec.runtime.tiny import tiny_model
from specdec.verify.block import block_residual
from specdec.verify.token import residual


def resample_from_scaled_p(scaled_p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A wrong variant: when the block stops early, draw the next token from p instead of the residual."""
    return scaled_p / scaled_p.sum()


def block_counts(target, draft, sampling: Sampling, k: int, seed: int, rule: BlockVerification) -> torch.Tensor:
    drafter = ModelDrafter(draft)

    def generate(g, n):
        return speculative_generate(target, drafter, PROMPT.expand(n, -1), k=k, sampling=sampling,
                                    max_new_tokens=N_TOKENS, generator=g, acceptance=rule).tokens  # fmt: skip

    return batch_counts(generate, 5, N_TOKENS, seed=seed)


@pytest.mark.parametrize("sampling, k", CASES)
def test_block_verification_is_exact(small_vocab_pair, sampling, k):
    """Every continuation enumerated through the rule's definition: exactly the target's distribution."""
    target, draft = small_vocab_pair
    exact = sequence_distribution(target, PROMPT, N_TOKENS, sampling)
    enumerated = rule_distribution(target, draft, PROMPT, N_TOKENS, sampling, k, block_residual, block_round)
    torch.testing.assert_close(enumerated, exact, atol=1e-6, rtol=0)


SAMPLED = in_make_test(CASES, ("T1-k2",))


@pytest.mark.parametrize("sampling, k", SAMPLED)
def test_block_verification_samples_pass_chi_square(small_vocab_pair, sampling, k):
    """specdec.BlockVerification in the loop: N_SAMPLES continuations fit the target's distribution, not the
    draft's (two cases in `make test`, the others in `make test-all`)."""
    target, draft = small_vocab_pair
    exact = sequence_distribution(target, PROMPT, N_TOKENS, sampling)
    counts = block_counts(target, draft, sampling, k, seed=k + 20, rule=BlockVerification())
    assert chi_square_pvalue(counts, exact) > PASS
    assert chi_square_pvalue(counts, sequence_distribution(draft, PROMPT, N_TOKENS, sampling)) < REJECT


@pytest.mark.parametrize("sampling, k", CASES)
def test_the_test_catches_a_wrong_block_residual(small_vocab_pair, sampling, k):
    """Drawing the next token from p instead of norm(max(0, w p - q)) changes the output distribution; at
    N_SAMPLES the chi-square test rejects it with probability >= 0.95 in every case."""
    target, draft = small_vocab_pair
    exact = sequence_distribution(target, PROMPT, N_TOKENS, sampling)
    wrong = rule_distribution(target, draft, PROMPT, N_TOKENS, sampling, k, resample_from_scaled_p, block_round)
    assert power(exact, wrong, N_SAMPLES, PASS) >= 0.95


def test_chi_square_rejects_the_wrong_residual_in_the_loop(small_vocab_pair):
    target, draft = small_vocab_pair
    sampling = Sampling(1.0)
    counts = block_counts(target, draft, sampling, 2, seed=5, rule=BlockVerification(resample_from_scaled_p))
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) < REJECT


@pytest.mark.parametrize("sampling, k", CASES)
def test_block_accepts_at_least_as_many_tokens_as_token_level(small_vocab_pair, sampling, k):
    """Expected tokens of one round from the prompt, both rules enumerated on the same drafts: block >= token."""
    target, draft = small_vocab_pair
    k = min(k, 3)  # 5^k drafts enumerated
    block = first_round_tokens(target, draft, PROMPT, sampling, k, block_round(block_residual))
    token = first_round_tokens(target, draft, PROMPT, sampling, k, token_round(residual))
    assert block >= token - 1e-12 and 1.0 <= token <= k + 1


def test_block_verification_refuses_trees():
    from specdec import TreeRules

    target = tiny_model("llama")
    with pytest.raises(ValueError, match="verifies token trees"):
        speculative_generate(target, ModelDrafter(target), GREEDY_PROMPT, acceptance=TreeRules())
