"""Seaborn figures of one run (per-prompt rows); `figure` and `theory_curve` draw the sweep's too (experiments.report)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
logging.getLogger("matplotlib.category").setLevel(logging.WARNING)  # seaborn's categorical axes are intended

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from specdec.theory import accepted_length_distribution, walltime_improvement

from .summary import stats_of

sns.set_theme(style="whitegrid", context="notebook")


@contextmanager
def figure(path: Path, size: tuple[float, float] = (6, 4), panels: int | None = None, **labels) -> Iterator:
    """The axes to draw on (panels given: a row of that many); then each gets the labels (xlabel, ylabel, ylim,
    title) and the figure is saved at path."""
    fig, axes = plt.subplots(1, panels or 1, figsize=size, squeeze=False)
    yield axes[0] if panels else axes[0][0]
    for ax in axes[0]:
        ax.set(**labels)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def theory_curve(ax: plt.Axes, alpha: float, c: float, k_max: int, **style) -> None:
    """Thm 3.8's speedup for k = 1..k_max."""
    ks = list(range(1, k_max + 1))
    ax.plot(ks, [walltime_improvement(alpha, c, k) for k in ks], **style)


def acceptance_by_position(spec: pd.DataFrame, alpha: float, path: Path) -> Path:
    """Bars: acceptance rate at each draft position (mean over prompts, 95% CI); line: measured alpha."""
    rates = pd.DataFrame([{"prompt_id": prompt, "position": i + 1, "rate": rate}
                          for prompt, stats in zip(spec["prompt_id"], stats_of(spec))
                          for i, rate in enumerate(stats.acceptance_by_position)],
                         columns=["prompt_id", "position", "rate"])  # fmt: skip
    with figure(path, xlabel="draft position i (tree depth)", ylabel="P(accept i | reached i)", ylim=(0, 1.05),
                title="Acceptance by draft position") as ax:  # fmt: skip
        sns.barplot(data=rates, x="position", y="rate", ax=ax, color="C0", errorbar=("ci", 95))
        if not math.isnan(alpha):  # trees measure no alpha
            ax.axhline(alpha, color="C3", ls="--", label=f"alpha = {alpha:.2f}")
            ax.legend()
    return path


def accepted_length_histogram(spec: pd.DataFrame, alpha: float, k: int, path: Path, theory: bool) -> Path:
    """Share of rounds accepting n = 0..k drafts (a tree: the accepted depth), next to the i.i.d. model
    alpha^n (1 - alpha) when `theory` (a chain of fixed k)."""
    counts = pd.Series([n for rounds in spec["accepted_per_round"] for n in rounds]).value_counts(normalize=True)
    measured = pd.DataFrame({"accepted": range(k + 1), "share": [counts.get(n, 0.0) for n in range(k + 1)]})
    title = f"Accepted length per round (k = {k})" if theory else f"Accepted depth per round (longest {k})"
    with figure(path, xlabel="draft tokens accepted in a round", ylabel="share of rounds", title=title) as ax:
        sns.barplot(data=measured, x="accepted", y="share", ax=ax, color="C0", label="measured")
        if theory:
            ax.plot(range(k + 1), accepted_length_distribution(alpha, k), "o-", color="C3", label="theory (alpha)")
        ax.legend()
    return path


def tokens_per_second(rows: pd.DataFrame, path: Path) -> Path:
    """Tokens/s of each method: bars are means over prompts, dots single prompts."""
    with figure(path, xlabel="", ylabel="new tokens per second", title="Throughput by method") as ax:
        sns.barplot(data=rows, x="method", y="tokens_per_second", ax=ax, hue="method", errorbar=("ci", 95))
        sns.stripplot(data=rows, x="method", y="tokens_per_second", ax=ax, color="black", size=4)
    return path


def speedup_vs_theory(metrics: dict[str, float], k: int, path: Path) -> Path:
    """Thm 3.8's speedup over k for the measured alpha and c, the c = 0 bound, and the measured point."""
    alpha, c, k_max = metrics["alpha"], metrics["c"], max(8, 2 * k)
    with figure(path, xlabel="k (draft tokens per round)", ylabel="speedup over target-only",
                title="Measured against theoretical speedup") as ax:  # fmt: skip
        theory_curve(ax, alpha, c, k_max, color="C0", label=f"theory: alpha {alpha:.2f}, c {c:.2f}")
        theory_curve(ax, alpha, 0.0, k_max, color="C0", ls=":", label="theory with c = 0")
        ax.plot([k], [metrics["speedup"]], "o", color="C3", ms=9, label=f"measured at k = {k}")
        ax.axhline(1.0, color="gray", lw=1)
        ax.legend()
    return path


def chosen_k_histogram(counts: list[int], metrics: dict[str, float], path: Path) -> Path:
    """k=auto: rounds that chose each draft length k = 0 (a plain target step) .. k_max."""
    with figure(path, xlabel="draft length k chosen by the cost model (0: plain target step)", ylabel="rounds",
                title=f"Chosen k per round (mean {metrics['chosen_k_mean']:.2f})") as ax:  # fmt: skip
        sns.barplot(x=list(range(len(counts))), y=counts, ax=ax, color="C0")
    return path


def decisions(spec: pd.DataFrame, path: Path) -> Path:
    """k=auto over candidates: each round's draft length and draft, in the order the run made them (prompts
    one after another, a line between prompts), so that a change of choice under load shows."""
    chosen = [(k, d) for ks, ds in zip(spec["chosen_k"], spec["chosen_draft"]) for k, d in zip(ks, ds)]
    frame = pd.DataFrame([{"round": i, "k": k, "draft": draft or "none (plain step)"}
                          for i, (k, draft) in enumerate(chosen)])  # fmt: skip
    with figure(path, (9, 3.5), xlabel="round (prompts in run order; dotted: next prompt)",
                ylabel="draft length k (0: no draft)", title="Decisions over the run: which draft, and how long") as ax:
        sns.scatterplot(data=frame, x="round", y="k", hue="draft", style="draft", ax=ax, s=18)
        for end in pd.Series([len(ks) for ks in spec["chosen_k"]]).cumsum()[:-1]:
            ax.axvline(end - 0.5, color="0.4", lw=0.8, ls=":", zorder=0)
        ax.legend(title="draft", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return path


def run_figures(rows: pd.DataFrame, metrics: dict[str, float], histograms: dict[str, list[int]], k: int | None,
                longest: int, folder: Path) -> list[Path]:  # fmt: skip
    """Every figure of one run that its rows support; returns the files written.

    k: the fixed chain length (None for k=auto and trees: no Thm 3.8 curve); longest: the longest draft
    (k, k_max or the tree depth)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [tokens_per_second(rows, folder / "tokens_per_second.png")]
    spec = rows[(rows["method"] == "speculative") & (rows["drafted"] > 0)]
    if not spec.empty:
        paths.append(acceptance_by_position(spec, metrics["alpha"], folder / "acceptance_by_position.png"))
        paths.append(accepted_length_histogram(spec, metrics["alpha"], longest, folder / "accepted_length.png",
                                               theory=k is not None))  # fmt: skip
    if k is None and "chosen_k" in histograms:
        paths.append(chosen_k_histogram(histograms["chosen_k"], metrics, folder / "chosen_k.png"))
    chosen = rows[rows["method"] == "speculative"]
    if "chosen_draft" in chosen and chosen["chosen_draft"].map(len).sum():
        paths.append(decisions(chosen, folder / "decisions.png"))
    if "c" in metrics:
        paths.append(speedup_vs_theory(metrics, k, folder / "speedup_vs_theory.png"))
    return paths
