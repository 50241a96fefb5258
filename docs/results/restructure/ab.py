"""The restructuring of the apps and the library into one set-up entry point, before and after, side by side.

Runs the same command in two checkouts of the repository, alternating the order every round (ABBA...), each in a
process of its own, and compares what it wrote: for `experiments.run`, every method's text on every prompt (greedy:
they must be the same) and its tokens/s; for `experiments.bench`, bench.json's ratios and the greedy check.

    python docs/results/restructure/ab.py BEFORE AFTER run 2 [OVERRIDES...]
    python docs/results/restructure/ab.py BEFORE AFTER bench 1 bench=short threads=2

BEFORE and AFTER are checkouts (git worktree add); each runs with its own src/ and experiments/ first on the path.
Prints a table and one JSON line (append it to ab-<machine>.jsonl).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_side(checkout: Path, app: str, overrides: list[str], out: Path) -> float:
    """One run of `python -m experiments.<app>` in checkout, its outputs in out; returns its wall seconds."""
    env = {**os.environ, "PYTHONPATH": f"{checkout / 'src'}:{checkout}", "WANDB_MODE": "disabled"}
    command = [sys.executable, "-m", f"experiments.{app}", *overrides, f"hydra.run.dir={out}"]
    if app == "run":
        command.append("logger=none")
    start = time.perf_counter()
    subprocess.run(command, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def run_rows(out: Path) -> dict[tuple[str, str], dict]:
    """results.jsonl of experiments.run: (prompt_id, method) -> row."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    return {(str(r["prompt_id"]), r["method"]): r for r in rows}


def compare_runs(sides: dict[str, list[Path]]) -> dict:
    """Same text for every prompt and method on both sides; median tokens/s of each method on each side."""
    rows = {side: [run_rows(out) for out in outs] for side, outs in sides.items()}
    keys = sorted(rows["before"][0])
    same = all(rows["before"][0][key]["text"] == rows["after"][i][key]["text"] for i in range(len(rows["after"]))
               for key in keys)  # fmt: skip
    methods = sorted({method for _, method in keys})
    speed = {side: {m: statistics.median(r[key]["tokens_per_second"] for r in runs for key in keys if key[1] == m)
                    for m in methods} for side, runs in rows.items()}  # fmt: skip
    return {"same_text": same, "prompts": len({p for p, _ in keys}), "tokens_per_second": speed,
            "after_over_before": {m: speed["after"][m] / speed["before"][m] for m in methods}}


def compare_benches(sides: dict[str, list[Path]]) -> dict:
    """bench.json's ratios and greedy check on each side."""
    found = {side: [json.loads(next(out.rglob("bench.json")).read_text()) for out in outs] for side, outs in sides.items()}
    return {side: [{"ratios": b.get("ratios"), "greedy": b.get("greedy_check", b.get("greedy"))} for b in benches]
            for side, benches in found.items()}


def main() -> None:
    before, after, app, rounds, *overrides = sys.argv[1:]
    checkouts = {"before": Path(before).resolve(), "after": Path(after).resolve()}
    root = Path(tempfile.mkdtemp(prefix="ab-"))
    outs: dict[str, list[Path]] = {"before": [], "after": []}
    wall: dict[str, list[float]] = {"before": [], "after": []}
    for i in range(int(rounds)):
        for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
            out = root / f"{side}-{i}"
            wall[side].append(run_side(checkouts[side], app, overrides, out))
            outs[side].append(out)
            print(f"round {i} {side}: {wall[side][-1]:.0f} s", file=sys.stderr)
    result = compare_runs(outs) if app == "run" else compare_benches(outs)
    commits = {side: subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                                    text=True).stdout.strip() for side, path in checkouts.items()}  # fmt: skip
    print(json.dumps({"app": app, "overrides": overrides, "commits": commits, "wall_seconds": wall,
                      "load_average": os.getloadavg()[0], **result}))


if __name__ == "__main__":
    main()
