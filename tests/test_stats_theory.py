"""Statistics add up, and the theory matches a Bernoulli(alpha) simulation."""

import pytest
import torch

from specdec import ModelDrafter, NGramDrafter, Sampling, speculative_generate
from specdec.metrics import Stats, pooled_summaries
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


def test_theory_check_measures_c_and_the_verify_cost_against_the_baseline_step():
    """Thm 3.8 against a run (specdec.metrics.theory_check): c and the verify cost in baseline steps of 0.1 s."""
    from specdec.metrics import Stats, theory_check

    baseline = Stats(target_forwards=10, seconds={"verify": 1.0})
    spec = Stats(drafted=8, accepted=4, target_forwards=4, overlap_sum=3.0, overlap_count=4,
                 accepted_per_round=[1, 1, 1, 1], chosen_k=[2, 2, 2, 2], seconds={"draft": 0.4, "verify": 0.6})
    check = theory_check([baseline], [spec], k=2)
    assert check["c"] == pytest.approx(0.5) and check["verify_cost"] == pytest.approx(1.5)
    assert check["theoretical_speedup"] == pytest.approx(walltime_improvement(0.75, 0.5, 2))
    assert check["theoretical_speedup_with_verify_cost"] == pytest.approx(walltime_improvement(0.75, 0.5, 2, 1.5))
    assert check["predicted_tokens_per_pass"] == pytest.approx(expected_tokens_per_pass(0.75, 2))
    assert check["produced_tokens_per_pass"] == 2 and check["produced_tokens_per_pass_se"] == 0
    assert theory_check([baseline], [Stats(target_forwards=3)], k=2) == {}  # nothing drafted


def test_an_outputs_quality_is_scored_by_the_target(pair):
    """specdec.quality.output_quality: the target's NLL, agreement with a reference, diversity."""
    from specdec.quality import negative_log_likelihood, output_quality

    target, _ = pair
    ids, tokens = torch.tensor([[1, 2, 3]]), torch.tensor([4, 5, 4, 5, 4, 5])
    scored = output_quality(target, ids, tokens, reference=torch.tensor([4, 5, 6, 5, 4, 5]))
    assert scored["nll"] == pytest.approx(negative_log_likelihood(target, ids, tokens))
    assert scored["agreement"] == pytest.approx(2 / 6) and scored["distinct_2"] == pytest.approx(2 / 5)
    assert scored["repetition_4"] == pytest.approx(1 / 3) and scored["parted_at"] == 2
    assert output_quality(target, ids, tokens, reference=tokens)["parted_at"] is None  # identical
    assert output_quality(target, ids, tokens)["agreement"] is None  # no reference (sampling)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt_neox"])
def test_log_probs_are_those_of_the_models_own_logits(arch, monkeypatch):
    """specdec.quality.token_log_probs runs the output layer over the final hidden states a block of rows at a time
    (3 here): the log-probs of the model's own logits (Gemma 2's soft-capped), for the whole text and for its last
    tokens (continuation_log_probs)."""
    from specdec import quality

    monkeypatch.setattr(quality, "ROWS", 3)
    model = tiny_model(arch, seed=0, scale=40.0)  # logits well past Gemma 2's cap of 30
    ids = torch.randint(0, 32, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, :-1].float()
    expected = logits.log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    torch.testing.assert_close(quality.token_log_probs(model, ids), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(quality.continuation_log_probs(model, ids[:, :5], ids[0, 5:]), expected[-7:],
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    assert quality.token_log_probs(model, ids[:, :1]).shape == (0,)  # one token: nothing to score


def test_pooled_chosen_k_histograms_and_draft_rounds_add_up():
    run = {key: 1.0 for key in ("emitted", "drafted", "accepted", "target_forwards", "draft_forwards")}
    run.update(overlap_sum=0.5, overlap_count=1, tree_rounds=0, tree_nodes_sum=0, tree_depth_sum=0,
               predicted_tokens=2.0, predicted_seconds=1.0, measured_tokens=1, measured_seconds=2.0)
    pooled = pooled_summaries([{**run, "chosen_k_histogram": [1, 2], "draft_rounds": {"head": 3, "ngram": 1}},
                           {**run, "chosen_k_histogram": [0, 1, 4], "draft_rounds": {"head": 2, "copy": 5}}])
    assert pooled["chosen_k_histogram"] == [1, 3, 4]
    assert pooled["draft_rounds"] == {"copy": 5, "head": 5, "ngram": 1}
    assert pooled["predicted_tokens_per_second"] == 2.0 and pooled["measured_tokens_per_second"] == 0.5


def test_stats_come_back_from_a_flat_row():
    """A run's results row (summary() and the per-round lists) gives the same Stats back; a phase whose
    seconds are missing (NaN, None) is left out."""
    stats = Stats(emitted=9, drafted=8, accepted=5, target_forwards=4, overlap_sum=3.0, overlap_count=4,
                  accepted_per_round=[2, 1, 2, 0], chosen_k=[2, 2, 2, 2],
                  seconds={"total": 1.5, "draft": 0.5})
    row = {**stats.summary(), "accepted_per_round": [2, 1, 2, 0], "chosen_k": [2, 2, 2, 2],
           "seconds_verify": None, "seconds_prefill": float("nan"), "prompt_id": "p"}  # fmt: skip
    back = Stats.from_row(row)
    assert back.seconds == {"total": 1.5, "draft": 0.5}
    assert (back.emitted, back.alpha, back.accepted_per_round) == (9, 0.75, [2, 1, 2, 0])
    assert back.chosen_k == [2, 2, 2, 2]
