"""Input validation with messages that name the fix."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .cached import context_length


def check_prompt(model: PreTrainedModel, input_ids: torch.Tensor, max_new_tokens: int) -> None:
    """One sequence (1, L) (a batch goes through specdec.batch), a non-empty prompt, and room in the model's
    context for the generation."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must have shape (1, L) here, got {tuple(input_ids.shape)}: several prompts "
                         "go as a list or (B, L) with an attention mask to speculative_generate, tree_generate "
                         "or autoregressive_generate")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
    limit = context_length(model)
    if limit is not None and input_ids.shape[1] >= limit:
        raise ValueError(f"the prompt has {input_ids.shape[1]} tokens but the model's context is {limit}: shorten it")
    if limit is not None and input_ids.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) exceeds the model's context "
            f"({limit}): lower max_new_tokens to at most {limit - input_ids.shape[1]}"
        )


def check_generation_args(
    model: PreTrainedModel, input_ids: torch.Tensor, max_new_tokens: int, k: int | None = None
) -> None:
    """Everything a decoding function needs before it touches a model."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if k is not None and k < 1:
        raise ValueError(f"k (draft tokens per step, gamma) must be >= 1, got {k}")
    check_prompt(model, input_ids, max_new_tokens)


def check_counts(**values: object) -> None:
    """Every value an integer >= 1 (a drafter's sizes: n-gram lengths, depths, node budgets); the error names it."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def check_ngram_range(max_ngram: object, min_ngram: object) -> None:
    """Suffix lengths an n-gram lookup tries: integers with 1 <= min_ngram <= max_ngram."""
    check_counts(max_ngram=max_ngram, min_ngram=min_ngram)
    if min_ngram > max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram} > max_ngram={max_ngram}")
