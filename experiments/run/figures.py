"""Seaborn figures of one run (per-prompt rows) and of a sweep (one row per run)."""

from __future__ import annotations

import logging
import math
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


def save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def position_rates(rows: pd.DataFrame) -> pd.DataFrame:
    """Long table (prompt_id, position, rate): P(position accepted | drafted and reached), per prompt."""
    records = [{"prompt_id": prompt, "position": i + 1, "rate": rate}
               for prompt, stats in zip(rows["prompt_id"], stats_of(rows))
               for i, rate in enumerate(stats.acceptance_by_position)]  # fmt: skip
    return pd.DataFrame(records, columns=["prompt_id", "position", "rate"])


def acceptance_by_position(spec: pd.DataFrame, alpha: float, path: Path) -> Path:
    """Bars: acceptance rate at each draft position (mean over prompts, 95% CI); line: measured alpha."""
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.barplot(data=position_rates(spec), x="position", y="rate", ax=ax, color="C0", errorbar=("ci", 95))
    if not math.isnan(alpha):  # trees measure no alpha
        ax.axhline(alpha, color="C3", ls="--", label=f"alpha = {alpha:.2f}")
        ax.legend()
    ax.set(xlabel="draft position i (tree depth)", ylabel="P(accept i | reached i)", ylim=(0, 1.05))
    ax.set_title("Acceptance by draft position")
    return save(fig, path)


def accepted_length_histogram(
    spec: pd.DataFrame, alpha: float, k: int, path: Path, theory: bool = True
) -> Path:
    """Share of rounds accepting n = 0..k drafts (a tree: the accepted depth), next to the i.i.d. model
    alpha^n (1 - alpha) when `theory` (a chain of fixed k)."""
    counts = pd.Series([n for rounds in spec["accepted_per_round"] for n in rounds]).value_counts(
        normalize=True
    )
    measured = pd.DataFrame({"accepted": range(k + 1)})
    measured["share"] = measured["accepted"].map(counts).fillna(0.0)
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.barplot(data=measured, x="accepted", y="share", ax=ax, color="C0", label="measured")
    if theory:
        theory_shares = accepted_length_distribution(alpha, k)
        ax.plot(range(k + 1), theory_shares, "o-", color="C3", label="theory (alpha)")
    ax.set(xlabel="draft tokens accepted in a round", ylabel="share of rounds")
    title = f"Accepted length per round (k = {k})" if theory else f"Accepted depth per round (longest {k})"
    ax.set_title(title)
    ax.legend()
    return save(fig, path)


def tokens_per_second(rows: pd.DataFrame, path: Path) -> Path:
    """Tokens/s of each method: bars are means over prompts, dots single prompts."""
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.barplot(data=rows, x="method", y="tokens_per_second", ax=ax, hue="method", errorbar=("ci", 95))
    sns.stripplot(data=rows, x="method", y="tokens_per_second", ax=ax, color="black", size=4)
    ax.set(xlabel="", ylabel="new tokens per second")
    ax.set_title("Throughput by method")
    return save(fig, path)


def theory_curve(ax: plt.Axes, alpha: float, c: float, k_max: int, **style) -> None:
    ks = list(range(1, k_max + 1))
    ax.plot(ks, [walltime_improvement(alpha, c, k) for k in ks], **style)


def speedup_vs_theory(metrics: dict[str, float], k: int, path: Path) -> Path:
    """Thm 3.8's speedup over k for the measured alpha and c, the c = 0 bound, and the measured point."""
    alpha, c = metrics["alpha"], metrics["c"]
    k_max = max(8, 2 * k)
    fig, ax = plt.subplots(figsize=(6, 4))
    theory_curve(ax, alpha, c, k_max, color="C0", label=f"theory: alpha {alpha:.2f}, c {c:.2f}")
    theory_curve(ax, alpha, 0.0, k_max, color="C0", ls=":", label="theory with c = 0")
    ax.plot([k], [metrics["speedup"]], "o", color="C3", ms=9, label=f"measured at k = {k}")
    ax.axhline(1.0, color="gray", lw=1)
    ax.set(xlabel="k (draft tokens per round)", ylabel="speedup over target-only")
    ax.set_title("Measured against theoretical speedup")
    ax.legend()
    return save(fig, path)


def chosen_k_histogram(counts: list[int], metrics: dict[str, float], path: Path) -> Path:
    """k=auto: rounds that chose each draft length k = 0 (a plain target step) .. k_max."""
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.barplot(x=list(range(len(counts))), y=counts, ax=ax, color="C0")
    ax.set(xlabel="draft length k chosen by the cost model (0: plain target step)", ylabel="rounds")
    ax.set_title(f"Chosen k per round (mean {metrics['chosen_k_mean']:.2f})")
    return save(fig, path)


def decisions(spec: pd.DataFrame, path: Path) -> Path:
    """k=auto over candidates: each round's draft length and draft, in the order the run made them (prompts
    one after another, a line between prompts), so that a change of choice under load shows."""
    records = [
        {"round": i, "k": k, "draft": draft or "none (plain step)"}
        for i, (k, draft) in enumerate(
            (k, d) for ks, ds in zip(spec["chosen_k"], spec["chosen_draft"]) for k, d in zip(ks, ds)
        )
    ]  # fmt: skip
    frame = pd.DataFrame(records)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    sns.scatterplot(data=frame, x="round", y="k", hue="draft", style="draft", ax=ax, s=18)
    for end in pd.Series([len(ks) for ks in spec["chosen_k"]]).cumsum()[:-1]:
        ax.axvline(end - 0.5, color="0.4", lw=0.8, ls=":", zorder=0)
    ax.legend(title="draft", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set(xlabel="round (prompts in run order; dotted: next prompt)", ylabel="draft length k (0: no draft)")
    ax.set_title("Decisions over the run: which draft, and how long")
    return save(fig, path)


def run_figures(
    rows: pd.DataFrame,
    metrics: dict[str, float],
    histograms: dict[str, list[int]],
    k: int | None,
    longest: int,
    folder: Path,
) -> list[Path]:
    """Every figure of one run that its rows support; returns the files written.

    k: the fixed chain length (None for k=auto and trees: no Thm 3.8 curve); longest: the longest draft
    (k, k_max or the tree depth)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [tokens_per_second(rows, folder / "tokens_per_second.png")]
    spec = rows[(rows["method"] == "speculative") & (rows["drafted"] > 0)]
    if not spec.empty:
        paths.append(acceptance_by_position(spec, metrics["alpha"], folder / "acceptance_by_position.png"))
        paths.append(
            accepted_length_histogram(
                spec, metrics["alpha"], longest, folder / "accepted_length.png", theory=k is not None
            )
        )
    if k is None and "chosen_k" in histograms:
        paths.append(chosen_k_histogram(histograms["chosen_k"], metrics, folder / "chosen_k.png"))
    chosen = rows[rows["method"] == "speculative"]
    if "chosen_draft" in chosen and chosen["chosen_draft"].map(len).sum():
        paths.append(decisions(chosen, folder / "decisions.png"))
    if "c" in metrics:
        paths.append(speedup_vs_theory(metrics, k, folder / "speedup_vs_theory.png"))
    return paths


def speedup_vs_k(runs: pd.DataFrame, path: Path) -> Path:
    """Sweep: measured speedup against k, one line per temperature, one style per draft."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sns.lineplot(data=runs, x="k", y="speedup", hue="temperature", style="draft", markers=True, ax=ax,
                 palette="viridis", errorbar=None)  # fmt: skip
    ax.axhline(1.0, color="gray", lw=1)
    ax.set(xlabel="k (draft tokens per round)", ylabel="speedup over target-only")
    ax.set_title("Speedup against k")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1, 1))
    return save(fig, path)


def alpha_vs_temperature(runs: pd.DataFrame, path: Path) -> Path:
    """Sweep: measured alpha against temperature, one line per draft and quantization."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sns.lineplot(data=runs, x="temperature", y="alpha", hue="draft", style="draft_quantization", markers=True,
                 ax=ax, errorbar=None)  # fmt: skip
    ax.set(xlabel="temperature", ylabel="alpha (mean sum min(p, q))", ylim=(0, 1.05))
    ax.set_title("Alpha against temperature and quantization")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1, 1))
    return save(fig, path)


def measured_on_theory(runs: pd.DataFrame, path: Path) -> Path:
    """Sweep: measured speedups as points on Thm 3.8 curves drawn from each group's mean alpha and c."""
    temperatures = sorted(runs["temperature"].unique())
    fig, axes = plt.subplots(1, len(temperatures), figsize=(6.5 * len(temperatures), 4.5), squeeze=False)
    k_max = max(8, int(runs["k"].max()))
    colors = dict(zip(sorted(runs["draft"].unique()), sns.color_palette()))
    for ax, temperature in zip(axes[0], temperatures):
        for draft, group in runs[runs["temperature"] == temperature].groupby("draft"):
            color = colors[draft]
            alpha, c = group["alpha"].mean(), group["c"].mean()
            theory_curve(
                ax, alpha, c, k_max, color=color, label=f"{draft}: theory (alpha {alpha:.2f}, c {c:.2f})"
            )
            ax.plot(group["k"], group["speedup"], "o", color=color, label=f"{draft}: measured")
        ax.axhline(1.0, color="gray", lw=1)
        ax.set(xlabel="k", ylabel="speedup over target-only", title=f"temperature {temperature:g}")
        ax.legend(fontsize=7)
    return save(fig, path)


def sweep_figures(runs: pd.DataFrame, folder: Path) -> list[Path]:
    """Every sweep figure the runs support; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = runs.dropna(subset=["speedup", "alpha"])
    if spec.empty:
        return []
    paths = [
        speedup_vs_k(spec, folder / "speedup_vs_k.png"),
        alpha_vs_temperature(spec, folder / "alpha.png"),
    ]
    if spec["c"].notna().any():
        paths.append(measured_on_theory(spec.dropna(subset=["c"]), folder / "measured_on_theory.png"))
    return paths
