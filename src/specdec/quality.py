"""Output quality: target log-likelihood of a continuation, agreement with greedy output (of one output, and of
several loops' outputs with a reference's: check_identical), diversity."""

from __future__ import annotations

from collections import Counter

import torch
from transformers import PreTrainedModel

ROWS = 64  # rows of the output layer run at a time (token_log_probs)


@torch.inference_mode()
def token_log_probs(model: PreTrainedModel, ids: torch.Tensor, last: int = 0) -> torch.Tensor:
    """log p_model(ids[t] | ids[:t]) for t = 1..L-1 (last > 0: for the last `last` tokens only), one forward pass.
    The pass keeps its final hidden states, not its logits; the output layer then runs over ROWS of them at a time,
    each block normalized and read at its tokens before the next: a (ROWS, V) block in memory instead of (L, V)
    (a 300-token text's logits and their copies were about 0.2 GB for SmolLM2's 49k vocabulary)."""
    ids = ids.to(model.device)  # (1, L) -> (L-1,) or (last,)
    length = ids.shape[-1]
    first = length - (last or length - 1)  # the first scored position
    hidden = model(input_ids=ids, use_cache=False, logits_to_keep=1, output_hidden_states=True).hidden_states[-1]
    rows, scored = hidden[0, first - 1 : length - 1], ids[0, first:, None]  # the rows that predict the scored tokens
    head = model.get_output_embeddings()
    return torch.cat([output_logits(model, head(block)).float().log_softmax(-1).gather(-1, tokens).squeeze(-1)
                      for block, tokens in zip(rows.split(ROWS), scored.split(ROWS))] or [hidden.new_zeros(0)])


def output_logits(model: PreTrainedModel, logits: torch.Tensor) -> torch.Tensor:
    """What the model's forward does to its output layer's product: Gemma 2's soft cap (final_logit_softcapping)."""
    cap = getattr(model.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def continuation_log_probs(
    model: PreTrainedModel, prompt_ids: torch.Tensor, continuation: torch.Tensor
) -> torch.Tensor:
    """Per-token log-probabilities (n,) of continuation (n,) given prompt (1, L), under the model."""
    if continuation.numel() == 0:
        return torch.zeros(0)
    ids = torch.cat([prompt_ids.to(model.device), continuation.to(model.device)[None]], dim=-1)
    return token_log_probs(model, ids, last=continuation.numel())


def negative_log_likelihood(model: PreTrainedModel, prompt_ids: torch.Tensor, continuation: torch.Tensor) -> float:
    """Mean negative log-likelihood per continuation token under the model (nats)."""
    lp = continuation_log_probs(model, prompt_ids, continuation)
    return float(-lp.mean()) if lp.numel() else float("nan")


def agreement(tokens: torch.Tensor, reference: torch.Tensor) -> float:
    """Fraction of positions, up to the first difference, on which tokens matches reference (1.0 = identical)."""
    n = max(tokens.numel(), reference.numel())
    parted_at = first_difference(tokens.tolist(), reference.tolist())
    return 1.0 if parted_at is None else parted_at / n


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (length mismatch counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_identical(outputs: dict[str, dict[str, list[int]]], reference: str = "ar") -> dict:
    """Greedy decoding is deterministic and lossless: every loop must emit the reference's tokens; outputs: each loop's
    tokens by input. The mismatches name the loop (`contender`), the input (`prompt`) and the first difference.
    The agreements: each loop's mean over inputs of its agreement with the reference (specdec.quality.agreement)."""
    mismatches, agreements = [], {}
    for name, per_input in outputs.items():
        shares = []
        for key, tokens in per_input.items():
            theirs = outputs[reference][key]
            at = first_difference(list(tokens), list(theirs))
            shares.append(agreement(torch.as_tensor(tokens), torch.as_tensor(theirs)))
            if at is not None:
                mismatches.append({"contender": name, "prompt": key, "first_difference": at})
        agreements[name] = sum(shares) / len(shares) if shares else float("nan")
    return {"identical": not mismatches, "reference": reference, "mismatches": mismatches, "agreement": agreements}


def distinct_n(tokens: list[int], n: int = 2) -> float:
    """Distinct n-grams / n-grams: low values mean repetitive text."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def repetition_rate(tokens: list[int], n: int = 4) -> float:
    """Share of n-grams that already occurred earlier in the same text."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return float("nan")
    repeats = sum(c - 1 for c in Counter(grams).values())
    return repeats / len(grams)


def output_quality(target: PreTrainedModel, prompt_ids: torch.Tensor, tokens: torch.Tensor,
                   reference: torch.Tensor | None = None) -> dict[str, float | None]:
    """An output's quality: the target's NLL per token, agreement with the target's greedy output (reference; None
    without one) and the index of the first token where the two part (None: identical, or no reference), and
    diversity. prompt_ids (1, L), tokens and reference (n,)."""
    as_list = tokens.tolist()
    return {
        "nll": negative_log_likelihood(target, prompt_ids, tokens),
        "agreement": None if reference is None else agreement(tokens, reference),
        "parted_at": None if reference is None else first_difference(as_list, reference.tolist()),
        "distinct_2": distinct_n(as_list, 2),
        "repetition_4": repetition_rate(as_list, 4),
    }
