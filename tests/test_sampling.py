"""Processed distributions: temperature, top-k, top-p, greedy; identical for p and q."""

import pytest
import torch

from specdec.sampling import GREEDY, Sampling, probabilities, sample


def test_temperature_one_is_softmax():
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0])
    assert torch.allclose(probabilities(logits, Sampling(1.0)), logits.softmax(-1))


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0])
    assert torch.allclose(probabilities(logits, Sampling(0.5)), (logits / 0.5).softmax(-1))


def test_greedy_is_one_hot_at_argmax():
    logits = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 4.9]])
    p = probabilities(logits, GREEDY)
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_top_k_keeps_k_tokens_renormalised():
    logits = torch.tensor([0.1, 2.0, 1.0, 3.0, -1.0])
    p = probabilities(logits, Sampling(1.0, top_k=2))
    assert (p > 0).sum() == 2 and p[3] > p[1] > 0
    assert torch.isclose(p.sum(), torch.tensor(1.0))
    assert torch.isclose(p[3] / p[1], torch.exp(torch.tensor(1.0)))


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    kept = probabilities(logits, Sampling(1.0, top_p=0.75)) > 0
    assert kept.tolist() == [True, True, False, False]  # 0.5 < 0.75 <= 0.8
    kept = probabilities(logits, Sampling(1.0, top_p=0.8)) > 0
    assert kept.tolist() == [True, True, False, False]
    kept = probabilities(logits, Sampling(1.0, top_p=0.81)) > 0
    assert kept.tolist() == [True, True, True, False]
    assert (probabilities(logits, Sampling(1.0, top_p=0.01)) > 0).tolist() == [True, False, False, False]


def test_rows_processed_independently():
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    s = Sampling(0.7, top_k=4, top_p=0.9)
    batched = probabilities(logits, s)
    for i in range(3):
        assert torch.allclose(batched[i], probabilities(logits[i], s))


def test_sample_follows_distribution():
    p = torch.tensor([[0.1, 0.6, 0.3]]).expand(20000, 3)
    draws = sample(p, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=3).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.1, 0.6, 0.3]), atol=0.015)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k")],
)
def test_bad_sampling_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sampling(**kwargs)
