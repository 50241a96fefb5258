"""The config's head folder and teacher file (specdec.draft.head_store: where trained heads live), and the
`${trained_head:<target>}` config resolver."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specdec.draft import head_store


def settings(cfg: DictConfig, *keys: str) -> list[dict]:
    return [OmegaConf.to_container(cfg[key], resolve=True) for key in keys]


def head_folder(cfg: DictConfig) -> Path:
    """The folder of the head these settings train."""
    return head_store.head_folder(cfg.model.target.name, cfg.model.dtype, *settings(cfg, "data", "head", "train"))


def teacher_file(cfg: DictConfig) -> Path:
    return head_store.teacher_file(cfg.model.target.name, cfg.model.dtype, *settings(cfg, "data"))


def trained_head(target_name: str) -> str | None:
    """`${trained_head:<target>}` in a config: the folder of the latest head trained for the target, or None."""
    return head_store.resolve_checkpoint("auto", target_name)


if not OmegaConf.has_resolver("trained_head"):
    OmegaConf.register_new_resolver("trained_head", trained_head)
