"""The Makefile's recipes do what the README says: `make lab` opens JupyterLab as root too (containers run as root,
and JupyterLab refuses root without --allow-root), and as a user without that flag."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def recipe(target: str) -> str:
    """The shell line make runs for target (one-line recipes), as make passes it to the shell ($$ -> $)."""
    makefile = (ROOT / "Makefile").read_text()
    line = re.search(rf"^{target}:.*\n\t(.+)$", makefile, re.MULTILINE).group(1)
    return line.replace("$(BIN)", ".venv/bin").replace("$$", "$")


@pytest.mark.parametrize("uid, flag", [(0, True), (1000, False)])
def test_lab_allows_root_only_as_root(uid: int, flag: bool):
    """The lab recipe run by bash with `id -u` answering uid and jupyter replaced by echo: --allow-root as root only."""
    command = recipe("lab").replace(".venv/bin/jupyter", "echo jupyter")
    assert command.startswith("echo jupyter lab notebooks/")
    out = subprocess.run(["bash", "-c", f"id() {{ echo {uid}; }}; {command}"], capture_output=True, text=True,
                         check=True, timeout=10)  # fmt: skip
    assert out.stdout.split() == ["jupyter", "lab", "notebooks/", *(["--allow-root"] if flag else [])]
