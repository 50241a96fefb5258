"""Target-only decoding with a KV cache: the speedup denominator and the equivalence reference."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .checks import batch_rows, batched, check_batch, check_generation_args
from .metrics import BatchGeneration, Generation, Stats
from .runtime.batch_cache import BatchedLM
from .runtime.cached import CachedLM
from .runtime.timing import stopwatch
from .sampling import DEFAULT_SAMPLING, Sampling, probabilities, sample
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
) -> Generation | BatchGeneration:
    """One target pass per token, sampling from the processed distribution p. Several prompts (a list, or
    (B, L) with attention_mask): one pass per step for all rows still generating (the batched baseline)."""
    if batched(input_ids, attention_mask):
        return batched_autoregressive(target, batch_rows(input_ids, attention_mask), sampling=sampling,
                                      max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, generator=generator,
                                      vocab_size=vocab_size)  # fmt: skip
    check_generation_args(target, input_ids, max_new_tokens)
    eos = EosSet(eos_token_id)
    stats = Stats()
    lm = CachedLM(target, vocab_size=vocab_size, rollback=False)
    sequence = input_ids.to(lm.device)
    new = []
    with stopwatch(stats.seconds, "total", lm.device):
        with stopwatch(stats.seconds, "prefill", lm.device):
            lm.prefill(sequence)
        last = sequence[:, -1:]  # (1, 1)
        with stopwatch(stats.seconds, "verify", lm.device):
            while len(new) < max_new_tokens:
                p = probabilities(lm.forward(last)[-1:], sampling)  # (1, V)
                token = sample(p, generator)  # (1,)
                new.append(token)
                stats.target_forwards += 1
                if eos.ended(token):
                    break
                last = token[None]
    stats.emitted = len(new)
    return Generation(torch.cat(new), stats)


def batched_autoregressive(
    target: PreTrainedModel,
    prompts: list[torch.Tensor],
    *,
    sampling: Sampling = DEFAULT_SAMPLING,
    max_new_tokens: int = 64,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> BatchGeneration:
    """Target-only decoding of B rows: one pass of one token per active row per step; finished rows leave."""
    check_batch(target, prompts, max_new_tokens)
    lm = BatchedLM(target, vocab_size=vocab_size)
    state = Batch(prompts, max_new_tokens, EosSet(eos_token_id), lm.device)
    stats = Stats()
    with stopwatch(stats.seconds, "total", lm.device):
        with stopwatch(stats.seconds, "prefill", lm.device):
            lm.prefill(state.tokens)
        with stopwatch(stats.seconds, "verify", lm.device):
            passes = 0
            while state.active:
                last = torch.cat([s[:, -1:] for s in state.tokens])  # (R, 1)
                logits = lm.forward(last, lm.lengths()[:, None], last_only=True)[:, -1]
                tokens = sample(probabilities(logits, sampling), generator)  # (R,)
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
    stats.extras["passes"] = passes
    return state.result(stats)
