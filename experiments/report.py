"""Turn a sweep (or a single run) into tables and plots.

    python -m experiments.report multirun/2026-11-29/10-00-00_smollm2     # a Hydra multirun folder
    python -m experiments.report outputs/2026-11-29/10-00-00_smollm2      # one run works too

Reads every summary.json below the folder (one per run) and writes into <folder>/report/:
report.md (printed), runs.csv, best_k.csv and the figures speedup_vs_k.png (per temperature),
alpha.png (against temperature and quantization) and measured_on_theory.png (measured points on
Leviathan's Thm 3.8 curves drawn from each draft's measured alpha and c). Runs with k=auto or a
token tree have no single k: they get a table of their own (schedule.csv) and stay out of best_k.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from specdec.theory import optimal_k, walltime_improvement

from .records import markdown_table
from .run.figures import sweep_figures

RUN_COLUMNS = [  # run table: settings, then measurements
    "model", "draft_quantization", "target_quantization", "schedule", "temperature", "top_p", "dataset",
    "acceptance_rate", "alpha", "mean_accepted_length", "c", "speedup", "theoretical_speedup",
    "tokens_per_second/autoregressive", "tokens_per_second/speculative",
]  # fmt: skip
SCHEDULE_COLUMNS = [  # runs without a fixed k: k=auto and token trees
    "model", "schedule", "temperature", "speedup", "tokens_per_pass/speculative", "chosen_k_mean",
    "tree_nodes_mean", "accepted_depth_mean", "predicted_tokens_per_second", "measured_tokens_per_second",
]  # fmt: skip
TEXT_COLUMNS = {"model", "draft", "drafter", "draft_cost", "target_quantization", "draft_quantization", "method",
                "dataset", "device", "dtype", "run", "tree", "schedule", "verify"}  # fmt: skip
GROUP = ["draft", "draft_quantization", "temperature"]  # runs that differ only in k


def load_runs(folder: Path) -> pd.DataFrame:
    """One row per summary.json below folder: its config keys and metrics, plus the run folder."""
    records = []
    for path in sorted(folder.rglob("summary.json")):
        summary = json.loads(path.read_text())
        records.append(
            {**summary["config"], **summary["metrics"], "run": str(path.parent.relative_to(folder))}
        )
    if not records:
        raise SystemExit(f"no summary.json below {folder}: point the report at a run or multirun folder")
    runs = pd.DataFrame(records)
    runs["tree"] = runs["tree"].fillna("none") if "tree" in runs else "none"  # summaries before trees
    runs["schedule"] = [
        f"tree={tree}" if tree != "none" else f"k={k}" for tree, k in zip(runs["tree"], runs["k"])
    ]
    runs["k"] = pd.to_numeric(runs["k"], errors="coerce").where(runs["tree"] == "none")  # NaN: auto, tree
    runs = runs.sort_values(["model", "temperature", "k"], ignore_index=True)
    runs = runs.rename(columns={"draft": "drafter"})  # what drafted, as the run recorded it
    runs["draft"] = runs["model"]  # a pair names its drafter
    numbers = [c for c in runs.columns if c not in TEXT_COLUMNS]
    runs[numbers] = runs[numbers].apply(pd.to_numeric)  # null (NaN) metrics arrive as None
    return runs


def best_k(runs: pd.DataFrame) -> pd.DataFrame:
    """Per draft, quantization and temperature: the best measured k, and the k Thm 3.8 predicts."""
    records = []
    for (draft, quantization, temperature), group in runs.dropna(subset=["speedup", "k"]).groupby(GROUP):
        best = group.loc[group["speedup"].idxmax()]
        alpha, c = group["alpha"].mean(), group["c"].mean()
        predicted = optimal_k(alpha, c) if not (math.isnan(alpha) or math.isnan(c)) else math.nan
        records.append(
            {
                "draft": draft,
                "draft_quantization": quantization,
                "temperature": temperature,
                "k_tried": ",".join(str(int(k)) for k in sorted(group["k"].unique())),
                "best_k": int(best["k"]),
                "speedup_at_best_k": best["speedup"],
                "alpha": alpha,
                "c": c,
                "theory_optimal_k": predicted,
                "theory_speedup_at_optimal_k": walltime_improvement(alpha, c, predicted)
                if not math.isnan(predicted)
                else math.nan,
            }
        )
    return pd.DataFrame(records)


def frame_markdown(df: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table; floats to 3 decimals, NaN as a dash."""
    return markdown_table(list(df.columns), [list(row) for row in df.itertuples(index=False)])


def report(folder: Path, out: Path | None = None) -> str:
    """Write the sweep's tables and figures into out (default folder/report); returns report.md."""
    out = out or folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(folder)
    columns = [c for c in RUN_COLUMNS if c in runs.columns]
    runs[["run", *columns]].to_csv(out / "runs.csv", index=False)
    best = best_k(runs)
    best.to_csv(out / "best_k.csv", index=False)
    scheduled = runs[runs["k"].isna()]
    scheduled = scheduled[[c for c in SCHEDULE_COLUMNS if c in scheduled.columns]]
    scheduled.to_csv(out / "schedule.csv", index=False)
    figures = sweep_figures(runs.dropna(subset=["k"]), out)
    text = (
        f"# Report: {folder}\n\n{len(runs)} run(s).\n\n## Runs\n\n{frame_markdown(runs[columns])}\n\n"
        f"## Best k per draft and temperature (measured, and Thm 3.8's optimum for the measured alpha, c)\n\n"
        f"{frame_markdown(best) if not best.empty else 'No speculative runs with a fixed k.'}\n\n"
        "## k=auto and token trees (tokens per pass, chosen k, tree size, accepted depth, cost model)\n\n"
        f"{frame_markdown(scheduled) if not scheduled.empty else 'None.'}\n\n"
        "## Figures\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in figures) + "\n"
    )
    (out / "report.md").write_text(text)
    return text


def parser() -> argparse.ArgumentParser:
    """The command line: `python -m experiments.report <folder> [--out DIR]`."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a multirun (sweep) folder or a single run folder")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: <folder>/report)")
    return ap


def main() -> None:
    args = parser().parse_args()
    print(report(args.folder, args.out))


if __name__ == "__main__":
    main()
