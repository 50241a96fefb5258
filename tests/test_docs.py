"""Every command the documentation shows still works: README.md, docs/*.md and notebooks/README.md.

Commands are taken from fenced code blocks and from inline code. What is checked, without running anything:
- `python -m experiments.run ...` (and `make run ARGS="..."`): the overrides compose into the config, as
  `--cfg job` composes them (a sweep `-m k=1,2`: its first job), and validate (hub pairs on the CPU here);
- `python -m experiments.bench ...`: the bench config composes, and so does every contender on top of it;
- `python -m experiments.report ...`: its arguments parse;
- `make <target>`: the target exists in the Makefile.
A command that no longer works fails with its file and line.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.bench.app import selected
from experiments.bench.contenders import check_bench as check_bench_keys
from experiments.report import parser as report_parser
from experiments.run.settings import validate

pytestmark = pytest.mark.xdist_group("docs")  # one worker: each contender and command is composed once (functools.cache)
ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "notebooks" / "README.md"]
NO_HEAD = "train one with `python -m experiments.train_draft"  # the refusal of a head config without a trained head
FENCE = re.compile(r"^```")
INLINE = re.compile(r"`([^`]+)`")
COMMAND = re.compile(r"(?:\.venv/bin/)?python -m experiments\.(run|bench|report)(?![.\w])[^`#]*|make [a-z][a-z-]*(?: [A-Z]+=(?:\"[^\"]*\"|\S+))*")


def commands(path: Path) -> list[tuple[int, str]]:
    """(line number, command) of every documented command in the file: in fenced or indented code blocks
    (a trailing backslash continues a line) and in inline code (which may wrap to the next line)."""
    found, fenced, paragraph, code = [], False, [], []
    lines = path.read_text().splitlines()

    def inline() -> None:
        text = " ".join(line for _, line in paragraph)
        starts = [(len(" ".join(line for _, line in paragraph[:i])), number) for i, (number, _) in enumerate(paragraph)]
        for span in INLINE.finditer(text):
            number = max(n for offset, n in starts if offset <= span.start() + 1)
            found.extend((number, m.group(0).strip()) for m in COMMAND.finditer(span.group(1)))
        paragraph.clear()

    def flush() -> None:
        if code:
            start, joined = code[0][0], " ".join(text.rstrip("\\").strip() for _, text in code)
            found.extend((start, m.group(0).strip()) for m in COMMAND.finditer(joined))
            code.clear()

    for number, line in enumerate(lines, start=1):
        block = fenced or (line.startswith("    ") and not line.lstrip().startswith(("-", "*", "|")))
        if FENCE.match(line.strip()):
            flush()
            fenced = not fenced
            inline()
            continue
        if block:
            inline()
            code.append((number, line.split(" #")[0].strip()))
            if not code[-1][1].endswith("\\"):
                flush()
            continue
        flush()
        if not line.strip():
            inline()
        else:
            paragraph.append((number, line))
    inline()
    return found


DOCUMENTED = [(path, number, command) for path in DOCS for number, command in commands(path)]


def first_job(overrides: list[str]) -> list[str]:
    """A sweep's first job: the first of each comma-separated value list (not inside brackets or braces)."""
    job = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and "," in value and value[0] not in "[{'\"":
            value = value.split(",")[0]
        job.append(f"{key}{sep}{value}")
    return job


def run_overrides(args: list[str]) -> list[str]:
    """experiments.run's command-line overrides: flags (-m, --cfg job, --multirun) left out."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--cfg", "-c"):
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return first_job(out)


def check_run(overrides: list[str]) -> None:
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=any(o.startswith("hydra.") for o in overrides))
    if str(cfg.device).startswith("cuda"):  # a hub pair: validate everything but the GPU itself
        cfg.device = "cpu"
    if "hydra" in cfg:
        OmegaConf.set_struct(cfg, False)
        del cfg["hydra"]
    validate_unless_no_head(cfg)


def check_bench(overrides: list[str]) -> None:
    base = [o for o in overrides if not o.startswith("hydra.")]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("bench", overrides=base)
    runs = tuple(o for o in base if not o.lstrip("+~").startswith("bench."))
    check_bench_keys(cfg.bench)
    names = selected(cfg.bench)  # the contenders the bench builds (bench.only, a study's): those must compose
    for name, delta in cfg.bench.contenders.items():
        if names is None or name in names:
            check_contender(runs, tuple(delta), name)


@functools.cache
def check_contender(runs: tuple[str, ...], delta: tuple[str, ...], name: str) -> None:
    """One contender on top of the command's run overrides (the same pair is checked once for all commands)."""
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        job = compose("bench", overrides=[*runs, *delta])
    if str(job.device).startswith("cuda"):
        job.device = "cpu"
    validate_unless_no_head(job)
    assert job.method != "all", name


def validate_unless_no_head(cfg) -> None:
    """validate, where the only complaint allowed is a missing trained head (experiments.train_draft), which CI has not
    trained: the rest of the command is still checked."""
    try:
        validate(cfg)
    except Exception as e:  # a ConfigError wraps the loader's error
        if NO_HEAD not in str(e):
            raise


@functools.cache
def problem(command: str) -> str | None:
    """Why the command no longer works, or None (each distinct command is checked once)."""
    try:
        check(command)
    except (Exception, SystemExit) as e:  # noqa: BLE001  (any failure, and argparse exits on bad arguments)
        return f"{type(e).__name__}: {e}"
    return None


def check(command: str) -> None:
    args = shlex.split(command)
    if args[0] == "make":
        makefile = (ROOT / "Makefile").read_text()
        assert re.search(rf"^{re.escape(args[1])}:", makefile, re.MULTILINE), f"no make target {args[1]!r}"
        extra = next((a.removeprefix("ARGS=") for a in args[2:] if a.startswith("ARGS=")), None)
        if args[1] == "run" and extra:
            check_run(run_overrides(shlex.split(extra)))
        return
    module = args[2].removeprefix("experiments.")
    rest = args[3:]
    if module == "run":
        check_run(run_overrides(rest))
    elif module == "bench":
        check_bench(run_overrides(rest))
    else:
        report_parser().parse_args(rest)


def test_the_docs_show_commands():
    assert len(DOCUMENTED) >= 30
    assert {c.split()[2] for _, _, c in DOCUMENTED if c.startswith("python")} >= {
        "experiments.run", "experiments.bench", "experiments.report",
    }  # fmt: skip


def documented_cases() -> list:
    """README.md's and notebooks/README.md's commands run in make test; docs/*.md's (mostly the same runs with other
    overrides, checked by the same composition and validation) in make test-all."""
    return [pytest.param(path, number, command, id=f"{path.name}:{number}",
                         marks=pytest.mark.exhaustive if path.parent == ROOT / "docs" else ())
            for path, number, command in DOCUMENTED]  # fmt: skip


@pytest.mark.parametrize("path,number,command", documented_cases())
def test_documented_command_works(path: Path, number: int, command: str):
    why = problem(command)
    assert why is None, f"{path.relative_to(ROOT)}:{number}: `{command}` no longer works: {why}"


# The docs speak to their users about what is true now: no story of how they were written (the reader's grep
# `grep -rniE "\bsessions?\b|issue [0-9]+" README.md docs/`), no machines named by letter outside the history
# (CHANGELOG.md, docs/results/archive/).
DIARY = re.compile(r"\bsessions?\b|issue [0-9]+", re.IGNORECASE)
MACHINE_LETTER = re.compile(r"\b[Mm]achines? [A-C]\b")
HISTORY = ROOT / "docs" / "results" / "archive"


def lines_matching(pattern: re.Pattern, paths: list[Path]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in paths
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1) if pattern.search(line)]  # fmt: skip


def test_the_docs_read_as_a_guide_not_a_diary():
    every = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").rglob("*")) if p.is_file())]
    assert len(every) > 20
    assert lines_matching(DIARY, every) == []
    current = [p for p in every if p.suffix == ".md" and HISTORY not in p.parents]
    assert lines_matching(MACHINE_LETTER, current) == []
    assert lines_matching(MACHINE_LETTER, [ROOT / "CHANGELOG.md"])  # the history keeps the names it used


def test_the_readme_opens_with_the_two_commands_and_one_results_table():
    """Its first screen: the two commands, then one table with a row per kind of machine, whose every row names its
    command, its commit and its machine (a CPU's model and flags, or a GPU's model)."""
    text = (ROOT / "README.md").read_text()
    first = text[: text.index("\n## ")]
    assert "make run" in first and "make test" in first
    table = [line for line in first.splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert {"command", "commit", "machine"} <= set(header) and len(table) >= 3
    for row in table[2:]:
        cells = dict(zip(header, (c.strip() for c in row.strip("|").split("|"))))
        assert re.fullmatch(r"`(make \w+|python -m experiments\.\w+[^`]*)`", cells["command"]), row
        assert re.fullmatch(r"[0-9a-f]{7,40}", cells["commit"]), row
        assert re.search(r'"[^"]+", \d+ cores; (avx2|asimd)|"NVIDIA [^"]+", \d+ GPUs?', cells["machine"]), row


def test_the_readme_fits_a_screen_and_performance_md_stays_short():
    """A reader finds what this is, the two commands and the headline in the README's first screen; the docs hold the
    current findings, not their history (that is CHANGELOG.md)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert len(readme[: readme.index("\n## ")].splitlines()) <= 40
    assert len((ROOT / "docs" / "performance.md").read_text().splitlines()) <= 400


# A commit hash: 7-40 hex digits with at least one digit and one letter, as a word of its own.
HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/-])")
RESULTS_PATH = re.compile(r"\S*results/\S*")  # a link or path to a results file (its name may hold a hash)


def test_the_docs_name_no_commit_outside_the_results_tables():
    """Commits belong to the results tables (docs/results.md, the README's headline table) and to CHANGELOG.md."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if line.startswith("|"):
                continue
            found += [f"{path.relative_to(ROOT)}:{n}: {m.group(0)}" for m in HASH.finditer(RESULTS_PATH.sub("", line))]
    assert found == []


HEADLINE = ROOT / "docs" / "results" / "headline"  # make run's own records of the rows the README quotes


def headline_run(name: str) -> tuple[dict, dict]:
    """The metrics of summary.json and the environment.json of one run folder under docs/results/headline/."""
    folder = HEADLINE / name
    return (json.loads((folder / "summary.json").read_text())["metrics"],
            json.loads((folder / "environment.json").read_text()))  # fmt: skip


def test_the_readme_headline_is_its_result_files():
    """The README's headline rows quote `make run`'s own records (docs/results/headline/): the default run's speedup
    and tokens/s, the article pair's quality gap and agreement, each with the commit and the machine it ran on."""
    text = (ROOT / "README.md").read_text()
    first = text[: text.index("\n## ")]
    table = [line for line in first.splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in row.strip("|").split("|")))) for row in table[2:]]
    ours = [row for row in rows if row["command"] == "`make run`"]
    assert len(ours) == 2, ours  # the default run, then the article pair
    for row, name in zip(ours, ["main", "article_pair"]):
        metrics, env = headline_run(name)
        assert row["commit"] == env["git_commit"][:7], (name, row["commit"])
        flags = ", ".join(flag for flag, on in env["cpu"]["flags"].items() if on)
        assert row["machine"] == f'"{env["cpu"]["model"]}", {env["cpu"]["logical_cores"]} cores; {flags}', name
        assert metrics["agreement/speculative"] == 1.0, name  # greedy: speculative's output is the target's
    metrics, _ = headline_run("main")
    assert ours[0]["measured"] == (f"**{metrics['speedup']:.2f}x** ({metrics['tokens_per_second/speculative']:.2f} / "
                                   f"{metrics['tokens_per_second/autoregressive']:.2f} tok/s)")  # fmt: skip
    metrics, _ = headline_run("article_pair")
    gap = metrics["nll_per_token/naive"] - metrics["nll_per_token/autoregressive"]
    assert ours[1]["measured"] == (f"**{gap:+.2f} nats/token**, {metrics['agreement/naive']:.0%} agreement "
                                   f"(speculative: {metrics['agreement/speculative']:.0%})")  # fmt: skip
