"""`python -m experiments.train_draft model=smollm2`: train a draft head for the pair's target (conf/train_draft.yaml).

1. Teacher data: the target's teacher-forced pass over the training conversations (specdec.train.head.teacher_pass),
   cut into chunks and cached (specdec.train.data.teacher_data), so a second head on the same data skips it.
2. The draft vocabulary: the head.vocab most frequent tokens of the training chunks (FR-Spec).
3. Training with AdamW, the validation acceptance every train.eval_every steps (learning curve), a checkpoint every
   train.checkpoint_every steps; an interrupted run with the same settings resumes from its last checkpoint.
4. The head, meta.json (recipe, data, tokens, minutes, acceptance, machine) and the curve go to the head's folder in
   the cache (specdec.draft.head_store), where `draft=head` finds it; the run folder gets the head's record and the
   curve as a table and a figure (head.md, learning_curve.png).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specdec.auto.threads import use_threads
from specdec.draft import head_store
from specdec.draft.head import DraftHead, frequency_ranked, save_head
from specdec.markdown import markdown_table
from specdec.runtime.models import load_model, load_tokenizer
from specdec.train.conversations import conversations
from specdec.train.data import teacher_data, token_rows
from specdec.train.loop import TrainSettings, train

from ..records import REPO_ROOT, machine, write_json
from ..run.logger import make_logger
from .store import head_folder, teacher_file

log = logging.getLogger(__name__)
CONF = str(Path(__file__).resolve().parents[2] / "conf")


COLUMNS = ("step", "tokens", "loss", "alpha", "greedy_match", "answer_alpha", "answer_greedy_match", "seconds")
MEASURES = ("alpha", "greedy_match", "answer_alpha", "answer_greedy_match")  # answer_*: on the answers' positions


def curve_table(curve: list[dict]) -> str:
    columns = [c for c in COLUMNS if any(c in point for point in curve)]  # heads trained before answer marks lack two
    return markdown_table(columns, [[point.get(c) for c in columns] for point in curve])


def plot_curve(curve: list[dict], path: Path) -> None:
    """Validation alpha and greedy match rate against training tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd
    import seaborn as sns

    frame = pd.DataFrame(curve)
    frame = frame.melt(id_vars="tokens", value_vars=[m for m in MEASURES if m in frame], var_name="measure")
    ax = sns.lineplot(frame, x="tokens", y="value", hue="measure", marker="o")
    ax.set(xlabel="training tokens (head positions seen)", ylabel="first draft token, validation",
           title="Draft head learning curve")
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=120)
    ax.figure.clf()


def write_report(run_dir: Path, folder: Path) -> None:
    """head.md (where the head is, its record and its curve) and learning_curve.png in the run folder."""
    meta = json.loads((folder / head_store.META).read_text())
    curve = json.loads((folder / "curve.json").read_text())
    teacher = meta["teacher"]
    lines = [
        f"# Draft head for {meta['target']}", "",
        f"Folder: `{folder}`", "",
        (f"- teacher data: {teacher['conversations']} conversations, {teacher['tokens']} tokens "
        f"({teacher['chunk_tokens']} in whole chunks), {teacher['seconds'] / 60:.1f} min of target passes"),
        (f"- training: {meta['steps']} steps, {meta['training_seconds'] / 60:.1f} min, "
        f"{meta['training_chunks']} training and {meta['validation_chunks']} validation chunks"),
        f"- final validation alpha {meta['final']['alpha']:.3f}, greedy match {meta['final']['greedy_match']:.3f}"
        + (f"; on the answers' positions alpha {meta['final']['answer_alpha']:.3f}, greedy match "
           f"{meta['final']['answer_greedy_match']:.3f}" if "answer_alpha" in meta["final"] else ""),
        "", curve_table(curve), "",
    ]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "head.md").write_text("\n".join(lines))
    plot_curve(curve, run_dir / "learning_curve.png")


def trained(cfg: DictConfig, head: DraftHead, data: tuple, folder: Path, logger, target) -> dict:
    """specdec.train.loop.train with the config's settings and a progress bar; each learning-curve point goes to W&B
    (when the logger is a W&B run) at its training step."""
    bars = []

    def progress(steps: range) -> tqdm:
        bars.append(tqdm(steps, initial=steps.start, total=cfg.train.steps, desc="training", unit="step"))
        return bars[-1]

    def observe(point: dict) -> None:
        if getattr(logger, "run", None) is not None:
            logger.run.log(point, step=point["step"])
        bars[-1].set_postfix(alpha=f"{point['alpha']:.3f}", loss=f"{point['loss']:.3f}")

    settings = TrainSettings(**OmegaConf.to_container(cfg.train, resolve=True))
    return train(head, data, target.get_output_embeddings().weight.detach(), folder, settings, observe, progress)


def run(cfg: DictConfig, run_dir: Path) -> Path:
    """Train the head these settings describe (or find it trained); its folder."""
    use_threads(cfg.threads)
    torch.manual_seed(cfg.train.seed)
    folder = head_folder(cfg)
    if (folder / head_store.META).is_file() and not cfg.retrain:
        log.info("a head with these settings is trained already: %s (retrain=true trains it again)", folder)
        write_report(run_dir, folder)
        return folder
    target = load_model(cfg.model.target.name, dtype=cfg.dtype, device=cfg.device)
    d = cfg.data

    def rows():
        texts = token_rows(conversations(d.source, REPO_ROOT), load_tokenizer(cfg.model.target.name),
                           d.conversations, d.max_tokens, target, d.answer_tokens if d.self_distill else 0)
        return tqdm(texts, total=d.conversations, desc="teacher passes", unit="conv")

    teacher, record = teacher_data(teacher_file(cfg), target, rows, d.chunk, d.top_k)
    training, held_out = teacher.held_out(cfg.data.validation)
    counts = torch.bincount(training.tokens.flatten(), minlength=target.get_output_embeddings().weight.shape[0])
    head = DraftHead(target, layers=cfg.head.layers, vocab=frequency_ranked(counts, cfg.head.vocab))
    config = OmegaConf.to_container(cfg, resolve=True)
    logger = make_logger(cfg.logger, run_dir, config, f"train_draft-{cfg.model.name}")
    state = trained(cfg, head, (training, held_out), folder, logger, target)
    save_head(head, folder)
    meta = {"target": cfg.model.target.name, "settings": config, "teacher": record,
            "training_chunks": len(training), "validation_chunks": len(held_out),
            "training_seconds": state["seconds"], "steps": state["step"], "final": state["curve"][-1],
            "machine": machine(cfg.device)}
    write_json(folder / "curve.json", state["curve"])
    write_json(folder / head_store.META, meta)
    write_report(run_dir, folder)
    logger.finish()
    return folder


@hydra.main(config_path=CONF, config_name="train_draft", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg, Path(hydra.core.hydra_config.HydraConfig.get().runtime.output_dir))
