"""The training loop of a draft head (specdec.train.head's loss): AdamW with a linear warm-up and decay, the
validation acceptance every eval_every steps (the learning curve), a checkpoint every checkpoint_every steps in the
head's folder (specdec.draft.head_store); an interrupted run with the same folder resumes from its last checkpoint."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..draft.head import DraftHead, save_atomically
from ..draft.head_store import CHECKPOINT
from .head import TargetSide, Teacher, first_token_acceptance, head_loss, target_side

log = logging.getLogger(__name__)


@dataclass
class TrainSettings:
    """How a head trains: optimizer steps, chunks per step, AdamW's peak learning rate and its warm-up steps, the
    loss's settings (specdec.train.head.head_loss), and how often to validate and to checkpoint."""

    steps: int = 3000
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 100
    ce_weight: float = 0.5
    unroll: int = 1
    noise: float = 0.0
    answers_only: bool = False
    eval_every: int = 100
    checkpoint_every: int = 100
    seed: int = 0


TARGET_SIDE_BYTES = 2**31  # the most memory the validation's precomputed p on S may take


def validation_batches(head: DraftHead, validation: Teacher, weight: torch.Tensor, softcap, batch: int
                       ) -> list[tuple[Teacher, TargetSide | None]]:
    """The validation chunks in batches, each with the target's side of the acceptance, computed once here (on a
    262k-token vocabulary the target's logits are most of a validation's time) when p on S fits TARGET_SIDE_BYTES,
    else None (each validation computes it again)."""
    parts = [validation.batch(slice(i, i + batch)) for i in range(0, len(validation), batch)]
    keep = validation.tokens.numel() * head.vocab.numel() * 4 <= TARGET_SIDE_BYTES
    return [(part, target_side(head, part, weight, softcap) if keep else None) for part in parts]


def validation_acceptance(head: DraftHead, batches: list[tuple[Teacher, TargetSide | None]], weight: torch.Tensor,
                          softcap) -> dict:
    """alpha and the greedy match rate over every validation chunk, in batches (equal positions each), and over
    the positions drafting an assistant's token (weighted by their count in each batch)."""
    parts = [first_token_acceptance(head, part, weight, softcap, target) for part, target in batches]
    sizes = [len(part) for part, _ in batches]
    out = {key: sum(p[key] * n for p, n in zip(parts, sizes)) / sum(sizes) for key in ("alpha", "greedy_match")}
    answers = sum(p.get("answer_positions", 0) for p in parts)
    for key in ("answer_alpha", "answer_greedy_match"):
        if answers:
            out[key] = sum(p[key] * p["answer_positions"] for p in parts) / answers
    return out


def resume(folder: Path, head: DraftHead, optimizer: torch.optim.Optimizer) -> dict:
    """The training state (step, seconds, curve), from the folder's checkpoint when there is one."""
    path = folder / CHECKPOINT
    if not path.is_file():
        return {"step": 0, "seconds": 0.0, "curve": []}
    saved = torch.load(path, weights_only=False)
    head.load_state_dict(saved["head"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["rng"])
    log.info("resuming %s from step %d", folder, saved["state"]["step"])
    return saved["state"]


def checkpoint(folder: Path, head: DraftHead, optimizer: torch.optim.Optimizer, state: dict) -> None:
    save_atomically({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "state": state,
                     "rng": torch.get_rng_state()}, folder / CHECKPOINT)


def learning_rate(s: TrainSettings, step: int) -> float:
    """Linear warm-up over s.warmup steps, then linear decay to a tenth at the last step."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    return s.lr * (1 - 0.9 * (step - s.warmup) / max(1, s.steps - s.warmup))


def train(head: DraftHead, data: tuple[Teacher, Teacher], target_weight: torch.Tensor, folder: Path,
          s: TrainSettings, observe: Callable[[dict], None] = lambda point: None,
          progress: Callable[[range], Iterable[int]] = iter) -> dict:
    """Train the head on data (training, validation chunks) against the target's output layer (V, d), resuming from
    folder's checkpoint; observe(point): each learning-curve point; progress: wraps the steps left (a progress bar).
    Returns the final state (step, seconds, curve)."""
    training, validation = data
    optimizer = torch.optim.AdamW(head.parameters(), lr=s.lr)
    state = resume(folder, head, optimizer)
    batches = validation_batches(head, validation, target_weight, head.softcap, s.batch)
    generator = torch.Generator().manual_seed(s.seed + state["step"])
    for step in progress(range(state["step"], s.steps)):
        started = time.perf_counter()
        head.train()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(s, step)
        batch = training.batch(torch.randint(len(training), (s.batch,), generator=generator))
        loss, parts = head_loss(head, batch, s.ce_weight, s.unroll, s.noise, s.answers_only)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state["step"], state["seconds"] = step + 1, state["seconds"] + time.perf_counter() - started
        if state["step"] % s.eval_every == 0 or state["step"] == s.steps:
            point = {"step": state["step"], "tokens": state["step"] * s.batch * (training.tokens.shape[1] - 1),
                     "loss": loss.item(), **parts, "seconds": state["seconds"],
                     **validation_acceptance(head, batches, target_weight, head.softcap)}
            state["curve"].append(point)
            observe(point)
        if state["step"] % s.checkpoint_every == 0 or state["step"] == s.steps:
            checkpoint(folder, head, optimizer, state)
    return state
