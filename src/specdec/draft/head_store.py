"""Where trained draft heads live: one folder per (target, data, head and training settings) under the project's
cache (specdec.runtime.offline.cache_dir()/heads), so a run with the same settings finds its head, its teacher data
and its last checkpoint again.

A folder holds checkpoint.pt (the head, the optimizer, the step and the learning curve, rewritten every
checkpoint_every steps: an interrupted run resumes from it), then head.pt and meta.json once training finished.
The teacher data of one (target, data) pair is shared by every head trained on it (teacher-<key>.pt).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ..runtime.offline import cache_dir

META = "meta.json"
CHECKPOINT = "checkpoint.pt"


def heads_dir() -> Path:
    return cache_dir() / "heads"


def digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")


TEACHER_FORMAT = 2  # 2: the teacher data marks the positions that draft an assistant's token (Teacher.answer)


def data_key(target: str, dtype: str, data: dict) -> str:
    """The target, its dtype, the data settings and the teacher data's format: what the teacher data depends on."""
    return digest(target, dtype, data, TEACHER_FORMAT)


def head_folder(target: str, dtype: str, data: dict, head: dict, train: dict) -> Path:
    """The folder of the head these settings (plain dicts of the data, head and training settings) train."""
    return heads_dir() / slug(target) / f"{data_key(target, dtype, data)}-{digest([head, train])}"


def teacher_file(target: str, dtype: str, data: dict) -> Path:
    return heads_dir() / slug(target) / f"teacher-{data_key(target, dtype, data)}.pt"


def trained_heads(target_name: str) -> list[Path]:
    """Folders of the finished heads for this target, the most recently finished first."""
    folders = [m.parent for m in (heads_dir() / slug(target_name)).glob(f"*/{META}")]
    return sorted(folders, key=lambda f: (f / META).stat().st_mtime, reverse=True)


def resolve_checkpoint(checkpoint: str | None, target_name: str) -> str | None:
    """A head folder as configured, or for `auto` the latest finished head for the target (None: none trained)."""
    if checkpoint not in (None, "auto"):
        return head_path(checkpoint)
    heads = trained_heads(target_name)
    return str(heads[0]) if heads else None


def head_path(checkpoint: str | None) -> str | None:
    """A head folder as configured: a path, or the bare name of a folder under the cache's heads/<target>/ (as
    training prints it and docs/results name it). A name found nowhere is returned unchanged, for
    the loader to report."""
    if checkpoint is None or Path(checkpoint).exists():
        return checkpoint
    found = sorted(m.parent for m in heads_dir().glob(f"*/{checkpoint}/{META}"))
    if len(found) > 1:
        raise ValueError(f"head folder {checkpoint!r} exists for several targets: {[str(f) for f in found]}; "
                         "give its path")
    return str(found[0]) if found else checkpoint


def teacher_of(folder: Path) -> Path:
    """The teacher data a head folder was trained on (its name starts with the data key)."""
    return folder.parent / f"teacher-{folder.name.split('-')[0]}.pt"


def training_record(folder: str | None) -> dict | None:
    """How the head in `folder` was trained (its meta.json): the folder, data, tokens, steps, minutes, final
    acceptance; None without a finished head there."""
    if folder is None or not (Path(folder) / META).is_file():
        return None
    meta = json.loads((Path(folder) / META).read_text())
    keep = ("teacher", "steps", "training_seconds", "training_chunks", "validation_chunks", "final")
    return {"folder": folder, "head": meta["settings"]["head"], "train": meta["settings"]["train"],
            "data": meta["settings"]["data"], **{k: meta[k] for k in keep}}
