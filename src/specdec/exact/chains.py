"""Small exact objects for the notebooks and tests: exact sequence distributions of tiny models by
enumeration, total-variation distance, empirical histograms, one round on fixed distributions; for
token trees, the exact output distribution of a tree rule (enumerating the drafting and every
accept/reject) and one round on a random toy tree.

Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ..draft.proposal import Draft
from ..sampling import Sampling, probabilities, sample
from ..verify.token import accept

Conditional = Callable[[tuple[int, ...]], torch.Tensor]  # tokens after the round's start -> (V,)


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

    Drafts k tokens from q and applies specdec.verify.token.accept (or an acceptance rule of the loop, e.g.
    specdec.BlockVerification()); emits accepted + 1 tokens.
    """
    draft = sample(q.expand(k, -1), generator)  # (k,)
    if acceptance is not None:
        path, next_token = acceptance.accept(p.expand(k + 1, -1), Draft(draft, q.expand(k, -1)), generator)
        return torch.cat([draft[: len(path)], next_token])
    n, next_token = accept(p.expand(k + 1, -1), q.expand(k, -1), draft, generator)
    return torch.cat([draft[:n], next_token])


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
