"""Input validation with messages that name the fix."""

from __future__ import annotations

from collections.abc import Sequence as Rows

import torch
from transformers import PreTrainedModel

from .runtime.cached import context_length


def check_prompt(model: PreTrainedModel, input_ids: torch.Tensor, max_new_tokens: int) -> None:
    """One sequence (1, L) (a batch goes through specdec.state), a non-empty prompt, and room in the model's
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


def batched(input_ids: torch.Tensor | Rows, attention_mask: torch.Tensor | None = None) -> bool:
    """Several prompts: a list, a tensor of other than one row, or any tensor with an attention mask."""
    return not isinstance(input_ids, torch.Tensor) or attention_mask is not None or (
        input_ids.dim() == 2 and input_ids.shape[0] != 1)


def batch_rows(input_ids: torch.Tensor | Rows, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The prompts as rows (1, L_b): a list of token id lists or 1D tensors, or a (B, L) tensor with an
    attention mask of 1 for tokens and 0 for padding (left or right padding; no holes)."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (B, L), got {tuple(input_ids.shape)}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"the attention mask has shape {tuple(attention_mask.shape)} but input_ids "
                             f"{tuple(input_ids.shape)}: give one mask entry (1 token, 0 padding) per token")
        if not ((attention_mask == 0) | (attention_mask == 1)).all():
            raise ValueError("the attention mask must hold only 0 (padding) and 1 (a token)")
        rows = []
        for b, (ids, mask) in enumerate(zip(input_ids, attention_mask.bool())):
            where = mask.nonzero().flatten()
            if where.numel() and int(where[-1] - where[0]) + 1 != where.numel():
                raise ValueError(f"row {b} of the attention mask has padding between tokens: pad on the left "
                                 "or on the right only")
            rows.append(ids[mask])
    else:
        rows = [torch.as_tensor(r, dtype=torch.long).flatten() for r in input_ids]
    if not rows:
        raise ValueError("the batch is empty (batch size 0): give at least one prompt")
    for b, row in enumerate(rows):
        if row.numel() == 0:
            raise ValueError(f"prompt {b} is empty: give at least one token (e.g. the BOS token)")
    return [row[None] for row in rows]


def check_batch(model: PreTrainedModel, prompts: list[torch.Tensor], max_new_tokens: int) -> None:
    """Room in the model's context for every row's generation."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    limit = context_length(model)
    longest = max(p.shape[-1] for p in prompts)
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(f"the longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                         f"context ({limit}): lower max_new_tokens to at most {limit - longest}")


def prompt_rows(model: PreTrainedModel, input_ids: torch.Tensor | Rows, attention_mask: torch.Tensor | None,
                max_new_tokens: int) -> tuple[list[torch.Tensor], bool]:
    """The prompts as rows (1, L_b), checked, and whether the call was for one sequence (a (1, L) tensor)."""
    if not batched(input_ids, attention_mask):
        check_generation_args(model, input_ids, max_new_tokens)
        return [input_ids], True
    prompts = batch_rows(input_ids, attention_mask)
    check_batch(model, prompts, max_new_tokens)
    return prompts, False
