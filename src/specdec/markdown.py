"""GitHub markdown tables: how the library's records (a calibration, a thread choice, a compiled runtime) and
the apps' tables print, and documents made of sections, each a sentence and a table."""

from __future__ import annotations

import math
from collections.abc import Sequence


def cell(value: object, fmt: str = "{:.3f}") -> str:
    """One markdown cell: floats through fmt, NaN and None as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value) if isinstance(value, float) else str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], fmt: str = "{:.3f}") -> str:
    """A GitHub markdown table; cells that are already strings are kept as they are."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        "| " + " | ".join(v if isinstance(v, str) else cell(v, fmt) for v in row) + " |" for row in rows
    ]
    return "\n".join(lines)


def section(
    title: str | None, header: Sequence[str], rows: Sequence[Sequence[object]], fmt: str = "{:.3f}"
) -> list[str]:
    """A document's lines for one table: a blank line, the sentence above it (if any) and a blank line, the
    table (markdown_table)."""
    return ["", *([title, ""] if title else []), markdown_table(header, rows, fmt=fmt)]


def document(lines: list[str]) -> str:
    """Sections' lines as one markdown file, without the first section's leading blank line."""
    return "\n".join(lines[1:] if lines[:1] == [""] else lines) + "\n"
