"""Build a model pair from its config: the target, the drafter speculative decoding runs with, and the draft
model the naive method generates with (and model trees branch with).

Drafters are built from their `_target_` nodes with hydra.utils.instantiate (conf/draft/, conf/tree/); a
drafter's `model:` node loads its draft model. A pair whose model.draft lists `candidates` is calibrated:
every candidate is built, timed and probed, and the fastest predicted one is kept (specdec.calibration).
`Pairs` keeps the last pair loaded, so that the jobs of a sweep that differ only in k or temperature share it.
"""

from __future__ import annotations

import gc
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec.calibration import Calibration, calibrate
from specdec.drafters import Drafter
from specdec.models import check_tokenizers, encode_prompt, load_model, load_tokenizer
from specdec.timing import ThreadChoice, choose_threads

from .schema import AUTO
from .settings import ConfigError, Plan, candidates_of, needs_draft_model, quantization_of

log = logging.getLogger(__name__)
CONF_MODELS = Path(__file__).resolve().parents[1] / "conf" / "model"
# A calibrated pair measures its candidates on this prompt (short: the calibration takes seconds)
CALIBRATION_PROMPT = "Explain in two sentences why the sky is blue."
LOADER = "specdec.models.load_model"  # the draft model loader the quantization group applies to


@dataclass
class Pair:
    """Everything a run needs from the models, built once."""

    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    drafter: Drafter  # what speculative decoding drafts with (a chain drafter)
    draft_model: PreTrainedModel | None  # what the naive method generates with (None for n-gram)
    draft_tokenizer: PreTrainedTokenizerBase | None
    target_quantization: str
    draft_quantization: str  # the draft model's quantization; a calibrated pair: the chosen candidate's name
    draft: str  # what drafts, as its config node says (describe)
    calibration: Calibration | None = None  # a calibrated pair: every candidate measured, and why
    threads: ThreadChoice | None = None  # threads=auto: the torch thread count measured fastest, and its probes

    @property
    def eos_token_id(self) -> list[int]:
        return eos_ids(self.target, self.tokenizer)

    def weights_mb(self, method: str) -> float:
        """Weights the method needs in memory: the target alone, or target and draft model."""
        models = [self.target] if method == "autoregressive" else [self.target, self.draft_model]
        return sum(m.get_memory_footprint() for m in models if m is not None) / 2**20


def eos_ids(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """End-of-sequence ids of the target's generation config and tokenizer."""
    ids = target.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


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


def check_same_tokenizer(cfg: DictConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """A draft model of another name (a second model) must share the target's tokenizer; returns its tokenizer."""
    name = OmegaConf.select(cfg, "model.draft.model.name")  # the draft model's, whatever the pair calls it
    if name is None or name == cfg.model.target.name:
        return tokenizer
    with offline_hint():
        draft_tokenizer = load_tokenizer(name)
    check_tokenizers(tokenizer, draft_tokenizer, cfg.model.target.name, name)
    return draft_tokenizer


def calibrated(
    cfg: DictConfig, plan: Plan, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[Drafter, PreTrainedModel | None, Calibration]:
    """Build every candidate, calibrate, keep the chosen drafter and a draft model for the naive method."""
    drafters = {name: instantiate(node) for name, node in candidates_of(cfg).items()}
    result = calibrate(
        target, drafters, encode_prompt(tokenizer, CALIBRATION_PROMPT, chat=plan.chat),
        k=None if plan.k == AUTO else plan.k, k_max=plan.k_max, sampling=plan.sampling,
        eos_token_id=eos_ids(target, tokenizer), seed=plan.seed,
    )  # fmt: skip
    chosen = drafters[result.chosen]
    models = [getattr(drafters[r.name], "model", None) for r in result.results]  # best first
    draft_model = getattr(chosen, "model", None) or next((m for m in models if m is not None), None)
    drafters.clear()  # the other candidates go
    gc.collect()
    return chosen, draft_model, result


def load_pair(cfg: DictConfig, plan: Plan) -> Pair:
    """Target, drafter and draft model as the (validated) config names them. A single drafter is built first
    (a draft model that cannot load fails before the target loads); candidates are calibrated on the target."""
    drafter = draft_model = calibration = None
    if candidates_of(cfg) is None:
        node = draft_node(cfg)
        with offline_hint():
            drafter = instantiate(node)
        draft_model, label, description = getattr(drafter, "model", None), draft_quantization(node), describe(node)
    warn_if_gated(cfg.model.target)
    target_quantization = quantization_of(cfg, "target")
    with offline_hint():
        target = load_model(
            cfg.model.target.name, dtype=cfg.dtype, device=plan.device, quantization=target_quantization,
            compute_dtype=cfg.quantization.compute_dtype,
        )  # fmt: skip
        tokenizer = load_tokenizer(cfg.model.target.name)
    threads = choose_threads_for(plan, target, tokenizer)  # before any timing: calibration measures with them
    if drafter is None:
        drafter, draft_model, calibration = calibrated(cfg, plan, target, tokenizer)
        label = calibration.chosen
        description = f"{label} (calibrated): {describe(candidates_of(cfg)[label])}"
        draft_tokenizer = tokenizer if draft_model is not None else None
    else:
        draft_tokenizer = check_same_tokenizer(cfg, tokenizer) if draft_model is not None else None
    return Pair(
        target, tokenizer, drafter, draft_model, draft_tokenizer, target_quantization, label, description,
        calibration, threads,
    )  # fmt: skip


def tree_drafter(cfg: DictConfig, pair: Pair, max_nodes: int) -> Drafter:
    """The tree drafter of cfg.tree, given the pair's draft model where it drafts with one (`model: ???`), and
    no wider than the pass limit."""
    if needs_draft_model(cfg.tree) and pair.draft_model is None:
        raise ConfigError(f"{cfg.tree._target_} needs a draft model, but this pair loaded none: use tree=ngram")
    drafter = instantiate(cfg.tree, **({"model": pair.draft_model} if needs_draft_model(cfg.tree) else {}))
    if drafter.most_nodes > max_nodes:
        raise ConfigError(
            f"tree={type(drafter).__name__} verifies up to {drafter.most_nodes} nodes per pass but max_nodes="
            f"{max_nodes}: lower tree.nodes or raise max_nodes"
        )
    return drafter


def choose_threads_for(plan: Plan, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> ThreadChoice | None:
    """threads=auto on the CPU: 1, 2, 4, ... up to the core count, whichever is fastest here and now (one target
    step, one verification pass of width k + 1 (5 for k=auto) and one prompt pass), set for the run; None
    otherwise."""
    if plan.threads != AUTO or not plan.device.startswith("cpu"):
        return None
    cores = os.cpu_count() or 1
    counts = [2**i for i in range(cores.bit_length()) if 2**i <= cores]
    ids = encode_prompt(tokenizer, CALIBRATION_PROMPT, chat=plan.chat)
    choice = choose_threads(target, ids, counts, width=5 if plan.k == AUTO else plan.k + 1)
    torch.set_num_threads(choice.threads)
    return choice


def pair_key(cfg: DictConfig) -> str:
    """The effective settings that decide which weights load (sweeps over k or temperature share one)."""
    key = {
        "target": cfg.model.target.name,
        "target_quantization": quantization_of(cfg, "target"),
        "compute_dtype": cfg.quantization.compute_dtype,
        "draft": OmegaConf.to_container(draft_node(cfg), resolve=True),
        "device": cfg.device,
        "dtype": cfg.dtype,
        "threads": cfg.threads,
        "calibration": [cfg.k, cfg.k_max, cfg.seed, cfg.temperature, cfg.top_k, cfg.top_p] if candidates_of(cfg) else None,
    }
    return json.dumps(key, sort_keys=True, default=str)


class Pairs:
    """The pair of the last run, kept between the jobs of a sweep while its weights stay the same."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.pair: Pair | None = None

    def get(self, cfg: DictConfig, plan: Plan) -> Pair:
        """load_pair, or the pair of the previous job when the effective settings are the same."""
        key = pair_key(cfg)
        if key != self.key:
            self.key = self.pair = None  # free the previous pair before loading the next one
            gc.collect()
            if plan.device.startswith("cuda"):
                torch.cuda.empty_cache()
            self.pair, self.key = load_pair(cfg, plan), key
        return self.pair

