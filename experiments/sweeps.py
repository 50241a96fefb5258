"""The state of a sweep folder while it runs or after: which jobs finished, failed, are running or never started.

A Hydra sweep folder holds multirun.yaml (the sweep's overrides, written before any job starts) and one run
folder per job, each with .hydra/overrides.yaml. A job writes done.json last when it finished and failed.json
when it raised (experiments.run.jobs writes them with the functions here). Everything else here only reads, so it
can run while the sweep still runs.
"""

from __future__ import annotations

import json
import platform
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from specdec.markdown import markdown_table

from .records import write_json

DONE, FAILED = "done.json", "failed.json"  # markers in a job's run folder
LOG_TAIL = 3  # lines of a job's log shown when it stopped without a failed.json (killed, out of memory, ...)
ERROR_CHARS = 400  # of a failed job's error message, on one line


def finished(run_dir: Path, overrides: list[str]) -> bool:
    """True when the folder holds a done.json written by a job with these overrides."""
    marker = run_dir / DONE
    return marker.exists() and json.loads(marker.read_text()).get("overrides") == overrides


def mark_done(run_dir: Path, overrides: list[str], seconds: float) -> None:
    """done.json: written last, so its presence means the job's results are complete."""
    write_json(run_dir / DONE, {"overrides": overrides, "seconds": round(seconds, 3), "host": platform.node()})


def record_failure(run_dir: Path, overrides: list[str], error: BaseException, seconds: float) -> None:
    """failed.json: the error's type and message, where it was raised and the traceback's last lines."""
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    write_json(run_dir / FAILED, {
        "overrides": overrides, "error": f"{type(error).__name__}: {error}".strip(), "seconds": round(seconds, 3),
        "host": platform.node(), "traceback": "".join(lines).splitlines()[-12:],
    })  # fmt: skip


def start_afresh(run_dir: Path) -> None:
    """A job run again in its folder (a re-launched sweep, skip_finished=false or unfinished) starts without the
    earlier attempt's markers; its rows move to results.jsonl.replaced, as the run appends to results.jsonl."""
    (run_dir / DONE).unlink(missing_ok=True)
    (run_dir / FAILED).unlink(missing_ok=True)
    if (run_dir / "results.jsonl").exists():
        (run_dir / "results.jsonl").replace(run_dir / "results.jsonl.replaced")


def expected_jobs(sweep_dir: Path) -> list[list[str]] | None:
    """Every job's overrides, in Hydra's order, from the sweep's multirun.yaml (the basic sweeper's cartesian
    product of the comma-separated values); None when the folder holds no multirun.yaml (a single run) or another
    sweeper's ranges (the jobs found in the folder are then all that is known)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    path = sweep_dir / "multirun.yaml"
    if not path.exists():
        return None
    hydra_cfg = OmegaConf.load(path).hydra
    params = [f"{k}={v}" for k, v in (hydra_cfg.sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides([*params, *hydra_cfg.overrides.task])
    try:
        batches = BasicSweeper.split_arguments(overrides, None)
    except HydraException:  # a range or interval sweep (another sweeper's): no list of jobs in advance
        return None
    return [job for batch in batches for job in batch]


def job_folders(sweep_dir: Path) -> dict[tuple[str, ...], Path]:
    """The run folders below sweep_dir that Hydra created (they hold .hydra/overrides.yaml), by overrides."""
    found = {}
    for path in sorted(sweep_dir.rglob(".hydra/overrides.yaml")):
        found[tuple(str(o) for o in OmegaConf.load(path))] = path.parent.parent
    return found


def log_tail(folder: Path) -> str:
    """The last lines of the job's Hydra log (<job>.log), or of submitit's output for it."""
    logs = sorted(folder.glob("*.log"))
    lines = logs[0].read_text(errors="replace").strip().splitlines() if logs else []
    return " / ".join(lines[-LOG_TAIL:]) if lines else "no log yet"


def status_of(folder: Path | None) -> tuple[str, str]:
    """(status, detail) of one job: finished, failed (its error line), started (running, or stopped without a
    record: the log's last lines), or not started."""
    if folder is None:
        return "not started", ""
    if (folder / DONE).exists():
        return "finished", ""
    if (folder / FAILED).exists():
        return "failed", " ".join(json.loads((folder / FAILED).read_text())["error"].split())[:ERROR_CHARS]
    return "started, no marker (running or killed)", log_tail(folder)


def sweep_status(sweep_dir: Path) -> list[dict]:
    """One row per job: its number, overrides, run folder, status and error (or log) line. Jobs the sweep expects
    but that never started are listed too."""
    folders = job_folders(sweep_dir)
    expected = expected_jobs(sweep_dir) or [list(key) for key in folders]
    rows = []
    for num, overrides in enumerate(expected):
        folder = folders.pop(tuple(overrides), None)
        status, detail = status_of(folder)
        run = str(folder.relative_to(sweep_dir)) if folder else "-"
        rows.append({"job": num, "overrides": " ".join(overrides), "run": run, "status": status, "detail": detail})
    for key, folder in folders.items():  # folders of an earlier sweep into the same directory
        status, detail = status_of(folder)
        rows.append({"job": "-", "overrides": " ".join(key), "run": str(folder.relative_to(sweep_dir)),
                     "status": f"{status} (not in this sweep)", "detail": detail})  # fmt: skip
    return rows


def status_markdown(rows: list[dict]) -> str:
    """The counts per status, the overrides every job shares, then the jobs that did not finish (the overrides
    that tell them apart) with their error or log lines."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    text = f"{len(rows)} job(s): " + ", ".join(f"{n} {status}" for status, n in counts.items()) + "."
    shared = set.intersection(*(set(r["overrides"].split()) for r in rows))
    if shared and len(rows) > 1:
        text += " Every job: `" + " ".join(o for o in rows[0]["overrides"].split() if o in shared) + "`."
    unfinished = [r for r in rows if r["status"] != "finished"]
    if unfinished:
        own = [" ".join(o for o in r["overrides"].split() if o not in shared or len(rows) == 1) for r in unfinished]
        table = [[str(r["job"]), overrides, r["run"], r["status"], r["detail"].replace("|", "\\|")]
                 for r, overrides in zip(unfinished, own)]  # fmt: skip
        text += "\n\n" + markdown_table(["job", "overrides", "run folder", "status", "error (or last log lines)"], table)
    return text
