"""Target-only decoding with a KV cache: the speedup denominator and the equivalence reference."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .batch import BatchGeneration, batch_rows, batched, batched_autoregressive
from .cached import CachedLM
from .checks import check_generation_args
from .metrics import Generation, Stats
from .sampling import DEFAULT_SAMPLING, Sampling, probabilities, sample
from .stopping import EosSet
from .timing import stopwatch


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
