"""The source article's "speculative decoding": draft-then-score. It is not speculative decoding.

Faithful to the article's code: the draft model writes the whole continuation on its own
(`small_model.generate`), the target then runs once over prompt + draft re-tokenized with its own
tokenizer and reports the average log-likelihood of every token after the first; the draft is
returned unchanged, so the output distribution is the draft model's, not the target's.
We add a corrected score: the target's mean log-likelihood of the continuation tokens alone.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .autoregressive import autoregressive_generate
from .checks import batch_rows, batched
from .metrics import Generation, Stats
from .quality import continuation_log_probs, token_log_probs
from .runtime.cached import CachedLM, left_padded
from .runtime.timing import stopwatch
from .sampling import DEFAULT_SAMPLING, Sampling


def article_score(
    target: PreTrainedModel,
    prompt_ids: torch.Tensor,
    draft: torch.Tensor,
    draft_tokenizer: PreTrainedTokenizerBase,
    target_tokenizer: PreTrainedTokenizerBase,
) -> float:
    """The article's number: decode prompt + draft, re-tokenize for the target, mean log p over tokens 2..N."""
    text = draft_tokenizer.decode(torch.cat([prompt_ids[0].cpu(), draft.cpu()]), skip_special_tokens=True)
    ids = target_tokenizer(text, return_tensors="pt")["input_ids"]  # (1, N), prompt included
    return float(token_log_probs(target, ids).mean())


def draft_prompt(
    input_ids: torch.Tensor, draft_tokenizer: PreTrainedTokenizerBase, target_tokenizer: PreTrainedTokenizerBase
) -> torch.Tensor:
    """The prompt (1, L) in the draft's own tokens: its text, as the draft's tokenizer writes it."""
    text = target_tokenizer.decode(input_ids[0].tolist(), skip_special_tokens=True)
    return draft_tokenizer(text, return_tensors="pt")["input_ids"].to(input_ids.device)


def continuation_mean(target: PreTrainedModel, prompt_ids: torch.Tensor, continuation: torch.Tensor) -> float:
    """Corrected score: mean target log-likelihood of the continuation tokens, given the prompt."""
    return float(continuation_log_probs(target, prompt_ids, continuation).mean())


def draft_then_score(
    target: PreTrainedModel,
    draft_model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    sampling: Sampling = DEFAULT_SAMPLING,
    max_new_tokens: int = 64,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    draft_tokenizer: PreTrainedTokenizerBase | None = None,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
) -> Generation:
    """Draft model generates everything; the target scores it once; the draft is the output.

    stats.extras holds `continuation_log_likelihood` (mean over the new tokens, given the prompt)
    and, when both tokenizers are given, the article's `article_log_likelihood`.

    With two different vocabularies (both tokenizers given) the draft writes from the prompt's text in its own
    tokens, until its own end token; the output is its text in the target's tokens: still the draft's text.
    """
    cross = draft_tokenizer is not None and target_tokenizer is not None and (
        draft_tokenizer.get_vocab() != target_tokenizer.get_vocab())
    if batched(input_ids):
        if cross:
            raise ValueError("the article's method across two vocabularies takes one prompt at a time: give a (1, L) "
                             "prompt, or a draft that shares the target's tokenizer for a batch")
        return batched_draft_then_score(target, draft_model, input_ids, sampling=sampling,
                                        max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, generator=generator)
    draft_ids = draft_prompt(input_ids, draft_tokenizer, target_tokenizer) if cross else input_ids
    draft_run = autoregressive_generate(  # the draft model alone: its stats call it the target
        draft_model,
        draft_ids,
        sampling=sampling,
        max_new_tokens=max_new_tokens,
        eos_token_id=draft_tokenizer.eos_token_id if cross else eos_token_id,
        generator=generator,
    )
    tokens = draft_run.tokens  # (N,) the output: the draft, unchanged
    if cross:  # the same text in target tokens, which every score and quality measure reads
        text = draft_tokenizer.decode(tokens.tolist(), skip_special_tokens=True)
        tokens = torch.tensor(target_tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long,
                              device=input_ids.device)[:max_new_tokens]  # fmt: skip
    stats = Stats(
        emitted=draft_run.stats.emitted,
        draft_forwards=draft_run.stats.target_forwards,  # one draft-model pass per new token
        target_forwards=1,  # the article's one scoring pass (our corrected score's pass is a measurement)
        seconds={"draft": draft_run.stats.seconds["total"]},
    )
    faithful = draft_tokenizer is not None and target_tokenizer is not None
    with stopwatch(stats.seconds, "verify", target.device):  # times the one scoring pass the article makes
        if faithful:
            stats.extras["article_log_likelihood"] = article_score(
                target, draft_ids, draft_run.tokens, draft_tokenizer, target_tokenizer
            )
        else:
            stats.extras["continuation_log_likelihood"] = continuation_mean(target, input_ids, tokens)
    if faithful:
        stats.extras["continuation_log_likelihood"] = continuation_mean(target, input_ids, tokens)
    stats.seconds["total"] = stats.seconds["draft"] + stats.seconds["verify"]
    return Generation(tokens, stats)


def batched_draft_then_score(
    target: PreTrainedModel,
    draft_model: PreTrainedModel,
    prompts: list,
    *,
    sampling: Sampling = DEFAULT_SAMPLING,
    max_new_tokens: int = 64,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
) -> Generation:
    """The article's method on a batch (one vocabulary): the draft model writes every row (batched target-only
    decoding of the draft), the target scores all rows in one pass; the drafts are the output.

    Each row's extras hold continuation_log_likelihood (its new tokens' mean log p under the target)."""
    rows = batch_rows(prompts)
    draft_run = autoregressive_generate(draft_model, rows, sampling=sampling, max_new_tokens=max_new_tokens,
                                        eos_token_id=eos_token_id, generator=generator)  # fmt: skip
    stats = Stats(emitted=draft_run.stats.emitted, draft_forwards=draft_run.stats.extras["passes"],
                  target_forwards=1, seconds={"draft": draft_run.stats.seconds["total"]})  # fmt: skip
    with stopwatch(stats.seconds, "verify", target.device):
        scores = batch_continuation_means(target, rows, draft_run.tokens)
    stats.seconds["total"] = stats.seconds["draft"] + stats.seconds["verify"]
    stats.extras.update(passes=1, rows=len(rows))
    for row, score in zip(draft_run.rows, scores):
        row.draft_forwards, row.target_forwards = row.target_forwards, 1
        row.extras["continuation_log_likelihood"] = score
        row.seconds["total"] = stats.seconds["total"]
    return Generation(draft_run.tokens, stats, draft_run.rows, [stats.seconds["total"]] * len(rows))


@torch.inference_mode()
def batch_continuation_means(target: PreTrainedModel, prompts: list[torch.Tensor], continuations: list[torch.Tensor]
                             ) -> list[float]:
    """Mean target log-likelihood of each row's continuation given its prompt, all rows in one pass."""
    lm = CachedLM(target)
    full = [torch.cat([p[0], c.to(p.device)]) for p, c in zip(prompts, continuations)]
    tokens, positions = left_padded(full, [0] * len(full), lm.device)
    logp = lm.forward(tokens, positions).float().log_softmax(-1)  # (B, W, V)
    means = []
    for b, (p, c) in enumerate(zip(prompts, continuations)):
        n = c.numel()
        if n == 0:
            means.append(float("nan"))
            continue
        predicted = logp[b, tokens.shape[1] - n - 1 : tokens.shape[1] - 1]  # (n, V) the positions before each
        means.append(float(predicted.gather(-1, c.to(logp.device)[:, None]).mean()))
    return means
