"""Load a model pair from its config: the target, a drafter for speculative decoding, and the
draft model the naive method generates with."""

from __future__ import annotations

import gc
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec.calibration import Calibration, calibrate, check_candidates, load_candidate
from specdec.drafters import Drafter, ModelDrafter, NGramDrafter
from specdec.models import (
    check_tokenizers,
    encode_prompt,
    layer_truncated_copy,
    load_model,
    load_tokenizer,
)
from specdec.timing import ThreadChoice, choose_threads

from .records import cell, markdown_table, write_json
from .schema import AUTO, DraftKind
from .settings import ConfigError, draft_quantization, quantization_of, sampling_of

log = logging.getLogger(__name__)
LOADED: dict[str, Pair] = {}  # at most one pair, kept between the jobs of a sweep
CONF_MODELS = Path(__file__).resolve().parents[1] / "conf" / "model"
# The draft kind `calibrated` measures its candidates on this prompt (short: the calibration takes seconds)
CALIBRATION_PROMPT = "Explain in two sentences why the sky is blue."


@dataclass
class Pair:
    """Everything a run needs from the models, loaded once."""

    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    drafter: Drafter  # what speculative_generate drafts with
    draft_model: PreTrainedModel | None  # what the naive method generates with (None for n-gram)
    draft_tokenizer: PreTrainedTokenizerBase | None
    target_quantization: str
    draft_quantization: str  # for model.draft.kind=calibrated: the chosen candidate's name
    calibration: Calibration | None = None  # model.draft.kind=calibrated: every candidate measured, and why
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


def load(
    name: str, cfg: DictConfig, quantization: str, compute_dtype: str | None, fused_4bit: bool = True
) -> PreTrainedModel:
    """load_model with the run's device and dtype."""
    with offline_hint():
        return load_model(
            name, dtype=cfg.dtype, device=cfg.device, quantization=quantization, compute_dtype=compute_dtype,
            fused_4bit=fused_4bit,
        )  # fmt: skip


def tokenizer_of(name: str) -> PreTrainedTokenizerBase:
    with offline_hint():
        return load_tokenizer(name)


def draft_compute_dtype(cfg: DictConfig) -> str | None:
    """The group's compute dtype when it quantizes the draft, else the copy's own (calibrated: its candidates')."""
    if cfg.model.draft.kind == DraftKind.CALIBRATED:
        return None
    if quantization_of(cfg, "draft") != "none" or cfg.model.draft.kind == DraftKind.MODEL:
        return cfg.quantization.compute_dtype
    return cfg.model.draft.compute_dtype


Loaded = tuple[PreTrainedModel | None, PreTrainedTokenizerBase | None]  # (draft model, its tokenizer)


def no_draft_model(cfg: DictConfig, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Loaded:
    return None, None


def truncated_copy(cfg: DictConfig, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Loaded:
    return layer_truncated_copy(target, cfg.model.draft.n_layers), tokenizer


def quantized_copy(cfg: DictConfig, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Loaded:
    fused = cfg.model.draft.fused_4bit  # false: stands in for a CPU without AVX512-BF16
    return load(cfg.model.target.name, cfg, draft_quantization(cfg), draft_compute_dtype(cfg), fused), tokenizer


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
}  # DraftKind.CALIBRATED: calibrated_pair


def candidate_names(cfg: DictConfig) -> tuple[str, ...]:
    """model.draft.candidates, checked against specdec.calibration.CANDIDATES before any model loads."""
    try:
        return check_candidates(list(cfg.model.draft.candidates))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model.draft.candidates: {e}") from e


def calibrated_pair(
    cfg: DictConfig, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target_quantization: str
) -> Pair:
    """Load every candidate, calibrate, keep the chosen drafter (and a draft model for the naive method)."""
    spec = cfg.model.draft
    ngram = {"max_ngram": spec.max_ngram, "min_ngram": spec.min_ngram, "fused_4bit": spec.fused_4bit,
             "reads_target_cache": spec.reads_target_cache}
    names = candidate_names(cfg)
    loaded = {name: load_candidate(name, target, cfg.model.target.name, **ngram) for name in names}
    result = calibrate(
        target, {name: drafter for name, (drafter, _) in loaded.items()},
        encode_prompt(tokenizer, CALIBRATION_PROMPT, chat=cfg.dataset.chat),
        k=None if cfg.k == AUTO else cfg.k, k_max=cfg.k_max, sampling=sampling_of(cfg),
        eos_token_id=eos_ids(target, tokenizer), seed=cfg.seed,
    )  # fmt: skip
    drafter, draft_model = loaded[result.chosen]
    if draft_model is None:  # n-gram chosen: the naive method still needs a model, the best one measured
        models = [r.name for r in result.results if loaded[r.name][1] is not None]
        draft_model = loaded[models[0]][1] if models else None
    loaded.clear()  # the other candidates go
    gc.collect()
    return Pair(
        target, tokenizer, drafter, draft_model, tokenizer if draft_model is not None else None,
        target_quantization, result.chosen, result,
    )  # fmt: skip


def load_pair(cfg: DictConfig) -> Pair:
    """Target, draft model and drafter as the (validated) config names them."""
    spec = cfg.model
    calibrated = DraftKind(spec.draft.kind) == DraftKind.CALIBRATED
    if calibrated:
        candidate_names(cfg)  # a bad name fails before any model loads
    warn_if_gated(spec.target)
    target_quantization = quantization_of(cfg, "target")
    target = load(spec.target.name, cfg, target_quantization, cfg.quantization.compute_dtype)
    tokenizer = tokenizer_of(spec.target.name)
    threads = choose_threads_for(cfg, target, tokenizer)  # before any timing: calibration measures with them
    if calibrated:
        pair = calibrated_pair(cfg, target, tokenizer, target_quantization)
        pair.threads = threads
        return pair
    draft_model, draft_tokenizer = LOAD_DRAFT[DraftKind(spec.draft.kind)](cfg, target, tokenizer)
    if draft_model is None:
        drafter: Drafter = NGramDrafter(max_ngram=spec.draft.max_ngram, min_ngram=spec.draft.min_ngram)
    else:
        copy = DraftKind(spec.draft.kind) == DraftKind.QUANTIZED_COPY
        drafter = ModelDrafter(draft_model, reads_target_cache=copy and spec.draft.reads_target_cache)
    return Pair(
        target, tokenizer, drafter, draft_model, draft_tokenizer, target_quantization, draft_quantization(cfg),
        threads=threads,
    )  # fmt: skip


def choose_threads_for(
    cfg: DictConfig, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> ThreadChoice | None:
    """threads=auto on the CPU: 1, 2, 4, ... up to the core count, whichever is fastest here and now (one target
    step, one verification pass of width k + 1 (5 for k=auto) and one prompt pass); None otherwise."""
    if cfg.threads != AUTO or not str(cfg.device).startswith("cpu"):
        return None
    cores = os.cpu_count() or 1
    counts = [2**i for i in range(cores.bit_length()) if 2**i <= cores]
    ids = encode_prompt(tokenizer, CALIBRATION_PROMPT, chat=cfg.dataset.chat)
    return choose_threads(target, ids, counts, width=5 if cfg.k == AUTO else cfg.k + 1)


def threads_markdown(choice: ThreadChoice) -> str:
    """One line: the thread count threads=auto chose and what each count measured."""
    probes = ", ".join(f"{n}: {ms:.1f}" for n, ms in choice.probe_ms.items())
    return (
        f"Torch threads: threads=auto chose {choice.threads} (median ms of one target step, one "
        f"{choice.width}-token pass and one {choice.prompt_tokens}-token prompt pass, by thread count: {probes}; "
        "interleaved, under this machine's load).\n"
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


def calibration_markdown(calibration: Calibration) -> str:
    """Which draft the calibration chose and why: each candidate's measured c, alpha, predicted speedup."""
    rows = [
        [r.name, cell(r.draft_ms, "{:.1f}"), cell(r.c, "{:.2f}"), cell(r.alpha, "{:.3f}"), str(r.k),
         cell(r.pass_cost, "{:.2f}"), cell(r.speedup, "{:.2f}"), str(r.best_k),
         cell(r.best_speedup, "{:.2f}")]
        for r in calibration.results
    ]  # fmt: skip
    header = ["candidate", "draft ms", "c", "alpha", "k", "pass cost", "predicted speedup", "best k",
              "at best k"]  # fmt: skip
    return (
        f"Draft calibration (model.draft.kind=calibrated; target step {calibration.step_ms:.1f} ms; c per "
        "draft token, per lookup call for ngram; pass cost = one verification pass over k+1 tokens in "
        "target steps; speedup by Leviathan's Thm 3.8 with that pass cost):\n\n"
        f"{markdown_table(header, rows)}\n\nChosen draft: {calibration.reason}\n"
    )


def write_calibration(run_dir: Path, pair: Pair) -> None:
    """threads.md / .json when threads=auto chose the thread count; calibration.md / .json in the run folder,
    when the pair's draft was calibrated."""
    if pair.threads is not None:
        (run_dir / "threads.md").write_text(threads_markdown(pair.threads))
        write_json(run_dir / "threads.json", asdict(pair.threads))
    if pair.calibration is None:
        return
    (run_dir / "calibration.md").write_text(calibration_markdown(pair.calibration))
    write_json(
        run_dir / "calibration.json",
        {"chosen": pair.calibration.chosen, "reason": pair.calibration.reason,
         "target_step_ms": pair.calibration.step_ms, "candidates": pair.calibration.rows()},
    )  # fmt: skip
