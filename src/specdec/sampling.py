"""Logits -> processed probabilities, applied identically to the target (p) and the draft (q).

Speculative sampling is exact only when p and q are the distributions the caller actually wants
to sample from: temperature, top-k and top-p must be applied to both the same way. Temperature 0
means greedy decoding; its processed distribution is the one-hot vector at the argmax, which turns
the rejection rule into "accept iff the draft token is the target's argmax".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How to turn logits into a distribution.

    temperature: 0 for greedy, otherwise > 0.
    top_k: keep the k most likely tokens; 0 disables.
    top_p: keep the smallest set of tokens whose mass reaches top_p; 1.0 disables.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling(temperature=0.0)
DEFAULT_SAMPLING = Sampling()  # temperature 1, no truncation


def keep_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Set every logit below the k-th largest to -inf."""  # logits: (..., V)
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def keep_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest prefix of sorted tokens whose mass reaches top_p."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    mass_before = cumulative - sorted_logits.softmax(dim=-1)  # mass of strictly more likely tokens
    drop_sorted = mass_before >= top_p  # the most likely token is always kept
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    """The greedy distribution: all mass on the argmax."""  # (..., V)
    probs = torch.zeros_like(logits, dtype=torch.float32)
    return probs.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Processed distribution over the vocabulary, float32, rows sum to 1."""  # (..., V) -> (..., V)
    if sampling.greedy:
        return one_hot_argmax(logits)
    scaled = logits.float() / sampling.temperature
    filtered = keep_top_p(keep_top_k(scaled, sampling.top_k), sampling.top_p)
    return filtered.softmax(dim=-1)


def draw(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row from the processed distribution of logits (n, V): greedy, its argmax (what `sample`
    draws from the one-hot, without building the one-hot and its float64 CDF over the vocabulary, and without a
    uniform); else `sample` of `probabilities`."""  # (n, V) -> (n,)
    if sampling.greedy:
        return logits.argmax(dim=-1)
    return sample(probabilities(logits, sampling), generator)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row by inverting the CDF: one uniform per row, float64 sums.

    Exact up to float64 rounding, and zero-probability tokens are never drawn. torch.multinomial draws
    one exponential per vocabulary entry instead: ~3 ms per token for V = 49152 on a CPU core.
    """  # (n, V) -> (n,)
    cdf = probs.double().cumsum(dim=-1)  # (n, V)
    u = torch.rand(probs.shape[0], 1, dtype=torch.float64, device=probs.device, generator=generator)
    total = cdf[:, -1:].contiguous()  # (n, 1)
    drawn = torch.searchsorted(cdf, u * total, right=True)  # first index with cdf > u * total
    last_positive = torch.searchsorted(cdf, total)  # first index with cdf >= total
    return torch.minimum(drawn, last_positive).squeeze(-1)  # u * total rounded up to total would step past V
