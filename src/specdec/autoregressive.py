"""Target-only decoding with a KV cache: the speedup denominator and the equivalence reference."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .checks import prompt_rows
from .metrics import Generation, Stats, one_sequence
from .runtime.cached import CachedLM
from .runtime.timing import stopwatch
from .sampling import DEFAULT_SAMPLING, Sampling, draw
from .state import Batch
from .stopping import EosSet


def autoregressive_generate(
    target: PreTrainedModel,
    input_ids: torch.Tensor | list,
    *,
    attention_mask: torch.Tensor | None = None,
    sampling: Sampling = DEFAULT_SAMPLING,
    max_new_tokens: int = 64,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> Generation:
    """One target pass per token, sampling from the processed distribution p. Several prompts (a list, or (B, L)
    with attention_mask): one pass of one token per row still generating per step; finished rows leave."""
    prompts, single = prompt_rows(target, input_ids, attention_mask, max_new_tokens)
    lm = CachedLM(target, vocab_size=vocab_size)
    stats = Stats()
    with stopwatch(stats.seconds, "total", lm.device):
        state = Batch(prompts, max_new_tokens, EosSet(eos_token_id), lm.device)  # its clock inside the total's
        with stopwatch(stats.seconds, "prefill", lm.device):
            lm.prefill(state.tokens)
        with stopwatch(stats.seconds, "verify", lm.device):
            stats.extras["passes"] = steps(lm, state, stats, sampling, generator)
    result = state.result(stats)
    return one_sequence(result) if single else result


def steps(lm: CachedLM, state: Batch, stats: Stats, sampling: Sampling, generator: torch.Generator | None) -> int:
    """Decode until every row ended: one pass over each active row's last token per step; the passes made."""
    passes = 0
    while state.active:
        last = torch.cat([s[:, -1:] for s in state.tokens])  # (R, 1)
        logits = lm.forward(last, last_only=True)[:, -1]  # (R, V)
        tokens = draw(logits, sampling, generator)  # (R,)
        passes += 1
        for b in state.order:
            state.stats[b].target_forwards += 1
        stats.target_forwards += len(state.order)
        state.extend([tokens[:0]] * len(state.order), [t[None] for t in tokens])
        still = [i for i, b in enumerate(state.order) if state.row_active(b)]
        if len(still) < len(state.order):
            state.order = [state.order[i] for i in still]
            if state.order:
                lm.select(still)
    return passes
