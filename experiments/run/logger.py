"""Weights & Biases logging; the only module that imports wandb.

Offline by default (files under the run folder, uploaded later with `wandb sync`), online on request, or nothing at
all. Metric names are the same in every run so a sweep groups in one dashboard (experiments.run.summary.run_metrics:
acceptance_rate, alpha, speedup, c, tokens_per_second/<method>, chosen_k_mean, ...). Histograms of the speculative
rounds (chosen_k, accepted_depth: rounds per value 0, 1, ...) are logged as wandb.Histogram under histograms/<name>
and as a table under histograms/<name>_table.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from ..records import pd

PROMPT_METRICS = (  # logged per prompt as <method>/<metric>
    "tokens_per_second", "seconds_total", "emitted", "acceptance_rate", "mean_accepted_length", "alpha", "nll",
    "agreement", "distinct_2", "repetition_4", "peak_rss_mb", "chosen_k_mean", "plain_step_share", "tree_nodes_mean",
    "accepted_depth_mean", "predicted_tokens_per_second", "measured_tokens_per_second")  # fmt: skip


class NoLogger:
    """logger=none: every call (log_prompt, log_run, finish) does nothing."""

    def log_prompt(self, *args) -> None:
        """Nothing to log."""

    log_run = finish = log_prompt


class WandbLogger:
    """One W&B run: per-prompt metrics as steps, then summary metrics, tables and figures."""

    def __init__(self, cfg: DictConfig, run_dir: Path, config: dict, name: str):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.project, entity=cfg.get("entity"), group=cfg.get("group"), job_type=cfg.get("job_type"),
            tags=list(cfg.get("tags") or []), mode=cfg.mode, dir=str(Path(cfg.dir) if cfg.get("dir") else run_dir),
            name=name, config=config, settings=wandb.Settings(console="off", silent=True),
        )  # fmt: skip

    def log_prompt(self, index: int, rows: list[dict]) -> None:
        """One step per prompt: <method>/<metric> for every method run on it."""
        metrics = {f"{row['method']}/{key}": row[key] for row in rows for key in PROMPT_METRICS
                   if row.get(key) is not None}  # fmt: skip
        self.run.log({"prompt": index, **metrics}, step=index)

    def log_run(self, metrics: dict[str, float], tables: dict[str, pd.DataFrame], figures: list[Path],
                histograms: dict[str, list[int]]) -> None:
        """Summary metrics (stable names), tables (e.g. per-prompt rows, sample outputs), figures and
        histograms (counts[v]: rounds with value v, one bin per integer value, centred on it)."""
        self.run.summary.update(metrics)
        logged = {name: self.wandb.Table(dataframe=df) for name, df in tables.items()}
        logged.update({f"figures/{p.stem}": self.wandb.Image(str(p)) for p in figures})
        for name, counts in histograms.items():
            edges = [v - 0.5 for v in range(len(counts) + 1)]
            logged[f"histograms/{name}"] = self.wandb.Histogram(np_histogram=(counts, edges))
            logged[f"histograms/{name}_table"] = self.wandb.Table(
                columns=[name, "rounds"], data=[[value, n] for value, n in enumerate(counts)]
            )
        self.run.log(logged)

    def finish(self, interrupted: bool = False) -> None:
        self.run.finish(exit_code=1 if interrupted else 0)


def make_logger(cfg: DictConfig, run_dir: Path, config: dict, name: str) -> NoLogger | WandbLogger:
    """The logger the config names (logger.kind: wandb | none)."""
    return WandbLogger(cfg, run_dir, config, name) if cfg.kind == "wandb" else NoLogger()
