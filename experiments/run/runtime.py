"""The runtime group (conf/runtime/): its values checked before anything loads, and as the library's options."""

from __future__ import annotations

from dataclasses import fields

from omegaconf import DictConfig

from specdec.auto.runtime import RuntimeOptions
from specdec.runtime.compiled import check_settings

from .settings import ConfigError, check_int

OPTIONS = {field.name for field in fields(RuntimeOptions)}


def check_runtime(runtime: DictConfig) -> None:
    """runtime.widths: a non-empty list of integers >= 1; widths and capacity as the compiled runtime takes them."""
    widths = runtime.widths
    if isinstance(widths, (str, int)) or not widths:
        raise ConfigError(f"runtime.widths must be a non-empty list of pass widths >= 1, got {widths!r}")
    for width in widths:
        check_int(width, "runtime.widths", 1)
    try:
        check_settings(tuple(widths), runtime.capacity)
    except ValueError as error:
        raise ConfigError(f"runtime.{error}") from error
    packed_rows(runtime)


def packed_rows(runtime: DictConfig) -> tuple[int, int] | None:
    """runtime.packed_rows: null, or [first, last] with 1 <= first <= last."""
    rows = runtime.get("packed_rows")
    if rows is None:
        return None
    if isinstance(rows, (str, int)) or len(rows) != 2:
        raise ConfigError(f"runtime.packed_rows must be null or [first, last] pass rows, got {rows!r}")
    check_int(rows[0], "runtime.packed_rows", 1)
    check_int(rows[1], "runtime.packed_rows", rows[0])
    return rows[0], rows[1]


def runtime_options(runtime: DictConfig) -> RuntimeOptions:
    """The library's runtime options from a runtime node (eager's and a bench profile's leave keys out: defaults)."""
    options = {key: runtime[key] for key in runtime if key in OPTIONS} | {"packed_rows": packed_rows(runtime)}
    if "widths" in options:
        options["widths"] = tuple(options["widths"])
    return RuntimeOptions(**options)


def placement(cfg: DictConfig) -> dict:
    """How the library puts a run's models on their runtime (specdec.auto.runtime.put_on_runtime's keywords)."""
    return {"runtime": runtime_options(cfg.runtime), "device": str(cfg.device), "max_new_tokens": cfg.max_new_tokens}
