"""What a run chose at its start, and why, in its folder: threads.md / .json (threads=auto) and
calibration.md / .json (a calibrated pair). experiments.run.summary joins them to summary.md and summary.json."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from specdec.choose.calibration import Calibration
from specdec.runtime.timing import ThreadChoice

from ..records import cell, markdown_table, write_json


def threads_markdown(choice: ThreadChoice) -> str:
    """One line: the thread count threads=auto chose and what each count measured."""
    probes = ", ".join(f"{n}: {ms:.1f}" for n, ms in choice.probe_ms.items())
    return (
        f"Torch threads: threads=auto chose {choice.threads} (median ms of one target step, one "
        f"{choice.width}-token pass and one {choice.prompt_tokens}-token prompt pass, by thread count: {probes}; "
        "interleaved, under this machine's load).\n"
    )


def calibration_markdown(calibration: Calibration) -> str:
    """Which draft the calibration chose and why: each candidate's measured c, alpha, predicted speedup."""
    rows = [
        [r.name, cell(r.draft_ms, "{:.1f}"), cell(r.c, "{:.2f}"), cell(r.alpha, "{:.3f}"), str(r.k),
         cell(r.pass_cost, "{:.2f}"), cell(r.speedup, "{:.2f}"), str(r.best_k),
         cell(r.best_speedup, "{:.2f}")]
        for r in calibration.results
    ]  # fmt: skip
    header = ["candidate", "draft ms", "c", "alpha", "k", "pass cost", "predicted speedup", "best k",
              "at best k"]  # fmt: skip
    return (
        f"Draft calibration (model.draft.candidates; target step {calibration.step_ms:.1f} ms; c per "
        "draft token, per lookup call for ngram; pass cost = one verification pass over k+1 tokens in "
        "target steps; speedup by Leviathan's Thm 3.8 with that pass cost):\n\n"
        f"{markdown_table(header, rows)}\n\nChosen draft: {calibration.reason}\n"
    )


def write_choices(run_dir: Path, threads: ThreadChoice | None, calibration: Calibration | None) -> None:
    """threads.md / .json when threads=auto chose the thread count; calibration.md / .json when the pair's
    draft was calibrated."""
    if threads is not None:
        (run_dir / "threads.md").write_text(threads_markdown(threads))
        write_json(run_dir / "threads.json", asdict(threads))
    if calibration is not None:
        (run_dir / "calibration.md").write_text(calibration_markdown(calibration))
        write_json(
            run_dir / "calibration.json",
            {"chosen": calibration.chosen, "reason": calibration.reason, "target_step_ms": calibration.step_ms,
             "candidates": calibration.rows()},
        )  # fmt: skip
