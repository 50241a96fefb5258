"""Check a composed config before any model loads, and turn its keys into library arguments.

Everything here is cheap: no model, tokenizer or dataset is touched, so a bad value fails in
milliseconds with the accepted choices in the message.
"""

from __future__ import annotations

import re

import torch
from omegaconf import DictConfig

from specdec.models import DTYPES, QUANTIZATIONS
from specdec.sampling import Sampling

METHODS = ("autoregressive", "speculative", "naive")  # autoregressive = target-only baseline
METHOD_CHOICES = ("speculative", "naive", "autoregressive", "all")
DRAFT_KINDS = ("model", "quantized_copy", "truncated_copy", "ngram")
APPLIES_TO = ("target", "draft", "both")
DATASET_SOURCES = ("json", "hub")
LOGGER_KINDS = ("wandb", "none")
WANDB_MODES = ("offline", "online")


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the accepted values."""


def check_choice(value: object, choices: tuple[str, ...], key: str) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not supported; choices: {', '.join(choices)}")


def check_int(value: object, key: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")


def check_optional_int(value: object, key: str, minimum: int) -> None:
    if value is not None:
        check_int(value, key, minimum)


def sampling_of(cfg: DictConfig) -> Sampling:
    """The library's Sampling from temperature, top_k, top_p (its own checks, re-raised as ConfigError)."""
    try:
        temperature, top_p = float(cfg.temperature), float(cfg.top_p)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"temperature and top_p must be numbers, got {cfg.temperature!r}, {cfg.top_p!r}"
        ) from e
    check_int(cfg.top_k, "top_k", 0)
    try:
        return Sampling(temperature=temperature, top_k=cfg.top_k, top_p=top_p)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def has_draft_model(cfg: DictConfig) -> bool:
    """Whether the pair's drafter is a language model (the naive method needs one)."""
    return cfg.model.draft.kind != "ngram"


def methods_of(cfg: DictConfig) -> list[str]:
    """Methods to run, baseline first; method=all drops naive when the draft is not a model."""
    if cfg.method == "all":
        return [m for m in METHODS if m != "naive" or has_draft_model(cfg)]
    return ["autoregressive"] if cfg.method == "autoregressive" else ["autoregressive", cfg.method]


def quantization_of(cfg: DictConfig, role: str) -> str:
    """Quantization the quantization group gives the target or a draft model ("none" if it does not apply)."""
    q = cfg.quantization
    return q.mode if q.applies_to in (role, "both") else "none"


def draft_quantization(cfg: DictConfig) -> str:
    """The draft's effective quantization: a quantized copy keeps its own unless the group overrides it."""
    draft = cfg.model.draft
    if draft.kind == "model":
        return quantization_of(cfg, "draft")
    if draft.kind == "quantized_copy":
        override = quantization_of(cfg, "draft")
        return override if override != "none" else draft.quantization
    return "none"


def check_device(device: str) -> None:
    """cpu, cuda or cuda:N, and CUDA actually present when asked for."""
    if device == "cpu":
        return
    if not re.fullmatch(r"cuda(:\d+)?", str(device)):
        raise ConfigError(f"device={device!r} is not supported; choices: cpu, cuda, cuda:N")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={device} but CUDA is not available here. Run on a GPU machine, or add device=cpu "
            "dtype=float32 (hub pairs are slow on a CPU), or use an offline pair: model=smollm2"
        )
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device={device} but only {torch.cuda.device_count()} CUDA device(s) exist")


def check_model(cfg: DictConfig) -> None:
    model = cfg.model
    for key in ("name", "target", "draft"):
        if key not in model:
            raise ConfigError(f"the model pair config lacks model.{key}; see conf/model/smollm2.yaml")
    draft = model.draft
    check_choice(draft.get("kind"), DRAFT_KINDS, "model.draft.kind")
    if draft.kind == "model" and not draft.get("name"):
        raise ConfigError("model.draft.kind=model needs model.draft.name (a hub id or local folder)")
    if draft.kind == "quantized_copy":
        check_choice(draft.get("quantization"), QUANTIZATIONS, "model.draft.quantization")
        if draft.get("compute_dtype") is not None:
            check_choice(draft.compute_dtype, tuple(DTYPES), "model.draft.compute_dtype")
    if draft.kind == "truncated_copy":
        check_int(draft.get("n_layers"), "model.draft.n_layers", 1)
    if draft.kind == "ngram":
        check_int(draft.get("min_ngram"), "model.draft.min_ngram", 1)
        check_int(draft.get("max_ngram"), "model.draft.max_ngram", draft.min_ngram)


def check_dataset(ds: DictConfig) -> None:
    check_choice(ds.get("source"), DATASET_SOURCES, "dataset.source")
    for key in ("name", "path", "template"):
        if not ds.get(key):
            raise ConfigError(f"dataset.{key} must be set")
    check_optional_int(ds.get("n_prompts"), "dataset.n_prompts", 1)
    check_optional_int(ds.get("n_per_category"), "dataset.n_per_category", 1)
    categories = ds.get("categories")
    if categories is not None and (isinstance(categories, str) or len(categories) == 0):
        raise ConfigError(f"dataset.categories must be a non-empty list or null, got {categories!r}")


def check_logger(logger: DictConfig) -> None:
    check_choice(logger.get("kind"), LOGGER_KINDS, "logger.kind")
    if logger.kind == "wandb":
        check_choice(logger.get("mode"), WANDB_MODES, "logger.mode")


def validate(cfg: DictConfig) -> None:
    """Refuse every value that cannot work, before any model or dataset loads."""
    check_choice(cfg.method, METHOD_CHOICES, "method")
    check_int(cfg.k, "k", 1)
    check_int(cfg.max_new_tokens, "max_new_tokens", 1)
    check_int(cfg.warmup_tokens, "warmup_tokens", 1)
    check_int(cfg.seed, "seed", 0)
    check_optional_int(cfg.get("threads"), "threads", 1)
    sampling_of(cfg)
    check_choice(cfg.dtype, tuple(DTYPES), "dtype")
    check_choice(cfg.quantization.mode, QUANTIZATIONS, "quantization.mode")
    check_choice(cfg.quantization.applies_to, APPLIES_TO, "quantization.applies_to")
    check_choice(cfg.quantization.compute_dtype, tuple(DTYPES), "quantization.compute_dtype")
    check_model(cfg)
    if cfg.method == "naive" and not has_draft_model(cfg):
        raise ConfigError(
            f"method=naive needs a draft model, but model={cfg.model.name} drafts with an n-gram lookup; "
            "use model=smollm2 (or another pair with a draft model), or method=speculative"
        )
    check_dataset(cfg.dataset)
    check_logger(cfg.logger)
    check_device(str(cfg.device))
