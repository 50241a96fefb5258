"""Where draft tokens come from.

A drafter proposes up to k tokens after the current sequence together with the distribution q
each was sampled from. Speculative sampling is exact only if the tokens really are samples of
the returned q, so a deterministic drafter (n-gram lookup) returns one-hot rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ..runtime.cached import CachedLM, GrowingLayer, logits_width
from ..sampling import Sampling, probabilities, sample
from .proposal import Draft


class ModelDrafter:
    """A small causal LM that samples each draft token from its processed distribution q.

    reads_target_cache=True (for a reduced-precision copy of the target: same layers, heads and head size):
    instead of computing its own states for the prompt and for accepted tokens, the draft takes the
    target's KV cache, cast to its own dtype, and runs only one-token steps. This removes the draft's
    prefill and catch-up passes (on a CPU without native bf16 matmuls a bf16 prompt pass costs several
    target passes) and a k = 0 round costs the draft nothing. q is still the distribution each token is
    sampled from, so speculative sampling stays exact; the draft is then "the copy, reading the target's
    states", a different (usually better aligned) draft than the copy alone. The loop hands the target's
    cache over with `share_cache`; a loop that does not (or a target cache this copy cannot read) leaves
    the drafter computing its own states.
    """

    draft_cost = "per_token"

    def __init__(self, model: PreTrainedModel, reads_target_cache: bool = False):
        self.model = model
        self.vocab_size = logits_width(model)
        self.lm = CachedLM(model)
        self.states = TargetStates(reads_target_cache)

    @property
    def reads_target_cache(self) -> bool:
        return self.states.enabled

    @property
    def target(self) -> CachedLM | None:
        """The target cache read during the current sequence (None: the draft computes its own states)."""
        return self.states.target

    def share_cache(self, target: CachedLM) -> None:
        self.states.offer(self.lm, target)

    def fork(self) -> ModelDrafter:
        """The same weights for another sequence (a batch's row): a cache of its own, reading no target cache."""
        return ModelDrafter(self.model)

    def start(self, prompt: torch.Tensor) -> None:
        self.lm.reset()
        if not self.states.begin():
            self.lm.prefill(prompt)

    def propose(
        self, sequence: torch.Tensor, k: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> Draft:
        if k == 0:
            return Draft.empty(vocab_size, sequence.device)
        self.states.copy_into(self.lm, self.lm.crop)
        tokens, rows = [], []
        logits = self.lm.advance(sequence, last_only=True)[-1, :vocab_size]  # (V,)
        for i in range(k):
            q_i = probabilities(logits, sampling)  # (V,)
            x_i = sample(q_i[None], generator)  # (1,)
            tokens.append(x_i)
            rows.append(q_i)
            if i + 1 < k:
                logits = self.lm.forward(x_i[None])[-1, :vocab_size]
        return Draft(torch.cat(tokens), torch.stack(rows), forwards=k)  # (k,), (k, V)

    def rollback(self, length: int) -> None:
        self.lm.crop(min(length, self.lm.length))  # copied positions beyond it are cropped again by copy_into


class TargetStates:
    """The target's KV cache as a draft model reads it (ModelDrafter, ModelTreeDrafter with reads_target_cache).

    The loop offers its target cache before each sequence (`offer`); `begin` takes the offer for that
    sequence. Before each proposal `copy_into` makes the draft cache hold the target's states for every
    position the target has cached (the sequence but its last token), cast to the draft's dtype; positions
    copied earlier stay (the sequence only grows), the draft's own states for its last proposal are dropped.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.offered: CachedLM | None = None  # the cache the loop handed over for its next sequence
        self.target: CachedLM | None = None  # the cache read during the current sequence
        self.synced = 0  # leading draft-cache positions copied from the target

    def offer(self, draft: CachedLM, target: CachedLM) -> None:
        """Read target during the next sequence, if enabled and the draft's cache can hold its states."""
        if self.enabled and can_read_cache(draft, target):
            self.offered = target

    def begin(self) -> bool:
        """A new sequence: take the cache offered for it, if any; True if the draft reads it."""
        self.target, self.offered, self.synced = self.offered, None, 0
        return self.target is not None

    def copy_into(self, draft: CachedLM, crop: Callable[[int], None]) -> None:
        """Crop draft (with its own crop) to the copied positions and append the target's newer ones."""
        if self.target is None:
            return
        crop(min(self.synced, draft.length))
        append_states(draft, self.target, draft.length)
        self.synced = draft.length


def can_read_cache(draft: CachedLM, target: CachedLM) -> bool:
    """Whether the draft's cache layers can hold the target's states: every layer a full-attention
    GrowingLayer in both (no sliding windows) and the same architecture and sizes (layers, heads, head size)."""
    full = all(type(layer) is GrowingLayer for lm in (draft, target) for layer in lm.cache.layers)
    return same_shapes(draft.model, target.model) and full and draft.device == target.device


def same_shapes(draft: PreTrainedModel, target: PreTrainedModel) -> bool:
    """Whether the draft's layers can hold the target's states: the same architecture, layers, heads, head size."""
    a, b = draft.config.get_text_config(), target.config.get_text_config()
    shape = ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
             "head_dim")
    return all(getattr(a, f, None) == getattr(b, f, None) for f in shape)


@torch.inference_mode()
def append_states(draft: CachedLM, target: CachedLM, start: int) -> None:
    """Append target's cached keys/values at positions [start, target.length) to draft (which holds start)."""
    if target.length <= start:
        return
    dtype = draft.model.get_input_embeddings().weight.dtype
    for mine, theirs in zip(draft.cache.layers, target.cache.layers):
        keys = theirs.keys[..., start : target.length, :].to(dtype)  # (1, H_kv, n, D)
        values = theirs.values[..., start : target.length, :].to(dtype)
        mine.update(keys, values)
    draft.length = target.length
