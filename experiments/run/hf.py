"""Hugging Face generate as a method next to ours (method=hf, conf/hf/): plain, assisted generation with the
pair's draft model (universal assisted generation when the draft has another tokenizer), or prompt lookup. Every option is stated in a generation config of its own, so model
defaults cannot differ between runs, and the draft model's own generation config is never changed."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext

import torch
from omegaconf import DictConfig
from transformers import GenerationConfig, PreTrainedModel

from specdec.metrics import Generation, Stats
from specdec.runtime.attention import as_shipped
from specdec.runtime.timing import stopwatch
from specdec.sampling import Sampling
from specdec.stopping import EosSet, truncate_at_eos

from .pair import Pair


def generation_config(hf: DictConfig, sampling: Sampling, eos: list[int], max_new_tokens: int, pad: int) -> GenerationConfig:
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


def assistant_generation_config(hf: DictConfig) -> GenerationConfig:
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


def universal(pair: Pair, assistant: PreTrainedModel | None) -> dict[str, object]:
    """A draft with another vocabulary: universal assisted generation, given both tokenizers (it re-tokenizes
    the draft's text); none for a draft that shares the target's."""
    drafts_text = assistant is not None and pair.draft_tokenizer is not None and (
        pair.draft_tokenizer.get_vocab() != pair.tokenizer.get_vocab())
    return {"tokenizer": pair.tokenizer, "assistant_tokenizer": pair.draft_tokenizer} if drafts_text else {}


UAG_COPIES: dict[int, PreTrainedModel] = {}  # id of a draft model -> the copy HF's universal assisted generation gets


def uag_assistant(model: PreTrainedModel) -> PreTrainedModel:
    """The draft as Hugging Face's universal assisted generation takes it: a copy, made once per draft. With two
    vocabularies transformers' assistant translator replaces the assistant's output layer in place (restricted to
    the shared tokens), which would break our own loops' later use of the same draft model."""
    if id(model) not in UAG_COPIES:
        UAG_COPIES[id(model)] = copy.deepcopy(model)
    return UAG_COPIES[id(model)]


def hf_generate(
    pair: Pair, ids: torch.Tensor, hf: DictConfig, sampling: Sampling, max_new_tokens: int, seed: int, eos: list[int]
) -> Generation:
    """One Hugging Face generate call, stopping at the eos ids (seeded through torch's global generator, as HF
    samples with it)."""
    pad = eos[0] if eos else pair.target.config.pad_token_id or 0
    config = generation_config(hf, sampling, eos, max_new_tokens, pad)
    ids = ids.to(pair.target.device)  # assisted generation builds the assistant's positions where the ids lie
    assistant = pair.draft_model if hf.assistant else None
    if assistant is not None and universal(pair, assistant):
        assistant = uag_assistant(assistant)
    schedule = assistant_config(assistant, assistant_generation_config(hf)) if assistant is not None else nullcontext()
    stats = Stats()
    torch.manual_seed(seed)
    with shipped(pair.target, assistant), stopwatch(stats.seconds, "total", pair.target.device), \
            torch.inference_mode(), schedule:
        out = pair.target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant,
                                   generation_config=config, **universal(pair, assistant))
    tokens = out[0, ids.shape[-1] :]
    stats.emitted = tokens.numel()
    return Generation(tokens, stats)


def hf_generate_batch(
    pair: Pair, prompts: list[torch.Tensor], hf: DictConfig, sampling: Sampling, max_new_tokens: int, seed: int,
    eos: list[int],
) -> Generation:
    """Hugging Face generate on a batch: the prompts left-padded with an attention mask, one call; each row's new
    tokens up to its first end token. Assisted generation and prompt lookup take one sequence only (transformers
    refuses a batch), so method=hf at batch_size > 1 is plain generate."""
    if hf.assistant or hf.prompt_lookup:
        raise ValueError("Hugging Face assisted generation and prompt lookup do not take a batch (transformers "
                         "refuses batch size > 1): use hf=plain with batch_size > 1")
    pad = eos[0] if eos else pair.target.config.pad_token_id or 0
    config = generation_config(hf, sampling, eos, max_new_tokens, pad)
    width = max(p.shape[-1] for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long, device=pair.target.device)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - p.shape[-1] :], mask[b, width - p.shape[-1] :] = p[0], 1
    stats = Stats()
    torch.manual_seed(seed)
    with shipped(pair.target), stopwatch(stats.seconds, "total", pair.target.device), torch.inference_mode():
        out = pair.target.generate(ids, attention_mask=mask, generation_config=config)
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
