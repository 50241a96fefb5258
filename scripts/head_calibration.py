"""How well a trained head's confidence predicts its acceptance, on its own validation split (the answer positions):

    python scripts/head_calibration.py <out.json> <head folder>...

For each head, per confidence bin (max_x q(x), bins of 0.1) the share of positions and their greedy match rate, and
for each threshold t the share of positions at confidence >= t and their greedy match rate: at k = 1, what a chain
stopped below t (`draft.confidence=t`) drafts, and how often it is accepted greedily. Writes the JSON and prints
one markdown table per head.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from experiments.records import write_json
from specdec.draft import head_store
from specdec.draft.head import load_head
from specdec.markdown import markdown_table
from specdec.runtime.models import load_model
from specdec.train.head import CONFIDENCE_EDGES, Teacher, confidence_counts


def validation_split(folder: Path, meta: dict) -> Teacher:
    """The head's held-out chunks: the last share of its teacher data, as training split it."""
    saved = torch.load(head_store.teacher_of(folder), weights_only=True)
    return Teacher(**saved["teacher"]).held_out(meta["settings"]["data"]["validation"])[1]


def calibration(folder: Path, batch: int = 32) -> dict:
    """Counts per confidence bin over the validation split, and the table by threshold."""
    meta = json.loads((folder / head_store.META).read_text())
    target = load_model(meta["target"], dtype=meta["settings"]["dtype"])
    head, validation = load_head(folder, target), validation_split(folder, meta)
    weight = target.get_output_embeddings().weight.detach()
    count = torch.zeros(len(CONFIDENCE_EDGES) - 1)
    matches = torch.zeros(len(CONFIDENCE_EDGES) - 1)
    for i in range(0, len(validation), batch):
        c, m = confidence_counts(head, validation.batch(slice(i, i + batch)), weight, head.softcap)
        count, matches = count + c, matches + m
    total = float(count.sum())
    bins = [{"low": CONFIDENCE_EDGES[j], "high": CONFIDENCE_EDGES[j + 1], "share": float(count[j]) / total,
             "greedy_match": float(matches[j] / count[j]) if count[j] else None} for j in range(len(count))]
    thresholds = [{"confidence": CONFIDENCE_EDGES[j], "share": float(count[j:].sum()) / total,
                   "greedy_match": float(matches[j:].sum() / count[j:].sum()) if count[j:].sum() else None}
                  for j in range(len(count))]
    return {"positions": int(total), "bins": bins, "thresholds": thresholds}


def main(out: Path, folders: list[Path]) -> None:
    heads = {}
    for folder in folders:
        heads[folder.name] = calibration(folder)
        rows = [[t["confidence"], t["share"], t["greedy_match"]] for t in heads[folder.name]["thresholds"]]
        print(f"\n{folder.name} ({heads[folder.name]['positions']} positions)\n")
        print(markdown_table(["confidence >=", "share of positions", "greedy match"], rows))
    write_json(out, heads)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(f) for f in sys.argv[2:]])
