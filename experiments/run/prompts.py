"""The dataset group (conf/dataset/) as the library's prompt set (specdec.prompts): JSON Lines files in data/, or Hub
datasets for online users."""

from __future__ import annotations

from dataclasses import fields

from omegaconf import DictConfig, OmegaConf

from specdec.prompts import Prompt, PromptSet
from specdec.prompts import load_prompts as load_prompt_set

from ..records import REPO_ROOT
from .settings import library_check

PROMPT_SET = {field.name for field in fields(PromptSet)}


def prompt_set(ds: DictConfig) -> PromptSet:
    """The library's PromptSet from a dataset node (its `chat` is the run's, not the set's)."""
    values = {key: value for key, value in OmegaConf.to_container(ds, resolve=True).items() if key in PROMPT_SET}
    categories = values.get("categories")
    return PromptSet(**{**values, "source": str(values["source"]),
                        "categories": None if categories is None else tuple(categories)})


def load_prompts(ds: DictConfig) -> list[Prompt]:
    """The prompts a run iterates over, in file order; a bad field ends in a ConfigError naming dataset.<key>."""
    with library_check("dataset."):
        return load_prompt_set(prompt_set(ds), REPO_ROOT)
