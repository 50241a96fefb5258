"""The accept / resample / bonus step on hand-built distributions with known outcomes."""

import torch
from scipy.stats import chisquare

from specdec.sampling import GREEDY, probabilities
from specdec.verify.token import accept, residual


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def one_hot(i, v=4):
    return torch.nn.functional.one_hot(torch.tensor(i), v).float()


def test_identical_p_and_q_accepts_everything_and_draws_bonus():
    q = torch.tensor([[0.25, 0.25, 0.25, 0.25]] * 3)
    p = torch.cat([q, one_hot(2)[None]])  # bonus distribution puts all mass on token 2
    for seed in range(20):
        n, nxt = accept(p, q, torch.tensor([0, 1, 3]), gen(seed))
        assert n == 3 and nxt.tolist() == [2]


def test_token_with_zero_target_probability_is_always_rejected():
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    q = torch.tensor([[0.9, 0.1, 0.0, 0.0]])
    for seed in range(50):
        n, nxt = accept(p, q, torch.tensor([0]), gen(seed))  # token id 0 is a real token
        assert n == 0
        assert nxt.item() in (1, 2)  # residual max(0, p - q) = [0, 0.4, 0.5, 0]


def test_residual_is_normalised_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    p = torch.tensor([0.4, 0.4, 0.2])
    q = torch.tensor([0.1, 0.2, 0.7])
    assert torch.allclose(residual(p, q), torch.tensor([0.6, 0.4, 0.0]))


def test_acceptance_probability_is_ratio():
    p = torch.tensor([[0.3, 0.7], [0.5, 0.5]])
    q = torch.tensor([[0.6, 0.4]])
    g = gen()
    accepted = sum(accept(p, q, torch.tensor([0]), g)[0] for _ in range(20000))
    assert abs(accepted / 20000 - 0.5) < 0.015  # min(1, 0.3 / 0.6)


def test_first_rejection_stops_and_later_positions_are_ignored():
    p = torch.stack([one_hot(1), one_hot(0), one_hot(0), one_hot(3)])
    q = torch.stack([one_hot(1), one_hot(2), one_hot(0)])
    n, nxt = accept(p, q, torch.tensor([1, 2, 0]), gen())
    assert n == 1 and nxt.tolist() == [0]  # position 2 rejected, resampled from p_2 - q_2 -> token 0


def test_greedy_accepts_iff_draft_is_target_argmax():
    target_logits = torch.tensor([[0.1, 2.0, 1.9, 0.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    p = probabilities(target_logits, GREEDY)
    draft = torch.tensor([1, 2])
    q = torch.stack([one_hot(1), one_hot(2)])
    n, nxt = accept(p, q, draft, gen())
    assert n == 1 and nxt.tolist() == [0]  # 2 is not argmax of p_2 (0 is); softmax ratios play no part


def test_single_step_output_has_target_distribution():
    """Draft x ~ q, then accept/resample: the emitted token is distributed as p (k = 1)."""
    p1 = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q1 = torch.tensor([0.4, 0.3, 0.2, 0.1])
    p = torch.stack([p1, torch.tensor([0.25] * 4)])
    g = gen(1)
    counts = torch.zeros(4)
    n_trials = 20000
    for _ in range(n_trials):
        x = torch.multinomial(q1, 1, generator=g)
        n, nxt = accept(p, q1[None], x, g)
        counts[x if n == 1 else nxt] += 1
    assert chisquare(counts.numpy(), (p1 * n_trials).numpy()).pvalue > 1e-3
    assert chisquare(counts.numpy(), (q1 * n_trials).numpy()).pvalue < 1e-12  # the test has power


def test_uniform_draws_are_not_reused_across_calls():
    """Reseeding inside the loop would make every acceptance test draw the same number."""
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[0.25, 0.75]])  # token 1: accept with prob 2/3
    g = gen()
    outcomes = {accept(p, q, torch.tensor([1]), g)[0] for _ in range(50)}
    assert outcomes == {0, 1}
