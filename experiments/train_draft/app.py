"""`python -m experiments.train_draft model=smollm2`: train a draft head for the pair's target (conf/train_draft.yaml).

1. Teacher data: the target's teacher-forced pass over the training conversations (specdec.train.head.teacher_pass),
   cut into chunks and cached (store.teacher_file), so a second head on the same data skips it.
2. The draft vocabulary: the head.vocab most frequent tokens of the training chunks (FR-Spec).
3. Training with AdamW, the validation acceptance every train.eval_every steps (learning curve), a checkpoint every
   train.checkpoint_every steps; an interrupted run with the same settings resumes from its last checkpoint.
4. The head, meta.json (recipe, data, tokens, minutes, acceptance, machine) and the curve go to the head's folder in
   the cache (store.head_folder), where `draft=head` finds it; the run folder gets the curve as a table and a figure.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specdec.draft.head import DraftHead, frequency_ranked, save_atomically, save_head
from specdec.runtime.models import load_model, load_tokenizer
from specdec.train.head import (
    TargetSide,
    Teacher,
    answer_positions,
    chunked,
    first_token_acceptance,
    head_loss,
    target_side,
    teacher_pass,
)

from ..records import machine, write_json
from ..run.logger import make_logger
from . import store
from .data import token_rows
from .report import write_report

log = logging.getLogger(__name__)
CONF = str(Path(__file__).resolve().parents[2] / "conf")


def teacher_data(cfg: DictConfig, target, tokenizer) -> tuple[Teacher, dict]:
    """The chunked teacher data of these settings, from the cache or made now (with its making's record)."""
    path = store.teacher_file(cfg)
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return Teacher(**saved["teacher"]), saved["record"]
    started, rows, tokens = time.perf_counter(), [], 0
    d = cfg.data
    answers = d.answer_tokens if d.self_distill else 0
    texts = token_rows(d.source, tokenizer, d.conversations, d.max_tokens, target, answers)
    for ids, is_answer in tqdm(texts, total=d.conversations, desc="teacher passes", unit="conv"):
        if ids.numel() >= d.chunk:
            rows.append((ids, *teacher_pass(target, ids, d.top_k), answer_positions(is_answer)))
            tokens += ids.numel()
    teacher = chunked(rows, d.chunk)
    record = {"conversations": len(rows), "tokens": tokens, "chunk_tokens": teacher.tokens.numel(),
              "answer_positions": int(teacher.answer.sum()),
              "seconds": time.perf_counter() - started}
    save_atomically({"teacher": vars(teacher), "record": record}, path)
    return teacher, record


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
    path = folder / store.CHECKPOINT
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
                           "rng": torch.get_rng_state()}, folder / store.CHECKPOINT)


def log_point(logger, point: dict) -> None:
    """A learning-curve point to W&B (when the logger is a W&B run), at its training step."""
    run = getattr(logger, "run", None)
    if run is not None:
        run.log(point, step=point["step"])


def learning_rate(cfg: DictConfig, step: int) -> float:
    """Linear warm-up over train.warmup steps, then linear decay to a tenth at the last step."""
    t = cfg.train
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    return t.lr * (1 - 0.9 * (step - t.warmup) / max(1, t.steps - t.warmup))


def train(cfg: DictConfig, head: DraftHead, data: tuple[Teacher, Teacher], folder: Path, logger, target) -> dict:
    """The training loop (module docstring, step 3); returns the final state."""
    training, validation = data
    t = cfg.train
    optimizer = torch.optim.AdamW(head.parameters(), lr=t.lr)
    state = resume(folder, head, optimizer)
    weight = target.get_output_embeddings().weight.detach()
    batches = validation_batches(head, validation, weight, head.softcap, t.batch)
    generator = torch.Generator().manual_seed(t.seed + state["step"])
    bar = tqdm(range(state["step"], t.steps), initial=state["step"], total=t.steps, desc="training", unit="step")
    for step in bar:
        started = time.perf_counter()
        head.train()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        batch = training.batch(torch.randint(len(training), (t.batch,), generator=generator))
        loss, parts = head_loss(head, batch, t.ce_weight, t.unroll, t.noise, t.answers_only)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state["step"], state["seconds"] = step + 1, state["seconds"] + time.perf_counter() - started
        if state["step"] % t.eval_every == 0 or state["step"] == t.steps:
            point = {"step": state["step"], "tokens": state["step"] * t.batch * (training.tokens.shape[1] - 1),
                     "loss": loss.item(), **parts, "seconds": state["seconds"],
                     **validation_acceptance(head, batches, weight, head.softcap)}
            state["curve"].append(point)
            log_point(logger, point)
            bar.set_postfix(alpha=f"{point['alpha']:.3f}", loss=f"{point['loss']:.3f}")
        if state["step"] % t.checkpoint_every == 0 or state["step"] == t.steps:
            checkpoint(folder, head, optimizer, state)
    return state


def run(cfg: DictConfig, run_dir: Path) -> Path:
    """Train the head these settings describe (or find it trained); its folder."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.train.seed)
    folder = store.head_folder(cfg)
    if (folder / store.META).is_file() and not cfg.retrain:
        log.info("a head with these settings is trained already: %s (retrain=true trains it again)", folder)
        write_report(run_dir, folder)
        return folder
    target = load_model(cfg.model.target.name, dtype=cfg.dtype, device=cfg.device)
    teacher, record = teacher_data(cfg, target, load_tokenizer(cfg.model.target.name))
    training, held_out = teacher.held_out(cfg.data.validation)
    counts = torch.bincount(training.tokens.flatten(), minlength=target.get_output_embeddings().weight.shape[0])
    head = DraftHead(target, layers=cfg.head.layers, vocab=frequency_ranked(counts, cfg.head.vocab))
    config = OmegaConf.to_container(cfg, resolve=True)
    logger = make_logger(cfg.logger, run_dir, config, f"train_draft-{cfg.model.name}")
    state = train(cfg, head, (training, held_out), folder, logger, target)
    save_head(head, folder)
    meta = {"target": cfg.model.target.name, "settings": config, "teacher": record,
            "training_chunks": len(training), "validation_chunks": len(held_out),
            "training_seconds": state["seconds"], "steps": state["step"], "final": state["curve"][-1],
            "machine": machine(cfg.device)}
    write_json(folder / "curve.json", state["curve"])
    write_json(folder / store.META, meta)
    write_report(run_dir, folder)
    logger.finish()
    return folder


@hydra.main(config_path=CONF, config_name="train_draft", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg, Path(hydra.core.hydra_config.HydraConfig.get().runtime.output_dir))
