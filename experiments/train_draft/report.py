"""What a training run leaves in its run folder: the head's record, the learning curve as a table and a figure."""

from __future__ import annotations

import json
from pathlib import Path

from specdec.draft.head_store import META

from ..records import markdown_table

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
    meta = json.loads((folder / META).read_text())
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
