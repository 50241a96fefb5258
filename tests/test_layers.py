"""The architecture: no import cycles, the library below the apps and free of Hydra and W&B,
its layers imported downwards only (runtime <- draft, verify <- choose <- decoding <- auto), unique class names,
library tests free of the apps, and thin apps."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"runtime": 0, "draft": 1, "verify": 1, "choose": 2, "decoding": 3, "auto": 4}  # specdec.<name>: its rank
APP_TESTS = {  # tests of the apps (experiments/, scripts/, docs): these may import experiments
    "test_bench.py", "test_bench_parts.py", "test_config_errors.py", "test_configs.py", "test_docs.py",
    "test_app_setup.py", "test_experiments.py", "test_gemm_probe.py", "test_sweeps.py", "test_train_draft.py", "test_layers.py",
}  # fmt: skip
APPS_MAX_LINES = 3500  # the apps map configs to library calls and write records: at most 3,500 lines


def modules() -> dict[str, Path]:
    """Every module of specdec, experiments and scripts by dotted name."""
    found = {}
    for base, package in ((ROOT / "src", "specdec"), (ROOT, "experiments"), (ROOT, "scripts")):
        for path in (base / package).rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path) -> set[str]:
    """Dotted names a module imports, anywhere in it (function-level imports included), relative ones resolved."""
    names = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return names


def graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a package's __init__ left out: it only re-exports)."""
    found = modules()
    edges = {}
    for name, path in found.items():
        targets = set()
        for target in imported(name, path):
            while target and target not in found:
                target = target.rpartition(".")[0]
            if target and target != name and found[target].name != "__init__.py":
                targets.add(target)
        edges[name] = targets
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def rank(module: str) -> int | None:
    parts = module.split(".")
    return LAYER.get(parts[1]) if parts[0] == "specdec" and len(parts) > 1 else None


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_the_library_imports_no_app_and_no_framework() -> None:
    offending = {(name, target) for name, path in modules().items() if name.startswith("specdec")
                 for target in imported(name, path)
                 if target.split(".")[0] in ("experiments", "scripts", "hydra", "omegaconf", "wandb")}  # fmt: skip
    assert offending == set()


def test_the_library_layers_import_downwards() -> None:
    upwards = {(m, t) for m, targets in graph().items() for t in targets
               if rank(m) is not None and rank(t) is not None and rank(t) > rank(m)}  # fmt: skip
    assert upwards == set()


def test_class_names_are_unique() -> None:
    names = Counter(node.name for name, path in modules().items() if name.startswith(("specdec", "experiments"))
                    for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef))  # fmt: skip
    assert [name for name, n in names.items() if n > 1] == []


LIBRARY_TESTS = sorted(p for p in (ROOT / "tests").glob("*.py") if p.name not in APP_TESTS)


@pytest.mark.parametrize("path", LIBRARY_TESTS, ids=lambda p: p.name)
def test_library_tests_do_not_import_the_apps(path: Path) -> None:
    assert not {n for n in imported("tests." + path.stem, path) if n.split(".")[0] in ("experiments", "scripts")}


def test_the_apps_are_thin() -> None:
    lines = sum(len(path.read_text().splitlines()) for path in (ROOT / "experiments").rglob("*.py"))
    assert lines <= APPS_MAX_LINES, f"experiments/ holds {lines} lines (at most {APPS_MAX_LINES})"
