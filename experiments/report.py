"""Turn a sweep (or a single run) into tables and plots, from whatever finished so far.

    python -m experiments.report multirun/2026-11-29/10-00-00_smollm2     # a Hydra multirun folder
    python -m experiments.report outputs/2026-11-29/10-00-00_smollm2      # one run works too

Reads every summary.json below the folder (one per finished run) and writes into <folder>/report/: report.md
(printed), runs.csv, best_k.csv, jobs.csv and the figures speedup_vs_k.png (per temperature), alpha.png (against
temperature and quantization) and measured_on_theory.png (measured points on Leviathan's Thm 3.8 curves drawn from
each draft's measured alpha and c). Runs with k=auto or a token tree have no single k: they get a table of their own
(schedule.csv) and stay out of best_k.
A sweep's jobs are listed by status (experiments.sweeps): failed ones with their error line, started and not
yet started ones, so the report can be re-run while the sweep runs. Each run's machine (its environment.json:
device, CPU flags) is a column; runs on different machines never share a ratio: best_k is per machine, and the
figures are drawn per machine (report/machine-<n>/ when there are several).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd
import seaborn as sns

from specdec.markdown import markdown_table
from specdec.runtime.machine import machine_label
from specdec.theory import optimal_k, walltime_improvement

from .run.figures import figure, theory_curve
from .sweeps import status_markdown, sweep_status

RUN_COLUMNS = [  # run table: settings, then measurements
    "machine", "model", "draft_quantization", "target_quantization", "schedule", "temperature", "top_p", "dataset",
    "acceptance_rate", "alpha", "mean_accepted_length", "c", "speedup", "theoretical_speedup",
    "tokens_per_second/autoregressive", "tokens_per_second/speculative",
]  # fmt: skip
SCHEDULE_COLUMNS = [  # runs without a fixed k: k=auto and token trees
    "model", "schedule", "temperature", "speedup", "tokens_per_pass/speculative", "chosen_k_mean",
    "tree_nodes_mean", "accepted_depth_mean", "predicted_tokens_per_second", "measured_tokens_per_second",
]  # fmt: skip
TEXT_COLUMNS = {"model", "draft", "drafter", "draft_cost", "target_quantization", "draft_quantization", "method",
                "dataset", "device", "dtype", "run", "tree", "schedule", "verify", "machine", "host",
                "launcher"}  # fmt: skip
GROUP = ["machine", "draft", "draft_quantization", "temperature"]  # runs that differ only in k, on one machine


def environment_of(run: Path) -> dict:
    """Where a run ran (its environment.json): machine label, host, launcher; "unknown" for older runs."""
    path = run / "environment.json"
    if not path.exists():
        return {"machine": "unknown", "host": "unknown", "launcher": "unknown"}
    env = json.loads(path.read_text())
    launch = env.get("launch") or {}
    return {"machine": machine_label(env), "host": env.get("host", "unknown"),
            "launcher": launch.get("launcher", "unknown")}  # fmt: skip


def load_runs(folder: Path) -> pd.DataFrame:
    """One row per summary.json below folder: its config keys, metrics and machine, plus the run folder."""
    records = []
    for path in sorted(folder.rglob("summary.json")):
        try:
            summary = json.loads(path.read_text())
        except json.JSONDecodeError:  # being written by a job that is finishing: the next report has it
            continue
        records.append({**summary["config"], **summary["metrics"], **environment_of(path.parent),
                        "run": str(path.parent.relative_to(folder))})  # fmt: skip
    if not records:
        return pd.DataFrame()
    runs = pd.DataFrame(records)
    runs["tree"] = runs["tree"].fillna("none") if "tree" in runs else "none"  # summaries before trees
    runs["schedule"] = [f"tree={tree}" if tree != "none" else f"k={k}" for tree, k in zip(runs["tree"], runs["k"])]
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
    for (machine, draft, quantization, temperature), group in runs.dropna(subset=["speedup", "k"]).groupby(GROUP):
        best = group.loc[group["speedup"].idxmax()]
        alpha, c = group["alpha"].mean(), group["c"].mean()
        predicted = optimal_k(alpha, c) if not (math.isnan(alpha) or math.isnan(c)) else math.nan
        records.append({
            "machine": machine, "draft": draft, "draft_quantization": quantization, "temperature": temperature,
            "k_tried": ",".join(str(int(k)) for k in sorted(group["k"].unique())), "best_k": int(best["k"]),
            "speedup_at_best_k": best["speedup"], "alpha": alpha, "c": c, "theory_optimal_k": predicted,
            "theory_speedup_at_optimal_k": walltime_improvement(alpha, c, predicted)
            if not math.isnan(predicted) else math.nan,
        })  # fmt: skip
    return pd.DataFrame(records)


def frame_markdown(df: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table; floats to 3 decimals, NaN as a dash."""
    return markdown_table(list(df.columns), [list(row) for row in df.itertuples(index=False)])


def measured_lines(runs: pd.DataFrame, path: Path, x: str, y: str, hue: str, style: str, palette: str | None = None,
                   **labels) -> Path:  # fmt: skip
    """Measured y against x, one line per hue, one style per `style`; speedups over the line 1."""
    with figure(path, (7, 4.5), **labels) as ax:
        sns.lineplot(data=runs, x=x, y=y, hue=hue, style=style, markers=True, ax=ax, palette=palette, errorbar=None)
        if y == "speedup":
            ax.axhline(1.0, color="gray", lw=1)
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1, 1))
    return path


def measured_on_theory(runs: pd.DataFrame, path: Path) -> Path:
    """Measured speedups as points on Thm 3.8 curves drawn from each group's mean alpha and c."""
    temperatures = sorted(runs["temperature"].unique())
    colors = dict(zip(sorted(runs["draft"].unique()), sns.color_palette()))
    with figure(path, (6.5 * len(temperatures), 4.5), len(temperatures), xlabel="k",
                ylabel="speedup over target-only") as axes:  # fmt: skip
        for ax, temperature in zip(axes, temperatures):
            for draft, group in runs[runs["temperature"] == temperature].groupby("draft"):
                alpha, c = group["alpha"].mean(), group["c"].mean()
                theory_curve(ax, alpha, c, max(8, int(runs["k"].max())), color=colors[draft],
                             label=f"{draft}: theory (alpha {alpha:.2f}, c {c:.2f})")  # fmt: skip
                ax.plot(group["k"], group["speedup"], "o", color=colors[draft], label=f"{draft}: measured")
            ax.axhline(1.0, color="gray", lw=1)
            ax.set(title=f"temperature {temperature:g}")
            ax.legend(fontsize=7)
    return path


def sweep_figures(runs: pd.DataFrame, folder: Path) -> list[Path]:
    """Every sweep figure the runs support; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = runs.dropna(subset=["speedup", "alpha"])
    if spec.empty:
        return []
    paths = [  # speedup against k per temperature, alpha against temperature and quantization
        measured_lines(spec, folder / "speedup_vs_k.png", "k", "speedup", "temperature", "draft", "viridis",
                       xlabel="k (draft tokens per round)", ylabel="speedup over target-only", title="Speedup against k"),
        measured_lines(spec, folder / "alpha.png", "temperature", "alpha", "draft", "draft_quantization",
                       xlabel="temperature", ylabel="alpha (mean sum min(p, q))", ylim=(0, 1.05),
                       title="Alpha against temperature and quantization"),
    ]  # fmt: skip
    if spec["c"].notna().any():
        paths.append(measured_on_theory(spec.dropna(subset=["c"]), folder / "measured_on_theory.png"))
    return paths


def machine_figures(runs: pd.DataFrame, out: Path) -> list[Path]:
    """The sweep figures per machine: into out itself for one machine, else into out/machine-<n>/."""
    machines = sorted(runs["machine"].unique())
    return [path for n, machine in enumerate(machines, 1)
            for path in sweep_figures(runs[runs["machine"] == machine], out / f"machine-{n}" if len(machines) > 1
                                      else out)]  # fmt: skip


def runs_section(runs: pd.DataFrame, out: Path) -> str:
    """The finished runs' tables and figures (report.md's part after the jobs), and their CSV files."""
    if runs.empty:
        return "No finished run yet (no summary.json below the folder).\n"
    columns = [c for c in RUN_COLUMNS if c in runs.columns]
    runs[["run", *columns]].to_csv(out / "runs.csv", index=False)
    best = best_k(runs)
    best.to_csv(out / "best_k.csv", index=False)
    scheduled = runs[runs["k"].isna()]
    scheduled = scheduled[[c for c in ["machine", *SCHEDULE_COLUMNS] if c in scheduled.columns]]
    scheduled.to_csv(out / "schedule.csv", index=False)
    figures = machine_figures(runs.dropna(subset=["k"]), out)
    machines = runs["machine"].nunique()
    note = (f" They ran on {machines} different machines: every ratio below compares runs of one machine, and the "
            "figures are drawn per machine." if machines > 1 else "")  # fmt: skip
    return (
        f"## Runs\n\n{len(runs)} finished run(s).{note}\n\n{frame_markdown(runs[columns])}\n\n"
        f"## Best k per machine, draft and temperature (measured, and Thm 3.8's optimum for the measured alpha, c)\n\n"
        f"{frame_markdown(best) if not best.empty else 'No speculative runs with a fixed k.'}\n\n"
        "## k=auto and token trees (tokens per pass, chosen k, tree size, accepted depth, cost model)\n\n"
        f"{frame_markdown(scheduled) if not scheduled.empty else 'None.'}\n\n"
        "## Figures\n\n" + "\n".join(f"![{p.stem}]({p.relative_to(out)})" for p in figures) + "\n"
    )


def report(folder: Path, out: Path | None = None) -> str:
    """Write the sweep's job list, tables and figures into out (default folder/report); returns report.md."""
    if not folder.is_dir():
        raise SystemExit(f"{folder} is not a folder: point the report at a run or multirun folder")
    out = out or folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    jobs = sweep_status(folder)
    pd.DataFrame(jobs, columns=["job", "overrides", "run", "status", "detail"]).to_csv(out / "jobs.csv", index=False)
    text = f"# Report: {folder}\n\n"
    if jobs:
        text += f"## Jobs\n\n{status_markdown(jobs)}\n\n"
    text += runs_section(load_runs(folder), out)
    (out / "report.md").write_text(text)
    return text


def parser() -> argparse.ArgumentParser:
    """The command line: `python -m experiments.report <folder> [--out DIR]`."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a multirun (sweep) folder or a single run folder")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: <folder>/report)")
    return ap


def main() -> None:
    print(report(**vars(parser().parse_args())))


if __name__ == "__main__":
    main()
