"""Speculative sampling, Algorithm 1 of Leviathan et al. (2023); Chen et al. (2023) use the same rule.

Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens.
Each round: the drafter proposes x_1..x_k ~ q; one target pass scores them, giving p_1..p_{k+1};
x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection a token is
drawn from norm(max(0, p_i - q_i)); if all k are accepted a bonus token is drawn from p_{k+1}.
The emitted sequence has exactly the target's distribution.

Both KV caches hold every token of the sequence except the last; a rejection crops them, the
accepted prefix is never recomputed.

The draft length may change from round to round (k="auto": specdec.cost chooses it from measured
costs and past acceptance, 0 meaning a plain target step): a round is exact for any k fixed before
its target distribution is computed, so the output keeps the target's distribution.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .cached import CachedLM
from .checks import check_generation_args
from .cost import CostModel, draft_length_rule
from .drafters import Draft, Drafter, share_cache
from .metrics import Generation, Stats
from .sampling import DEFAULT_SAMPLING, Sampling, probabilities, sample
from .stopping import EosSet, truncate_at_eos
from .timing import stopwatch


def propose(
    drafter: Drafter, sequence: torch.Tensor, k: int, sampling: Sampling, vocab: int, generator: torch.Generator | None
) -> Draft:
    """Up to k draft tokens after sequence (1, L); k = 0 calls no drafter (the round is a plain target step)."""
    if k == 0:
        return Draft.empty(vocab, sequence.device)
    return drafter.propose(sequence, k, sampling, vocab, generator)


def verify(
    target: CachedLM, sequence: torch.Tensor, draft: torch.Tensor, sampling: Sampling, vocab: int
) -> torch.Tensor:
    """One target pass over the unseen tail of sequence plus the draft; returns p_1..p_{k+1} (k+1, V)."""
    logits = target.advance(torch.cat([sequence, draft[None]], dim=-1))  # (m + k, V_target)
    return probabilities(logits[-(draft.numel() + 1) :, :vocab], sampling)


def residual(p_i: torch.Tensor, q_i: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the distribution to resample from after a rejection."""  # (V,)
    r = (p_i - q_i).clamp_min(0.0)
    total = r.sum()
    return r / total if total > 0 else p_i  # p == q up to rounding: nothing to correct


def accept(
    p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, torch.Tensor]:
    """Accept x_i while r_i < p_i(x_i) / q_i(x_i); return n accepted and the target's next token (1,)."""
    k = draft.numel()
    i = torch.arange(k, device=p.device)
    r = torch.rand(k, generator=generator, device=p.device)  # (k,) one uniform per draft token
    kept = r < p[i, draft] / q[i, draft]  # min(1, .) is implied: r < 1
    n = int(kept.long().cumprod(0).sum())  # leading accepts; the round's one host sync
    next_token = sample(residual(p[n], q[n])[None] if n < k else p[k][None], generator)
    return n, next_token


def overlap(p: torch.Tensor, q: torch.Tensor, observed: int) -> torch.Tensor:
    """beta_i = sum_x min(p_i, q_i) at the first `observed` positions (those on the output path)."""  # (observed,)
    return torch.minimum(p[:observed], q[:observed]).sum(dim=-1)


def speculative_generate(
    target: PreTrainedModel,
    drafter: Drafter,
    input_ids: torch.Tensor,
    *,
    k: int | str | CostModel = 4,
    k_max: int = 8,
    sampling: Sampling = DEFAULT_SAMPLING,
    max_new_tokens: int = 64,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Generate up to max_new_tokens after input_ids (1, L) with the target's exact distribution.

    k: draft tokens per round (gamma); "auto" chooses 0..k_max each round with a fresh CostModel; a
    CostModel instance is used as given and keeps its measurements across calls.
    """
    rule = draft_length_rule(k, k_max, drafter)
    check_generation_args(target, input_ids, max_new_tokens, k=k if isinstance(k, int) else None)
    eos = EosSet(eos_token_id)
    stats = Stats()
    lm = CachedLM(target)
    vocab = min(lm.vocab_size, drafter.vocab_size or lm.vocab_size)
    sequence = input_ids.to(lm.device)
    overlap_total = torch.zeros((), device=lm.device)
    with stopwatch(stats.seconds, "total", lm.device):
        with stopwatch(stats.seconds, "prefill", lm.device):
            lm.prefill(sequence)
            share_cache(drafter, lm)
            drafter.start(sequence)
        while stats.emitted < max_new_tokens:
            choice = rule.choose(max_new_tokens - stats.emitted - 1)  # from past rounds; never past the budget
            spent: dict[str, float] = {}
            with stopwatch(spent, "draft", lm.device, rule.clock):
                draft = propose(drafter, sequence, choice.k, sampling, vocab, generator)
            with stopwatch(spent, "verify", lm.device, rule.clock):
                p = verify(lm, sequence, draft.tokens, sampling, vocab)  # (n+1, V)
                n, next_token = accept(p, draft.q, draft.tokens, generator)
            stats.draft_forwards += draft.forwards
            observed = min(n + 1, draft.tokens.numel())
            betas = overlap(p, draft.q, observed)  # (observed,) stays on the device unless the rule reads it
            stats.record_round(draft.tokens.numel(), n, observed)
            stats.record_schedule(choice.k, choice.prediction, n + 1, spent)
            rule.observe(choice.k, draft.tokens.numel(), betas, spent)
            overlap_total += betas.sum()
            new = truncate_at_eos(torch.cat([draft.tokens[:n], next_token]), eos)
            sequence = torch.cat([sequence, new[None]], dim=-1)
            stats.emitted += new.numel()
            if eos.ended(new):
                break
            lm.crop(sequence.shape[-1] - 1)
            drafter.rollback(sequence.shape[-1] - 1)
    stats.overlap_sum = float(overlap_total)
    return Generation(sequence[0, input_ids.shape[-1] :], stats)
