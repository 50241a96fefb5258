"""Build a model pair from its config: the target, the drafter speculative decoding runs with, and the draft
model the naive method generates with (and model trees branch with).

Drafters are built from their `_target_` nodes with hydra.utils.instantiate (conf/draft/, conf/tree/); a
drafter's `model:` node loads its draft model. A pair whose model.draft lists `candidates` is calibrated:
each candidate is built when the library comes to it, timed and probed (specdec.auto.setup.prepare_drafts); the
fastest predicted one drafts a fixed k, and it and the next best stay loaded for k=auto, which chooses among them every
round (specdec.choose.online).
`Pairs` keeps the last pair loaded, so that the jobs of a sweep that differ only in k or temperature share it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import transformers
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec.auto.runtime import put_drafter_on_runtime
from specdec.auto.setup import Drafts, calibration_ids, prepare_drafts, prepare_target
from specdec.draft.base import Drafter
from specdec.runtime.machine import release_memory
from specdec.runtime.models import draft_tokenizer, eos_token_ids, load_model, load_tokenizer
from specdec.runtime.probes import ThreadChoice
from specdec.runtime.study import weight_bytes

from .heads import loaded_candidates, with_target
from .schema import AUTO
from .settings import (
    CONF_DIR,
    ConfigError,
    Plan,
    candidates_of,
    needs_draft_model,
    placement,
    quantization_of,
)

log = logging.getLogger(__name__)
transformers.utils.logging.disable_progress_bar()
# bitsandbytes int8 warns about a dtype cast on every forward pass
logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
CONF_MODELS = CONF_DIR / "model"
LOADER = "specdec.runtime.models.load_model"  # the draft model loader the quantization group applies to


class Target(NamedTuple):
    """The target model as a pair loads it, shared by every pair with the same target settings."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    quantization: str
    threads: ThreadChoice | None  # threads=auto: the torch thread count measured fastest, and its probes


class DraftSide(NamedTuple):
    """What drafts, as the library prepared it (a calibrated pair: with its calibration), and how the run describes
    it."""

    drafts: Drafts  # the chain drafter speculative decoding runs with, and its draft model
    tokenizer: PreTrainedTokenizerBase | None  # the draft model's (None for n-gram)
    quantization: str  # the draft model's quantization; a calibrated pair: the chosen candidate's name
    description: str  # what drafts, as its config node says (describe)


@dataclass
class Pair:
    """Everything a run needs from the models, built once: a Target's fields, then a DraftSide's."""

    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    target_quantization: str
    threads: ThreadChoice | None
    drafts: Drafts
    draft_tokenizer: PreTrainedTokenizerBase | None
    draft_quantization: str
    draft: str  # what drafts, as its config node says (describe)

    drafter = property(lambda self: self.drafts.drafter)
    draft_model = property(lambda self: self.drafts.model)
    calibration = property(lambda self: self.drafts.calibration)

    @property
    def eos_token_id(self) -> list[int]:
        return eos_token_ids(self.target, self.tokenizer)

    def weights_mb(self, method: str) -> float:
        """Weights the method needs in memory: the target alone, or target and draft model (what they share once)."""
        models = [self.target] if method == "autoregressive" else [self.target, self.draft_model]
        return weight_bytes(*[m for m in models if m is not None]) / 2**20


def offline_pairs() -> list[str]:
    """Names of the model pairs in conf/model/ that need no network."""
    return sorted(p.stem for p in CONF_MODELS.glob("*.yaml") if "offline:" in p.read_text())


def warn_if_gated(spec: DictConfig) -> None:
    """A gated model without a Hub token will fail to download: say how to log in before trying."""
    from huggingface_hub import get_token

    if spec.get("gated") and get_token() is None:
        log.warning(
            "%s is gated: accept its license at https://huggingface.co/%s and log in with `hf auth login` "
            "(or set HF_TOKEN). Offline pairs: %s", spec.name, spec.name, ", ".join(offline_pairs()),
        )  # fmt: skip


@contextmanager
def offline_hint() -> Iterator[None]:
    """A model or tokenizer that cannot be fetched: add the offline pairs to the library's message."""
    try:
        yield
    except OSError as e:
        raise OSError(f"{e}\nOffline model pairs (no network needed): {', '.join(offline_pairs())}") from e


def draft_node(cfg: DictConfig) -> DictConfig:
    """model.draft with the quantization group applied to its draft model, when one is loaded by load_model
    and the group covers the draft; the pair's own quantization otherwise."""
    node, mode = cfg.model.draft, quantization_of(cfg, "draft")
    model = node.get("model") if "_target_" in node else None
    if mode == "none" or not OmegaConf.is_dict(model) or model.get("_target_") != LOADER:
        return node
    node = OmegaConf.merge(node, {"model": {"quantization": mode, "compute_dtype": cfg.quantization.compute_dtype}})
    node._set_parent(cfg.model)  # interpolations (${model.target.name}, ${device}) resolve as in cfg
    return node


def describe(node: DictConfig) -> str:
    """A drafter's node as one line: its class and settings, nested nodes likewise (device and name left out)."""
    parts = []
    for key, value in node.items():
        if key in ("_target_", "name", "device"):
            continue
        parts.append(f"{key}={describe(value) if OmegaConf.is_dict(value) else value}")
    return f"{str(node.get('_target_', '')).rsplit('.', 1)[-1]}({', '.join(parts)})"


def draft_quantization(node: DictConfig) -> str:
    """The quantization its draft model loads with ("none" for model-free drafters and plain copies)."""
    model = node.get("model")
    return str(model.get("quantization") or "none") if OmegaConf.is_dict(model) else "none"


def calibrated(cfg: DictConfig, plan: Plan, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Drafts:
    """model.draft's candidates, each built when the library comes to it (prepare_drafts: one at a time)."""
    candidates = loaded_candidates(candidates_of(cfg))
    drafters = {name: partial(instantiate, node, **with_target(node, lambda: target)) for name, node in candidates.items()}
    copies = {name: OmegaConf.to_container(node.model, resolve=True) for name, node in candidates.items()  # predicted
              if OmegaConf.is_dict(node.get("model")) and node.model.get("name") == cfg.model.target.name}  # costs
    return prepare_drafts(target, drafters, calibration_ids(tokenizer, plan.chat), k=None if plan.k == AUTO else plan.k,
                          k_max=plan.k_max, sampling=plan.sampling, eos_token_id=eos_token_ids(target, tokenizer),
                          seed=plan.seed, copies=copies, **placement(cfg))  # fmt: skip


def load_target(cfg: DictConfig, plan: Plan) -> Target:
    """The target (quantized as the quantization group says), its tokenizer, on its threads and runtime
    (specdec.auto.setup.prepare_target)."""
    warn_if_gated(cfg.model.target)
    quantization = quantization_of(cfg, "target")
    with offline_hint():
        model = load_model(
            cfg.model.target.name, dtype=cfg.dtype, device=plan.device, quantization=quantization,
            compute_dtype=cfg.quantization.compute_dtype,
        )  # fmt: skip
        tokenizer = load_tokenizer(cfg.model.target.name)
    threads = prepare_target(model, calibration_ids(tokenizer, plan.chat), threads=plan.threads,
                             k=None if plan.k == AUTO else plan.k, **placement(cfg))  # fmt: skip
    return Target(model, tokenizer, quantization, threads)


def load_draft(cfg: DictConfig, plan: Plan, target: Callable[[], Target]) -> DraftSide:
    """The drafter of model.draft: built from its node (before the target loads: a draft model that cannot
    load fails first), or the fastest of its candidates, calibrated on the target."""
    if candidates_of(cfg) is not None:
        t = target()
        drafts = calibrated(cfg, plan, t.model, t.tokenizer)
        chosen = drafts.calibration.chosen
        description = f"{chosen} (calibrated): {describe(candidates_of(cfg)[chosen])}"
        return DraftSide(drafts, t.tokenizer if drafts.model is not None else None, chosen, description)
    node = draft_node(cfg)
    with offline_hint():
        drafter = instantiate(node, **with_target(node, lambda: target().model))
    model = getattr(drafter, "model", None)
    put_drafter_on_runtime(drafter, **placement(cfg))
    tokenizer = getattr(drafter, "draft_tokenizer", None)  # a draft with a vocabulary of its own (specdec.draft.cross_vocab)
    if tokenizer is None and model is not None:  # the draft model's (model.draft.model.name) shares the target's
        with offline_hint():
            tokenizer = draft_tokenizer(target().tokenizer, cfg.model.target.name,
                                        OmegaConf.select(cfg, "model.draft.model.name"))
    return DraftSide(Drafts(drafter, model), tokenizer, draft_quantization(node), describe(node))


def tree_drafter(cfg: DictConfig, pair: Pair, max_nodes: int) -> Drafter:
    """The tree drafter of cfg.tree, given the pair's draft model where it drafts with one (`model: ???`), and
    no wider than the pass limit (the library puts it on its runtime: specdec.auto.setup.prepare_decoding)."""
    if needs_draft_model(cfg.tree) and pair.draft_model is None:
        raise ConfigError(f"{cfg.tree._target_} needs a draft model, but this pair loaded none: use tree=ngram")
    drafter = instantiate(cfg.tree, **({"model": pair.draft_model} if needs_draft_model(cfg.tree) else
                                       with_target(cfg.tree, lambda: pair.target)))
    if drafter.most_nodes > max_nodes:
        raise ConfigError(f"tree={type(drafter).__name__} verifies up to {drafter.most_nodes} nodes per pass but "
                          f"max_nodes={max_nodes}: lower tree.nodes or raise max_nodes")
    return drafter


def target_key(cfg: DictConfig) -> str:
    """The settings that decide which target loads."""
    q = quantization_of(cfg, "target")
    key = [cfg.model.target.name, q, cfg.quantization.compute_dtype if q != "none" else None, cfg.device, cfg.dtype,
           cfg.threads, {k: v for k, v in OmegaConf.to_container(cfg.runtime).items() if k != "heads"}]  # fmt: skip
    return json.dumps(key, default=str)


def pair_key(cfg: DictConfig) -> str:
    """The settings that decide which weights load and how a head runs (runtime.heads): the jobs of a sweep over k or
    temperature share one pair (a calibrated pair keeps the draft its first job's calibration chose, at its k)."""
    draft = OmegaConf.to_container(draft_node(cfg), resolve=True, throw_on_missing=False)
    return json.dumps([target_key(cfg), draft, cfg.runtime.get("heads")], sort_keys=True, default=str)


class Pairs:
    """Pairs built so far, sharing their target: the jobs of a sweep, the contenders of a benchmark. A job with
    another target frees everything before it loads (one target in memory at a time)."""

    def __init__(self) -> None:
        self.targets: dict[str, Target] = {}
        self.drafts: dict[str, DraftSide] = {}

    def target(self, cfg: DictConfig, plan: Plan) -> Target:
        key = target_key(cfg)
        if key not in self.targets:
            self.targets[key] = load_target(cfg, plan)
        return self.targets[key]

    def get(self, cfg: DictConfig, plan: Plan) -> Pair:
        """The pair of cfg, reusing the target and the draft of earlier pairs with the same settings."""
        if target_key(cfg) not in self.targets:  # another target: free what the earlier ones loaded first
            self.targets.clear()
            self.drafts.clear()
            release_memory(plan.device)
        key = pair_key(cfg)
        if key not in self.drafts:
            self.drafts[key] = load_draft(cfg, plan, lambda: self.target(cfg, plan))
        return Pair(*self.target(cfg, plan), *self.drafts[key])
