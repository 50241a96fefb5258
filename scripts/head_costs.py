"""What each trained draft head costs on this machine, next to its vocabulary size and validation acceptance: the
cost-against-alpha trade-off of the draft vocabulary.

    python scripts/head_costs.py <out.json> <target> <head folder>...

c of each head is one draft token's ms over one target step's, timed interleaved with the target by the
calibration's own timer (specdec.auto.calibration.measure_timings), on one torch thread.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from experiments.records import machine, write_json
from specdec.auto.calibration import measure_timings
from specdec.draft.head_drafter import load_head_drafter
from specdec.draft.head_store import training_record
from specdec.runtime.models import encode_prompt, load_model, load_tokenizer


def head_costs(target_name: str, folders: list[str], repeats: int = 10) -> dict[str, dict]:
    """c of each head (module docstring) next to its vocabulary size, training steps and validation acceptance."""
    target = load_model(target_name)
    prefix = encode_prompt(load_tokenizer(target_name), "Explain in two sentences why the sky is blue.")
    drafters = {folder: load_head_drafter(target, folder) for folder in folders}
    timings = measure_timings(target, drafters, prefix, repeats=repeats, widths=(1,))
    costs = {}
    for folder in folders:
        record = training_record(folder)
        costs[Path(folder).name] = {"vocab": record["head"]["vocab"], "steps": record["steps"],
                                    "alpha": record["final"]["alpha"], "greedy_match": record["final"]["greedy_match"],
                                    "draft_ms": timings.draft_ms[folder], "step_ms": timings.step_ms,
                                    "c": timings.draft_ms[folder] / timings.step_ms}
    return costs


if __name__ == "__main__":
    torch.set_num_threads(1)
    write_json(Path(sys.argv[1]), {"costs": head_costs(sys.argv[2], sys.argv[3:]), "machine": machine("cpu")})
