"""The record and learning curve of each trained head folder, in one JSON file (what
docs/results/heads-training-*.json and notebook 04 read):

    python scripts/export_heads.py <out.json> <head folder>...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specdec.draft import head_store


def export(folders: list[Path], path: Path) -> None:
    """The record and learning curve of each head folder, keyed by its folder name, in one JSON file (what
    docs/results/heads-training-*.json and notebook 04 read)."""
    heads = {}
    for folder in folders:
        meta = json.loads((folder / head_store.META).read_text())
        heads[folder.name] = {
            "head": meta["settings"]["head"], "train": meta["settings"]["train"], "data": meta["settings"]["data"],
            "teacher": meta["teacher"], "steps": meta["steps"], "training_seconds": meta["training_seconds"],
            "training_chunks": meta["training_chunks"], "validation_chunks": meta["validation_chunks"],
            "final": meta["final"], "machine": meta["machine"], "target": meta["target"],
            "curve": json.loads((folder / "curve.json").read_text()),
        }
    path.write_text(json.dumps(heads, indent=1) + "\n")


if __name__ == "__main__":
    export([Path(f) for f in sys.argv[2:]], Path(sys.argv[1]))
