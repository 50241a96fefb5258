"""Check a composed config before any model loads, and turn its keys into library arguments.

What is allowed is declared once, in experiments/schema.py; `check_node` reads it. Everything here is
cheap: no model, tokenizer or dataset is touched, so a bad value fails in milliseconds with the
accepted choices in the message.
"""

from __future__ import annotations

import dataclasses
import re

import torch
from omegaconf import DictConfig, OmegaConf

from specdec.sampling import Sampling

from .schema import (
    DRAFT_NEEDS,
    TREE_NEEDS,
    TREE_NEEDS_DRAFT_MODEL,
    DraftKind,
    Method,
    RunConfig,
    TreeKind,
)

BASELINE = Method.AUTOREGRESSIVE.value


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the accepted values."""


def check_choice(value: object, choices: tuple[str, ...], key: str) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not supported; choices: {', '.join(choices)}")


def check_int(value: object, key: str, minimum: int, also: tuple[str, ...] = ()) -> None:
    if value in also:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        accepted = "".join(f" or {a!r}" for a in also)
        raise ConfigError(f"{key} must be an integer >= {minimum}{accepted}, got {value!r}")


def check_node(node: DictConfig, schema: type, prefix: str = "") -> None:
    """Every key of `node` against its field in the schema dataclass: set, one of its choices, in its bounds."""
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        if OmegaConf.is_missing(node, f.name):
            raise ConfigError(f"{key} must be set")
        value = node[f.name]
        if dataclasses.is_dataclass(f.type):  # a nested group
            check_node(value, f.type, f"{key}.")
            continue
        meta = f.metadata
        if value is None and meta.get("optional"):
            continue
        if "choices" in meta:
            check_choice(value, meta["choices"], key)
        if "minimum" in meta:
            minimum = meta["minimum"]
            check_int(value, key, node[minimum] if isinstance(minimum, str) else minimum, meta["also"])


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
    return cfg.model.draft.kind != DraftKind.NGRAM


def methods_of(cfg: DictConfig) -> list[str]:
    """Methods to run, baseline first; method=all drops naive when the draft is not a model."""
    method = Method(cfg.method)
    if method is Method.ALL:
        others = [m for m in Method if m not in (Method.ALL, Method.AUTOREGRESSIVE)]
        return [BASELINE] + [m.value for m in others if m is not Method.NAIVE or has_draft_model(cfg)]
    return [BASELINE] if method is Method.AUTOREGRESSIVE else [BASELINE, method.value]


def quantization_of(cfg: DictConfig, role: str) -> str:
    """Quantization the quantization group gives the target or a draft model ("none" if it does not apply)."""
    q = cfg.quantization
    return q.mode if q.applies_to in (role, "both") else "none"


def draft_quantization(cfg: DictConfig) -> str:
    """The draft's effective quantization: a quantized copy keeps its own unless the group overrides it."""
    draft = cfg.model.draft
    if draft.kind == DraftKind.MODEL:
        return quantization_of(cfg, "draft")
    if draft.kind == DraftKind.QUANTIZED_COPY:
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


def check_draft(draft: DictConfig) -> None:
    """The keys the draft's kind needs (the schema leaves them optional because other kinds omit them)."""
    for key in DRAFT_NEEDS[DraftKind(draft.kind)]:
        if draft[key] is None:
            raise ConfigError(f"model.draft.kind={draft.kind} needs model.draft.{key}; see conf/model/")


def tree_nodes(tree: DictConfig) -> int:
    """The most nodes one pass of this tree verifies (a hybrid tree holds two parts of `nodes` each)."""
    return 2 * tree.nodes if tree.kind == TreeKind.HYBRID else tree.nodes


def check_tree(cfg: DictConfig) -> None:
    """The keys the tree's kind needs, a draft model where it branches, and a pass within max_nodes."""
    tree = cfg.tree
    kind = TreeKind(tree.kind)
    if kind is TreeKind.NONE:
        return
    for key in TREE_NEEDS[kind]:
        if tree[key] is None:
            raise ConfigError(f"tree.kind={kind.value} needs tree.{key}; see conf/tree/{kind.value}.yaml")
    if kind in TREE_NEEDS_DRAFT_MODEL and not has_draft_model(cfg):
        raise ConfigError(
            f"tree={kind.value} drafts with a draft model, but model={cfg.model.name} drafts with an n-gram "
            "lookup; use tree=ngram, or a pair with a draft model (model=smollm2_weak, model=smollm2)"
        )
    if "max_ngram" in TREE_NEEDS[kind] and tree.max_ngram < tree.min_ngram:
        raise ConfigError(
            f"tree.max_ngram must be >= tree.min_ngram, got {tree.max_ngram} < {tree.min_ngram}"
        )
    if "branches" in TREE_NEEDS[kind]:
        branches = tree.branches
        if isinstance(branches, str) or not OmegaConf.is_list(branches) or len(branches) == 0:
            raise ConfigError(f"tree.branches must be a non-empty list of integers >= 1, got {branches!r}")
        for i, b in enumerate(branches):
            check_int(b, f"tree.branches[{i}]", 1)
    if tree_nodes(tree) > tree.max_nodes:
        raise ConfigError(
            f"tree={kind.value} verifies up to {tree_nodes(tree)} nodes per pass but tree.max_nodes="
            f"{tree.max_nodes}: lower tree.nodes or raise tree.max_nodes"
        )


def validate(cfg: DictConfig) -> None:
    """Refuse every value that cannot work, before any model or dataset loads."""
    check_node(cfg, RunConfig)
    sampling_of(cfg)
    check_draft(cfg.model.draft)
    check_tree(cfg)
    if cfg.method == Method.NAIVE and not has_draft_model(cfg):
        raise ConfigError(
            f"method=naive needs a draft model, but model={cfg.model.name} drafts with an n-gram lookup; "
            "use model=smollm2 (or another pair with a draft model), or method=speculative"
        )
    categories = cfg.dataset.categories
    if categories is not None and (isinstance(categories, str) or len(categories) == 0):
        raise ConfigError(f"dataset.categories must be a non-empty list or null, got {categories!r}")
    check_device(str(cfg.device))
