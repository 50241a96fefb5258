"""Every notebook runs top to bottom, as a reader would run it, in `make test-all` (marker `exhaustive`): in its
fast setting (SPECDEC_FAST=1) and in its full setting (SPECDEC_SAVE_NOTEBOOKS=1 writes the executed notebooks
back, which is how their committed outputs are made).

The kernel is this interpreter (jupyter_client maps the kernel spec's `python` to sys.executable),
started in notebooks/ like JupyterLab does. Each notebook's own asserts are the checks.
"""

import os
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["01_derivation", "02_article_vs_speculative", "03_results", "04_draft_heads"]


def test_every_notebook_is_listed():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == NAMES


def execute(name: str, timeout: int, save: bool = False) -> None:
    """Run the notebook top to bottom; save: write it back with its new outputs (the committed ones)."""
    import nbformat  # here, not at collection: it imports jsonschema's format checkers, about 4.5 s
    from nbclient import NotebookClient

    path = NOTEBOOKS / f"{name}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError, with the failing cell, on any error or failed assert
    if save:
        nbformat.write(notebook, path)


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_fast_mode(name, monkeypatch):
    monkeypatch.setenv("SPECDEC_FAST", "1")  # the kernel inherits the environment
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the other worker runs tests meanwhile
    monkeypatch.delenv("SPECDEC_RESULTS", raising=False)  # 03 makes its own small sweep
    execute(name, timeout=600)


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_full_mode(name, monkeypatch):
    monkeypatch.delenv("SPECDEC_FAST", raising=False)
    monkeypatch.delenv("SPECDEC_RESULTS", raising=False)
    execute(name, timeout=3600, save=os.environ.get("SPECDEC_SAVE_NOTEBOOKS") == "1")  # refresh committed outputs
