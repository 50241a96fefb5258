"""The runtime group (conf/runtime/): its values checked before anything loads, and as the library's options."""

from __future__ import annotations

from dataclasses import fields

from omegaconf import DictConfig

from specdec.auto.runtime import RuntimeOptions

from .settings import packed_rows

OPTIONS = {field.name for field in fields(RuntimeOptions)}


def runtime_options(runtime: DictConfig) -> RuntimeOptions:
    """The library's runtime options from a runtime node (eager's and a bench profile's leave keys out: defaults)."""
    options = {key: runtime[key] for key in runtime if key in OPTIONS} | {"packed_rows": packed_rows(runtime)}
    if "widths" in options:
        options["widths"] = tuple(options["widths"])
    return RuntimeOptions(**options)


def placement(cfg: DictConfig) -> dict:
    """How the library puts a run's models on their runtime (specdec.auto.runtime.put_on_runtime's keywords)."""
    return {"runtime": runtime_options(cfg.runtime), "device": str(cfg.device), "max_new_tokens": cfg.max_new_tokens}
