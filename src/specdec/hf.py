"""Hugging Face generate as a method next to ours, the outside reference: plain, assisted generation with a draft
model (universal assisted generation when the draft has another tokenizer), or prompt lookup. Every option is stated
in a generation config of its own, so model defaults cannot differ between runs, and the draft model's own generation
config is never changed."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from .metrics import Generation, Stats
from .runtime.attention import as_shipped
from .runtime.timing import stopwatch
from .sampling import Sampling
from .stopping import EosSet, truncate_at_eos


@dataclass(frozen=True)
class HFOptions:
    """How Hugging Face generates (conf/hf/): None leaves a setting at Hugging Face's default."""

    assistant: bool = False  # assisted generation with the draft model
    prompt_lookup: int | None = None  # prompt_lookup_num_tokens; None: no prompt lookup
    num_assistant_tokens: int | None = None  # draft tokens per round
    schedule: str | None = None  # num_assistant_tokens_schedule
    confidence_threshold: float | None = None  # assistant_confidence_threshold


PLAIN = HFOptions()  # plain generate


def generation_config(hf: HFOptions, sampling: Sampling, eos: list[int], max_new_tokens: int, pad: int
                      ) -> GenerationConfig:
    """The target's generation config: sampling as ours, the budget, end tokens and prompt lookup."""
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=not sampling.greedy,
        eos_token_id=eos or None, pad_token_id=pad, prompt_lookup_num_tokens=hf.prompt_lookup,
    )  # fmt: skip
    if sampling.greedy:
        config.update(temperature=None, top_k=None, top_p=None)
    else:
        config.update(temperature=sampling.temperature, top_k=sampling.top_k or None, top_p=sampling.top_p)
    return config


def assistant_generation_config(hf: HFOptions) -> GenerationConfig:
    """The assistant's schedule: the draft length, its schedule and confidence threshold (None: HF's defaults)."""
    options = {
        "num_assistant_tokens": hf.num_assistant_tokens,
        "num_assistant_tokens_schedule": hf.schedule,
        "assistant_confidence_threshold": hf.confidence_threshold,
    }
    return GenerationConfig(**{key: value for key, value in options.items() if value is not None})


@contextmanager
def assistant_config(model: PreTrainedModel, config: GenerationConfig) -> Iterator[None]:
    """HF reads (and, with the heuristic schedule, writes) the assistant's schedule in model.generation_config:
    give it `config` for the call and put the model's own back afterwards."""
    own, model.generation_config = model.generation_config, config
    try:
        yield
    finally:
        model.generation_config = own


def universal(tokenizer: PreTrainedTokenizerBase | None, draft_tokenizer: PreTrainedTokenizerBase | None,
              assistant: PreTrainedModel | None) -> dict[str, object]:
    """A draft with another vocabulary: universal assisted generation, given both tokenizers (it re-tokenizes
    the draft's text); none for a draft that shares the target's."""
    drafts_text = assistant is not None and draft_tokenizer is not None and (
        draft_tokenizer.get_vocab() != tokenizer.get_vocab())
    return {"tokenizer": tokenizer, "assistant_tokenizer": draft_tokenizer} if drafts_text else {}


UAG_COPIES: dict[int, PreTrainedModel] = {}  # id of a draft model -> the copy HF's universal assisted generation gets


def uag_assistant(model: PreTrainedModel) -> PreTrainedModel:
    """The draft as Hugging Face's universal assisted generation takes it: a copy, made once per draft. With two
    vocabularies transformers' assistant translator replaces the assistant's output layer in place (restricted to
    the shared tokens), which would break our own loops' later use of the same draft model."""
    if id(model) not in UAG_COPIES:
        UAG_COPIES[id(model)] = copy.deepcopy(model)
    return UAG_COPIES[id(model)]


def hf_generate(
    target: PreTrainedModel, ids: torch.Tensor | list[torch.Tensor], *, sampling: Sampling, max_new_tokens: int,
    seed: int, eos_token_id: list[int], options: HFOptions = PLAIN, draft: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None, draft_tokenizer: PreTrainedTokenizerBase | None = None,
) -> Generation:
    """Hugging Face generate after ids (1, L), stopping at the eos ids, seeded through torch's global generator (as HF
    samples with it); a list of prompts (1, L_b) is one batch (generate_batch). draft: the assistant of
    options.assistant; tokenizer and draft_tokenizer: the target's and the draft's, for a draft with another
    vocabulary."""
    if isinstance(ids, list):
        return generate_batch(target, ids, options, sampling, max_new_tokens, seed, eos_token_id)
    pad = eos_token_id[0] if eos_token_id else target.config.pad_token_id or 0
    config = generation_config(options, sampling, eos_token_id, max_new_tokens, pad)
    ids = ids.to(target.device)  # assisted generation builds the assistant's positions where the ids lie
    assistant = draft if options.assistant else None
    if assistant is not None and universal(tokenizer, draft_tokenizer, assistant):
        assistant = uag_assistant(assistant)
    schedule = assistant_config(assistant, assistant_generation_config(options)) if assistant is not None else \
        nullcontext()
    stats = Stats()
    torch.manual_seed(seed)
    with shipped(target, assistant), stopwatch(stats.seconds, "total", target.device), torch.inference_mode(), \
            schedule:
        out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant,
                              generation_config=config, **universal(tokenizer, draft_tokenizer, assistant))
    tokens = out[0, ids.shape[-1] :]
    stats.emitted = tokens.numel()
    return Generation(tokens, stats)


def generate_batch(
    target: PreTrainedModel, prompts: list[torch.Tensor], hf: HFOptions, sampling: Sampling, max_new_tokens: int,
    seed: int, eos: list[int],
) -> Generation:
    """Hugging Face generate on a batch: the prompts left-padded with an attention mask, one call; each row's new
    tokens up to its first end token. Assisted generation and prompt lookup take one sequence only (transformers
    refuses a batch), so method=hf at batch_size > 1 is plain generate."""
    if hf.assistant or hf.prompt_lookup:
        raise ValueError("Hugging Face assisted generation and prompt lookup do not take a batch (transformers "
                         "refuses batch size > 1): use hf=plain with batch_size > 1")
    pad = eos[0] if eos else target.config.pad_token_id or 0
    config = generation_config(hf, sampling, eos, max_new_tokens, pad)
    width = max(p.shape[-1] for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long, device=target.device)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - p.shape[-1] :], mask[b, width - p.shape[-1] :] = p[0], 1
    stats = Stats()
    torch.manual_seed(seed)
    with shipped(target), stopwatch(stats.seconds, "total", target.device), torch.inference_mode():
        out = target.generate(ids, attention_mask=mask, generation_config=config)
    tokens = [truncate_at_eos(row, EosSet(eos)) for row in out[:, width:]]
    rows = [Stats(emitted=t.numel(), seconds={"total": stats.seconds["total"]}) for t in tokens]
    stats.emitted = sum(t.numel() for t in tokens)
    stats.extras.update(passes=out.shape[-1] - width, rows=len(prompts))
    return Generation(tokens, stats, rows, [stats.seconds["total"]] * len(prompts))


@contextmanager
def shipped(*models: PreTrainedModel | None) -> Iterator[None]:
    """Hugging Face's generate on the models' own attention and linears, not the compiled runtime's (the outside
    reference); None: no model."""
    with ExitStack() as stack:
        for model in models:
            if model is not None:
                stack.enter_context(as_shipped(model))
        yield
