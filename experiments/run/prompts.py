"""Prompt sets through `datasets`: the committed JSON Lines files, or Hub datasets for online users."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from ..records import REPO_ROOT
from .schema import DatasetSource
from .settings import ConfigError

HUB_ROWS_MAX = 10_000  # rows streamed from a Hub dataset when filters decide which are kept


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str  # the user message (chat template not applied yet)


def json_rows(ds: DictConfig) -> list[dict]:
    """Every row of a local JSON Lines file (a path relative to the repository root, or absolute)."""
    import datasets  # heavy; imported when prompts are needed

    path = Path(ds.path) if Path(ds.path).is_absolute() else REPO_ROOT / ds.path
    if not path.exists():
        raise ConfigError(f"dataset.path: {path} does not exist")
    return list(datasets.load_dataset("json", data_files=str(path), split=ds.split))


def hub_rows(ds: DictConfig) -> list[dict]:
    """The first rows of a streamed Hub dataset: n_prompts, or HUB_ROWS_MAX when filters choose."""
    import datasets

    filtered = ds.categories is not None or ds.n_per_category is not None
    n_rows = HUB_ROWS_MAX if filtered or ds.n_prompts is None else ds.n_prompts
    try:
        rows = datasets.load_dataset(ds.path, ds.subset, split=ds.split, revision=ds.revision, streaming=True)
        return list(itertools.islice(rows, n_rows))  # streamed: only these rows are downloaded
    except Exception as e:  # offline, unknown id, gated: all end the same way
        raise RuntimeError(
            f"could not open the Hub dataset {ds.path!r} (dataset={ds.name}): {type(e).__name__}: {e}\n"
            "It needs network access to the Hugging Face Hub (and `hf auth login` for gated datasets). "
            "Offline, use the prompt sets in data/: dataset=bundled or dataset=article."
        ) from e


OPEN_ROWS: dict[DatasetSource, Callable[[DictConfig], list[dict]]] = {
    DatasetSource.json: json_rows,
    DatasetSource.hub: hub_rows,
}


def open_rows(ds: DictConfig) -> list[dict]:
    """Rows of the configured dataset, read as its source says."""
    return OPEN_ROWS[DatasetSource(ds.source)](ds)


def to_prompt(row: dict, index: int, ds: DictConfig) -> Prompt:
    """Map one row to a Prompt through the config's field names and template."""
    try:
        text = ds.template.format_map(row)
    except (KeyError, IndexError) as e:
        raise ConfigError(
            f"dataset.template {ds.template!r} refers to {e}, not a field of {sorted(row)}"
        ) from e
    pid = str(row[ds.id_field]) if ds.id_field else f"{ds.name}-{index}"
    category = str(row[ds.category_field]) if ds.category_field else ds.name
    return Prompt(pid, category, text)


def select(prompts: list[Prompt], ds: DictConfig) -> list[Prompt]:
    """Apply the category filter, the per-category limit and the overall limit, in that order."""
    if ds.categories is not None:
        known = sorted({p.category for p in prompts})
        unknown = sorted(set(ds.categories) - set(known))
        if unknown:
            raise ConfigError(f"dataset.categories: {unknown} not in dataset {ds.name}; choices: {known}")
        prompts = [p for p in prompts if p.category in set(ds.categories)]
    if ds.n_per_category is not None:
        seen: dict[str, int] = {}
        kept = []
        for p in prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= ds.n_per_category:
                kept.append(p)
        prompts = kept
    if ds.n_prompts is not None:
        prompts = prompts[: ds.n_prompts]
    return prompts


def load_prompts(ds: DictConfig) -> list[Prompt]:
    """The prompts a run iterates over, in file order."""
    prompts = select([to_prompt(row, i, ds) for i, row in enumerate(open_rows(ds))], ds)
    if not prompts:
        raise ConfigError(f"dataset {ds.name} gave no prompts after the filters; check dataset.categories")
    return prompts
