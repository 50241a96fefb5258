"""Trained draft heads in a pair (conf/draft/head.yaml, whose `${trained_head:<target>}` finds the latest head
trained for the target: experiments.train_draft.store), and the target model a head node is built with.

A calibrated pair lists the head among its candidates only when one is trained for its target; asked for by name
(`model.draft=head` or a pair whose drafter is the head) without one, the run stops before loading anything. The
same filter leaves out a candidate copy on the packed int8 kernel where that kernel cannot run (left_out_here).
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from specdec.draft.head_store import head_path

log = logging.getLogger(__name__)


def is_head(node: DictConfig) -> bool:
    """A drafter node that drafts with a trained head (it takes the pair's target)."""
    return OmegaConf.is_dict(node) and "checkpoint" in node and "target" in node


def with_target(node: DictConfig, target) -> dict:
    """instantiate's extra arguments for a node: the target model for a head node (target: a callable giving
    it, so that it loads only when a head needs it) and its checkpoint as a path (a bare folder name is looked up
    among the trained heads)."""
    if not is_head(node):
        return {}
    return {"target": target(), "checkpoint": head_path(node.checkpoint)}


def trained_candidates(candidates: DictConfig) -> dict[str, DictConfig]:
    """The candidates to calibrate: a head only when one is trained for the target, and a copy on the packed
    kernel (quantization=packed_int8) only where that kernel runs (left_out_here)."""
    return {name: node for name, node in candidates.items()
            if not (is_head(node) and node.checkpoint is None) and left_out_here(node) is None}


def left_out_here(node: DictConfig) -> str | None:
    """Why a packed_int8 copy cannot draft on this machine and device (None: it can, or it is another drafter)."""
    model = node.get("model") if OmegaConf.is_dict(node) else None
    if not OmegaConf.is_dict(model) or model.get("quantization") != "packed_int8":
        return None
    from specdec.runtime.packed import unavailable_reason  # at call time (tests answer for this CPU)

    return unavailable_reason() if str(model.get("device", "cpu")).startswith("cpu") else "it runs on a CPU"


def say_left_out(candidates: DictConfig, kept: dict[str, DictConfig]) -> None:
    """One log line per candidate left out (the pair says it once, when it loads; validation says nothing)."""
    for name in [name for name in candidates if name not in kept]:
        reason = left_out_here(candidates[name]) or "no draft head is trained for this target (make train-draft)"
        log.info("candidate %s left out: %s", name, reason)


def loaded_candidates(candidates: DictConfig) -> dict[str, DictConfig]:
    """trained_candidates, saying which heads it leaves out: where the pair loads them."""
    kept = trained_candidates(candidates)
    say_left_out(candidates, kept)
    return kept
