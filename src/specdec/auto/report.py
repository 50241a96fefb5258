"""What the setup measured and chose, and why: one line each, in order, logged as it is said."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class Report:
    """The lines of one setup (specdec.auto.setup), also logged at INFO as they are said, and the machine they were
    measured on (specdec.runtime.machine.machine)."""

    lines: list[str] = field(default_factory=list)
    machine: dict[str, object] = field(default_factory=dict)

    def say(self, message: str, *args: object) -> None:
        line = message % args if args else message
        log.info("%s", line)
        self.lines.append(line)

    def __str__(self) -> str:
        return "\n".join(self.lines)
