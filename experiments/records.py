"""Run I/O in one place: strict JSON, the files a run writes, and the commit a number came from (the machine is the
library's: specdec.runtime.machine)."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
from pathlib import Path

from specdec.runtime import machine as library_machine


class Lazily:
    """A module imported on its first use, not in sys.modules till then (where inspect.getmodule would load it)."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attribute: str):
        return getattr(importlib.import_module(self.name), attribute)


pd = Lazily("pandas")  # pandas and pyarrow (60 MB) load after the timed runs

REPO_ROOT = Path(__file__).resolve().parents[1]


def strict_json(value: object) -> object:
    """NaN and infinities become null (in nested dicts and lists too), so the output is plain JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(strict_json(value), indent=2) + "\n")


def append_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "a") as f:
        f.writelines(
            json.dumps({key: strict_json(value) for key, value in row.items()}) + "\n" for row in rows
        )


def read_rows(path: Path) -> pd.DataFrame:
    """results.jsonl back as a DataFrame (null -> NaN)."""
    with open(path) as f:
        return pd.DataFrame([json.loads(line) for line in f if line.strip()])


def write_result(folder: Path, name: str, result: dict, table: str) -> None:
    """<folder>/<name>.json (strict JSON) and <folder>/<name>.md (the table)."""
    write_json(folder / f"{name}.json", result)
    (folder / f"{name}.md").write_text(table)


def git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, check=False, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def machine(device: str = "cpu") -> dict[str, object]:
    """The library's machine record (specdec.runtime.machine) with the repository's git commit: what a number ran on."""
    dirty = git("status", "--porcelain", "--untracked-files=no") not in ("", "unknown")
    return {"git_commit": git("rev-parse", "HEAD"), "git_dirty": dirty, **library_machine.machine(device)}


def provenance(device: str = "cpu") -> str:
    """Where and when outputs come from: the date, the machine and the commit (a notebook prints it first)."""
    info = machine(device)
    code = git("status", "--porcelain", "--untracked-files=no", "--", "src", "experiments", "conf", "data")
    dirty = " with uncommitted changes to the code" if code not in ("", "unknown") else ""
    return (f"Run on {info['date']} at commit {str(info['git_commit'])[:10]}{dirty}. "
            f"{library_machine.machine_sentence(info)}")
