"""Contenders that raise: each failure is recorded with its error, the other contenders and bench.json go on.

A contender can fail while it is built (its model does not load), in its warm-up or in a timed run (Hugging Face's
universal assisted generation rewriting the draft's output layer in place, say). It then stops running; its
figures are left out, the ratios and goals that needed it are "not measured", and bench.json's "failed" says why.
A ConfigError is never caught: a contender that cannot be configured fails the bench before anything loads.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..records import markdown_table, write_json
from ..run.settings import ConfigError
from .goals import target_of

T = TypeVar("T")
NOT_MEASURED = "not measured"


class Failures:
    """The contenders that raised, by name: the stage (build, warm-up, run), the error and the traceback's end."""

    def __init__(self, log: Callable[[str], None] = lambda s: None) -> None:
        self.failed: dict[str, dict] = {}
        self.log = log

    def attempt(self, name: str, stage: str, fn: Callable[..., T], *args, **kwargs) -> T | None:
        """fn(*args, **kwargs), or None after recording the contender's failure (a failed contender is not run
        again: None at once)."""
        if name in self.failed:
            return None
        try:
            return fn(*args, **kwargs)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001  (any error of one contender: recorded, the bench goes on)
            error = " ".join(f"{type(e).__name__}: {e}".split())
            lines = "".join(traceback.format_exception(type(e), e, e.__traceback__)).splitlines()
            self.failed[name] = {"stage": stage, "error": error, "traceback": lines[-12:]}
            self.log(f"contender {name} failed in its {stage}: {error}")
            return None


def write_contender(out: Path, name: str, figures: dict) -> None:
    """<out>/contenders/<name>.json, written as soon as the contender has run every prompt of every repetition."""
    write_json(out / "contenders" / f"{name}.json", figures)


def mark_not_measured(goals: dict, failed: dict[str, dict], flags: list[str], greedy: bool, keys: tuple[str, ...]) -> None:
    """Goals whose ratio could not be measured because contenders failed: value None, met None, status "not
    measured" and the failed contenders (keys: the goals this bench measures, added when no ratio was left)."""
    if not failed:
        return
    for key in keys:
        goals.setdefault(key, {"value": None, "target": target_of(key, flags, greedy)[0], "met": None})
    for goal in goals.values():
        if goal["value"] is None:
            goal.update(status=NOT_MEASURED, failed_contenders=sorted(failed))


def failed_section(result: dict) -> list[str]:
    """bench.md's list of failed contenders: stage and error line."""
    failed = result.get("failed") or {}
    if not failed:
        return []
    rows = [[name, f["stage"], f["error"].replace("|", "\\|")[:300]] for name, f in failed.items()]
    head = (f"Failed contenders ({len(failed)}): their figures are missing and the goals that needed them are "
            f"{NOT_MEASURED}.")  # fmt: skip
    return ["", head, "", markdown_table(["contender", "stage", "error"], rows)]

