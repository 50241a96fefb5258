"""Statistics add up, and the theory matches a Bernoulli(alpha) simulation."""

import pytest
import torch

from specdec import ModelDrafter, NGramDrafter, Sampling, speculative_generate
from specdec.runtime.tiny import perturbed_copy, tiny_model
from specdec.theory import (
    accepted_length_distribution,
    expected_tokens,
    expected_tokens_per_pass,
    optimal_k,
    walltime_improvement,
)


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=0, scale=5.0)
    return target, perturbed_copy(target, 0.3)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_counts_are_consistent(pair, k):
    target, draft = pair
    g = torch.Generator().manual_seed(0)
    out = speculative_generate(target, ModelDrafter(draft), torch.tensor([[0, 4, 2]]), k=k,
                               sampling=Sampling(1.0), max_new_tokens=40, generator=g)
    s = out.stats
    assert s.emitted == out.tokens.numel() == 40  # stops exactly at max_new_tokens
    assert s.emitted == s.accepted + s.target_forwards  # every pass adds accepted + one target token
    assert sum(s.drafted_at) == s.drafted and sum(s.accepted_at) == s.accepted
    assert sum(s.accepted_per_round) == s.accepted and len(s.accepted_per_round) == s.target_forwards
    assert s.draft_forwards == s.drafted  # one draft-model pass per draft token
    assert all(a <= d for a, d in zip(s.accepted_at, s.drafted_at))
    assert max(len(s.drafted_at), 1) <= k
    assert 0.0 < s.acceptance_rate < 1.0 and 0.0 < s.alpha <= 1.0
    assert s.mean_accepted_length == pytest.approx(s.emitted / s.target_forwards)
    assert set(s.seconds) == {"prefill", "draft", "verify", "total"}
    assert s.seconds["total"] >= s.seconds["draft"] + s.seconds["verify"]


def test_eos_inside_accepted_tokens_stops_generation(pair):
    target, _ = pair
    prompt = torch.tensor([[0, 4, 2]])
    free = speculative_generate(target, ModelDrafter(target), prompt, k=4, sampling=Sampling(0.0), max_new_tokens=12)
    eos = int(free.tokens[5])  # a token the target emits, inside an accepted run (the draft is the target)
    first = free.tokens.tolist().index(eos)
    out = speculative_generate(target, ModelDrafter(target), prompt, k=4, sampling=Sampling(0.0), max_new_tokens=12,
                               eos_token_id=eos)
    assert out.tokens.tolist() == free.tokens[: first + 1].tolist()
    assert out.stats.emitted == first + 1


def test_ngram_counts(pair):
    target, _ = pair
    out = speculative_generate(target, NGramDrafter(), torch.tensor([[0, 4, 2, 0, 4, 2, 0, 4]]), k=3,
                               sampling=Sampling(0.0), max_new_tokens=20)
    assert out.stats.draft_forwards == 0
    assert out.stats.emitted == out.stats.accepted + out.stats.target_forwards


@pytest.mark.parametrize("alpha, k, expected", [(0.6, 2, 1.96), (0.7, 3, 2.53), (0.8, 5, 3.69), (0.9, 10, 6.86)])
def test_leviathan_table_1(alpha, k, expected):
    """Leviathan Table 1 (c = 0): the improvement equals the expected tokens per pass."""
    assert walltime_improvement(alpha, 0.0, k) == pytest.approx(expected, abs=0.01)


def test_expected_tokens_limits():
    assert expected_tokens_per_pass(0.0, 5) == 1.0
    assert expected_tokens_per_pass(1.0, 5) == 6.0
    assert expected_tokens_per_pass(0.5, 1) == pytest.approx(1.5)


def test_theory_matches_bernoulli_simulation():
    """Accept each of k draft tokens independently with prob. alpha, stop at the first rejection."""
    g = torch.Generator().manual_seed(0)
    alpha, k, rounds = 0.7, 4, 200_000
    accepts = torch.rand(rounds, k, generator=g) < alpha
    n = accepts.long().cumprod(1).sum(1)  # accepted per round
    emitted = (n + 1).double().mean()
    assert float(emitted) == pytest.approx(expected_tokens_per_pass(alpha, k), rel=0.01)
    freq = torch.bincount(n, minlength=k + 1).double() / rounds
    assert torch.allclose(freq, torch.tensor(accepted_length_distribution(alpha, k), dtype=torch.float64), atol=0.005)


def test_distribution_sums_to_one_and_matches_expectation():
    dist = accepted_length_distribution(0.8, 5)
    assert sum(dist) == pytest.approx(1.0)
    assert sum((n + 1) * d for n, d in enumerate(dist)) == pytest.approx(expected_tokens_per_pass(0.8, 5))


def test_optimal_k_and_lower_bound():
    alpha, c = 0.8, 0.05
    best = optimal_k(alpha, c)
    assert all(walltime_improvement(alpha, c, best) >= walltime_improvement(alpha, c, k) for k in range(1, 40))
    assert walltime_improvement(alpha, c, best) >= (1 + alpha) / (1 + c)  # Leviathan: holds when alpha > c
    assert optimal_k(0.3, 0.9) == 1  # an expensive, poor draft: k = 1 is best (and still a slowdown)
    assert walltime_improvement(0.3, 0.9, 1) < 1.0


def test_speedup_with_the_measured_pass_cost():
    """Thm 3.8 with a verification pass of v target steps: E(k) / (k c + v); a lookup pays c once per round;
    optimal_k maximises that, not the v = 1 speedup."""
    alpha, c, k = 0.8, 0.1, 4
    e = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert walltime_improvement(alpha, c, k, pass_cost=1.6) == pytest.approx(e / (k * c + 1.6))
    assert walltime_improvement(alpha, c, k, 1.6, draft_cost="per_call") == pytest.approx(e / (c + 1.6))
    assert expected_tokens([alpha] * k) == pytest.approx(e)

    def pass_cost(width):  # a pass grows by 0.3 steps per extra token
        return 1.0 + 0.3 * (width - 1)

    best = optimal_k(alpha, c, 16, pass_cost)
    speedups = {j: walltime_improvement(alpha, c, j, pass_cost(j + 1)) for j in range(1, 17)}
    assert best == max(speedups, key=speedups.get)
    assert best < optimal_k(alpha, c, 16)  # wider passes cost more: shorter drafts


def test_rounds_on_fixed_distributions_emit_expected_tokens():
    """With the same p and q at every position, alpha = sum min(p, q) predicts tokens per round."""
    from specdec.exact import fixed_round

    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    alpha = float(torch.minimum(p, q).sum())  # 0.7
    g = torch.Generator().manual_seed(0)
    k, rounds = 3, 5000  # the mean's standard error is 0.7%: rel=0.02 is about three of them
    emitted = sum(fixed_round(p, q, k, g).numel() for _ in range(rounds)) / rounds
    assert emitted == pytest.approx(expected_tokens_per_pass(alpha, k), rel=0.02)


def test_acceptance_by_position_counts_only_rounds_that_tested_the_position(pair):
    """Short last rounds (budget) and short n-gram drafts must not count as reaching a position."""
    target, _ = pair
    prompt = torch.tensor([[0, 4, 2]])
    out = speculative_generate(target, ModelDrafter(target), prompt, k=4, sampling=Sampling(0.0), max_new_tokens=12)
    assert out.stats.accepted_per_round == [4, 4, 1]  # the last round may draft only 1 token
    assert out.stats.acceptance_by_position == [1.0, 1.0, 1.0, 1.0]
    assert out.stats.reached_at == [3, 2, 2, 2]
    ngram = speculative_generate(target, NGramDrafter(), torch.tensor([[0, 4, 2, 0, 4, 2, 0, 4]]), k=3,
                                 sampling=Sampling(0.0), max_new_tokens=20).stats
    for i, rate in enumerate(ngram.acceptance_by_position):
        assert rate == ngram.accepted_at[i] / ngram.reached_at[i]
        assert ngram.reached_at[i] <= ngram.drafted_at[i]
