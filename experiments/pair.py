"""Load a model pair from its config: the target, a drafter for speculative decoding, and the
draft model the naive method generates with."""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec.drafters import Drafter, ModelDrafter, NGramDrafter
from specdec.models import check_tokenizers, layer_truncated_copy, load_model, load_tokenizer

from .schema import DraftKind
from .settings import draft_quantization, quantization_of

log = logging.getLogger(__name__)
LOADED: dict[str, Pair] = {}  # at most one pair, kept between the jobs of a sweep
CONF_MODELS = Path(__file__).resolve().parents[1] / "conf" / "model"


@dataclass
class Pair:
    """Everything a run needs from the models, loaded once."""

    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    drafter: Drafter  # what speculative_generate drafts with
    draft_model: PreTrainedModel | None  # what the naive method generates with (None for n-gram)
    draft_tokenizer: PreTrainedTokenizerBase | None
    target_quantization: str
    draft_quantization: str

    @property
    def eos_token_id(self) -> list[int]:
        """End-of-sequence ids of the target's generation config and tokenizer."""
        ids = self.target.generation_config.eos_token_id
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return sorted(set(ids))

    def weights_mb(self, method: str) -> float:
        """Weights the method needs in memory: the target alone, or target and draft model."""
        models = [self.target] if method == "autoregressive" else [self.target, self.draft_model]
        return sum(m.get_memory_footprint() for m in models if m is not None) / 2**20


def offline_pairs() -> list[str]:
    """Names of the model pairs in conf/model/ that need no network."""
    return sorted(p.stem for p in CONF_MODELS.glob("*.yaml") if "offline:" in p.read_text())


def warn_if_gated(spec: DictConfig) -> None:
    """A gated model without a Hub token will fail to download: say how to log in before trying."""
    from huggingface_hub import get_token

    if spec.get("gated") and get_token() is None:
        log.warning(
            "%s is gated: accept its license at https://huggingface.co/%s and log in with `hf auth login` "
            "(or set HF_TOKEN). Offline pairs: %s",
            spec.name,
            spec.name,
            ", ".join(offline_pairs()),
        )


@contextmanager
def offline_hint() -> Iterator[None]:
    """A model or tokenizer that cannot be fetched: add the offline pairs to the library's message."""
    try:
        yield
    except OSError as e:
        raise OSError(f"{e}\nOffline model pairs (no network needed): {', '.join(offline_pairs())}") from e


def load(name: str, cfg: DictConfig, quantization: str, compute_dtype: str | None) -> PreTrainedModel:
    """load_model with the run's device and dtype."""
    with offline_hint():
        return load_model(
            name, dtype=cfg.dtype, device=cfg.device, quantization=quantization, compute_dtype=compute_dtype
        )


def tokenizer_of(name: str) -> PreTrainedTokenizerBase:
    with offline_hint():
        return load_tokenizer(name)


def draft_compute_dtype(cfg: DictConfig) -> str | None:
    """The group's compute dtype when it quantizes the draft, else the copy's own."""
    if quantization_of(cfg, "draft") != "none" or cfg.model.draft.kind == DraftKind.MODEL:
        return cfg.quantization.compute_dtype
    return cfg.model.draft.compute_dtype


Loaded = tuple[PreTrainedModel | None, PreTrainedTokenizerBase | None]  # (draft model, its tokenizer)


def no_draft_model(cfg: DictConfig, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Loaded:
    return None, None


def truncated_copy(cfg: DictConfig, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Loaded:
    return layer_truncated_copy(target, cfg.model.draft.n_layers), tokenizer


def quantized_copy(cfg: DictConfig, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Loaded:
    return load(cfg.model.target.name, cfg, draft_quantization(cfg), draft_compute_dtype(cfg)), tokenizer


def second_model(cfg: DictConfig, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Loaded:
    """A second model; its tokenizer must be the target's."""
    spec = cfg.model.draft
    warn_if_gated(spec)
    draft_tokenizer = tokenizer_of(spec.name)
    check_tokenizers(tokenizer, draft_tokenizer, cfg.model.target.name, spec.name)
    return load(spec.name, cfg, draft_quantization(cfg), draft_compute_dtype(cfg)), draft_tokenizer


LOAD_DRAFT: dict[DraftKind, Callable[[DictConfig, PreTrainedModel, PreTrainedTokenizerBase], Loaded]] = {
    DraftKind.MODEL: second_model,
    DraftKind.QUANTIZED_COPY: quantized_copy,
    DraftKind.TRUNCATED_COPY: truncated_copy,
    DraftKind.NGRAM: no_draft_model,
}


def load_pair(cfg: DictConfig) -> Pair:
    """Target, draft model and drafter as the (validated) config names them."""
    spec = cfg.model
    warn_if_gated(spec.target)
    target_quantization = quantization_of(cfg, "target")
    target = load(spec.target.name, cfg, target_quantization, cfg.quantization.compute_dtype)
    tokenizer = tokenizer_of(spec.target.name)
    draft_model, draft_tokenizer = LOAD_DRAFT[DraftKind(spec.draft.kind)](cfg, target, tokenizer)
    if draft_model is None:
        drafter: Drafter = NGramDrafter(max_ngram=spec.draft.max_ngram, min_ngram=spec.draft.min_ngram)
    else:
        drafter = ModelDrafter(draft_model)
    return Pair(
        target, tokenizer, drafter, draft_model, draft_tokenizer, target_quantization, draft_quantization(cfg)
    )


def pair_key(cfg: DictConfig) -> str:
    """The effective settings that decide which weights load (sweeps over k or temperature share one)."""
    target_quantization = quantization_of(cfg, "target")
    key = {
        "target": cfg.model.target.name,
        "target_quantization": target_quantization,
        "target_compute_dtype": cfg.quantization.compute_dtype if target_quantization != "none" else None,
        "draft": {
            k: v for k, v in cfg.model.draft.items() if k not in ("quantization", "compute_dtype", "gated")
        },
        "draft_quantization": draft_quantization(cfg),
        "draft_compute_dtype": draft_compute_dtype(cfg),
        "device": cfg.device,
        "dtype": cfg.dtype,
    }
    return json.dumps(key, sort_keys=True, default=str)


def load_pair_once(cfg: DictConfig) -> Pair:
    """load_pair, reusing the pair of the previous job when the effective settings are the same."""
    key = pair_key(cfg)
    if key not in LOADED:
        LOADED.clear()  # free the previous pair before loading the next one
        gc.collect()
        if str(cfg.device).startswith("cuda"):
            torch.cuda.empty_cache()
        LOADED[key] = load_pair(cfg)
    return LOADED[key]
