"""Teacher data from conversations: a conversation's tokens through the chat template with the assistant's tokens
marked, or the first user turn with the target's own answer (self-distillation); the target's teacher passes over
such token rows, chunked and cached (specdec.train.head.Teacher)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..autoregressive import autoregressive_generate
from ..draft.head import save_atomically
from ..runtime.models import encode_prompt
from ..sampling import GREEDY
from .head import Teacher, answer_positions, chunked, teacher_pass


def template(tokenizer: PreTrainedTokenizerBase, turns: list[dict], generation_prompt: bool = False) -> torch.Tensor:
    """Token ids (L,) of turns through the chat template."""
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=generation_prompt, return_tensors="pt")
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    return ids[0].long()


def encode(tokenizer: PreTrainedTokenizerBase, turns: list[dict], max_tokens: int | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (L,) of a conversation, through the chat template when the tokenizer has one, and (L,) whether each
    token is an assistant's: from the end of the template's generation prompt to the end of the turn (the template's
    closing tokens included, as the target generates them). Without a template every token counts as an answer."""
    if not tokenizer.chat_template:
        ids = tokenizer("\n".join(t["content"] for t in turns), return_tensors="pt")["input_ids"][0].long()
        return ids[:max_tokens], torch.ones(ids[:max_tokens].shape, dtype=torch.bool)
    ids = template(tokenizer, turns)
    is_answer = torch.zeros(ids.shape, dtype=torch.bool)
    for i, turn in enumerate(turns):
        if turn["role"] != "assistant":
            continue
        start = template(tokenizer, turns[:i], generation_prompt=True).numel()
        if max_tokens is not None and start >= max_tokens:
            break
        end = template(tokenizer, turns[: i + 1]).numel()
        is_answer[start:end] = True
    return ids[:max_tokens], is_answer[:max_tokens]


def self_distilled(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, turns: list[dict],
                   answer_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first user turn and the target's own greedy answer to it (L,), and (L,) whether each token is the
    answer's."""
    prompt = encode_prompt(tokenizer, turns[0]["content"])
    answer = autoregressive_generate(target, prompt, sampling=GREEDY, max_new_tokens=answer_tokens).tokens
    ids = torch.cat([prompt[0], answer.reshape(-1)])
    return ids, torch.arange(ids.numel()) >= prompt.shape[-1]


def token_rows(conversations: Iterable[list[dict]], tokenizer: PreTrainedTokenizerBase, limit: int, max_tokens: int,
               target: PreTrainedModel | None = None, answer_tokens: int = 0
               ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Up to `limit` rows of at most max_tokens from the conversations (chat messages: role, content): token ids (L,)
    and whether each token is an assistant's (L,); with a target and answer_tokens > 0 the text is the first user
    turn and the target's own answer (self-distillation)."""
    for produced, turns in enumerate(conversations):
        if produced == limit:
            return
        if answer_tokens and target is not None:
            ids, is_answer = self_distilled(target, tokenizer, turns, answer_tokens)
            yield ids[:max_tokens], is_answer[:max_tokens]
        else:
            yield encode(tokenizer, turns, max_tokens)


def teacher_data(path: Path, target: PreTrainedModel, rows: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]],
                 chunk: int, top_k: int) -> tuple[Teacher, dict]:
    """The teacher data of the token rows rows() gives (ids (L,), whether each is an assistant's (L,)), cut into
    chunks of `chunk` tokens, with the record of its making (conversations, tokens, seconds); read from `path` when
    it holds them, else made now and saved there (a second head on the same data skips the target's passes)."""
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return Teacher(**saved["teacher"]), saved["record"]
    started, kept, tokens = time.perf_counter(), [], 0
    for ids, is_answer in rows():
        if ids.numel() >= chunk:
            kept.append((ids, *teacher_pass(target, ids, top_k), answer_positions(is_answer)))
            tokens += ids.numel()
    teacher = chunked(kept, chunk)
    record = {"conversations": len(kept), "tokens": tokens, "chunk_tokens": teacher.tokens.numel(),
              "answer_positions": int(teacher.answer.sum()), "seconds": time.perf_counter() - started}
    save_atomically({"teacher": vars(teacher), "record": record}, path)
    return teacher, record
