"""What a run chose, and why, in its folder: threads.md / .json (threads=auto), calibration.md / .json (a
calibrated pair) and runtime.md / .json (runtime=compiled: what compiling cost). experiments.run.summary joins them
to summary.md and summary.json."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from specdec.auto.calibration import Calibration
from specdec.runtime.compiled import CompiledForward
from specdec.runtime.probes import ThreadChoice

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


def runtime_markdown(runtimes: dict[str, CompiledForward]) -> str:
    """runtime=compiled: per model, its graphs' compile seconds, whether inductor's disk cache held them, or why the
    model runs eager, and the ms of a pass in each width bucket as timed at load (a pass pads to the cheapest). A
    graph for every width up to the widest (dynamic_width) shows as rows x 1-widest."""
    rows = []
    for role, runtime in runtimes.items():
        r = runtime.record
        cache = ("warm" if r.warm else f"{r.cache_hits} loaded, {r.cache_misses} compiled, {r.cache_bypassed} "
                 "compiled and refused by the disk cache")
        shapes = ", ".join(f"{rows}x{'1-' * runtime.dynamic_width}{width}" for rows, width in r.seconds)
        timed = ", ".join(f"{w}: {ms:.1f}" for w, ms in runtime.pass_ms.items()) or "-"
        rows.append([role, r.eager_reason and f"eager ({r.eager_reason})" or "compiled", shapes or "-",
                     cell(r.total_seconds, "{:.1f}"), "-" if r.eager_reason else cache, timed])
    header = ["model", "runs", "graphs (rows x width)", "compile s", "inductor disk cache", "pass ms by bucket"]
    notes = "".join(f"\n{role}: CUDA graphs, {g['recorded']} passes recorded, {g['replayed']} replayed"
                    + (f" (recording stopped: {g['failed']})" if g["failed"] else "") + "\n"
                    for role, runtime in runtimes.items() if (g := cuda_graphs(runtime)))
    return f"Runtime: compiled (specdec.runtime.compiled).\n\n{markdown_table(header, rows)}\n{notes}"


def cuda_graphs(runtime: CompiledForward) -> dict | None:
    """On a GPU: how many passes were recorded as CUDA graphs and replayed (specdec.runtime.graphs); else None."""
    graphs = runtime.graphs
    return graphs and {"recorded": graphs.recorded, "replayed": graphs.replayed, "failed": graphs.failed}


def write_runtime(run_dir: Path, runtimes: dict[str, CompiledForward]) -> None:
    """runtime.md / .json when models ran on the compiled runtime (after the run: graphs compile at first use)."""
    if not runtimes:
        return
    (run_dir / "runtime.md").write_text(runtime_markdown(runtimes))
    write_json(run_dir / "runtime.json", {
        role: {**asdict(r.record), "seconds": {f"{b}x{w}": s for (b, w), s in r.record.seconds.items()},
               "total_seconds": r.record.total_seconds, "warm": r.record.warm, "widths": list(r.widths),
               "dynamic_width": r.dynamic_width,
               "pass_ms": r.pass_ms, "cuda_graphs": cuda_graphs(r)}
        for role, r in runtimes.items()})
