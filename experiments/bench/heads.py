"""The trained head's keys of bench.json (bench=heads): the best head over the best copy, the head's draft cost c,
its tokens per target pass, and the best head over target-only (`<pair>_head_vs_target_only`).

A contender drafts with a head when its drafter is a HeadDrafter (`drafts: head`); the copies are our contenders
whose every draft is a model (`draft_kinds: ["model"]`): the calibrated default's online choice over a copy, prompt
lookup and the head is not a copy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def draft_kind(drafter) -> str:
    """What drafts: "head", "ngram" (a lookup), "hybrid" (a tree of both), or "model" (a copy or another model; a
    DraftSwitch, the calibrated default's online choice, counts as one whatever its candidates: see draft_kinds)."""
    from specdec.draft.head_drafter import HeadDrafter
    from specdec.draft.ngram import NGramDrafter
    from specdec.draft.trees import HybridTreeDrafter, NGramTreeDrafter

    if isinstance(drafter, HeadDrafter):
        return "head"
    return "hybrid" if isinstance(drafter, HybridTreeDrafter) else "ngram" if isinstance(
        drafter, (NGramDrafter, NGramTreeDrafter)) else "model"


def draft_kinds(drafter) -> list[str]:
    """The kinds a drafter drafts with: each candidate's of a DraftSwitch, else its own (draft_kind)."""
    from specdec.draft.switch import DraftSwitch

    if isinstance(drafter, DraftSwitch):
        return sorted({draft_kind(candidate) for candidate in drafter.candidates.values()})
    return [draft_kind(drafter)]


UNFIXED = ("tree=", "model.draft.confidence=")  # a tree is not a chain; a confidence stop drafts fewer than k tokens


def head_c(contender: dict, target_step_ms: float) -> float:
    """The head's draft cost per token in target steps: its drafting seconds (catch-up on the target's new
    features included) per drafted token, over one target step."""
    stats = contender["stats"]
    if not stats.get("draft_forwards") or not target_step_ms:
        return math.nan
    return stats["seconds"]["draft"] / stats["draft_forwards"] / (target_step_ms / 1000)


def pair_of(contender: dict) -> str:
    """The target's pair of a head contender, by its overrides (model=gemma3_head -> gemma3); else "target"."""
    pairs = [o.split("=", 1)[1] for o in contender["overrides"] if o.startswith("model=")]
    return pairs[-1].removesuffix("_head") if pairs else "target"


def head_ratios(f, result: dict) -> dict[str, float]:
    """head_vs_best_copy, and head_c and head_tokens_per_pass of the best head chain with a fixed k (k tokens every
    round: no tree, no confidence stop, whose drafting seconds also count rounds that draft nothing), when the
    bench ran a head; `f` is the bench's ratios.Figures."""
    heads = f.group("ours", "head")
    copies = [n for n in f.group("ours", "model") if f.c[n].get("draft_kinds", ["model"]) == ["model"]]
    if not heads:
        return {}
    best = f.best(heads)
    fixed = [n for n in heads if isinstance(f.c[n]["k"], int) and not any(o.startswith(UNFIXED) for o in f.c[n]["overrides"])]
    chain = f.best(fixed) if fixed else best
    stats = f.c[chain]["stats"]
    step_ms = (result.get("costs") or {}).get("target_step_ms")
    model = pair_of(f.c[best])  # gemma3_head_vs_target_only is a goal
    result["head"] = training_record(f.c[best].get("head"))
    return {
        "head_vs_best_copy": f.category_geomean(best) / f.category_geomean(f.best(copies)) if copies else math.nan,
        "head_c": head_c(f.c[chain], step_ms),
        "head_tokens_per_pass": stats["emitted"] / stats["target_forwards"] if stats["target_forwards"] else math.nan,
        f"{model}_head_vs_target_only": f.category_geomean(best) / f.category_geomean("ar") if "ar" in f.c else math.nan,
    }


def training_record(folder: str | None) -> dict | None:
    """How the head was trained (its meta.json): the folder, data, tokens, steps, minutes, final acceptance."""
    if folder is None or not (Path(folder) / "meta.json").is_file():
        return None
    meta = json.loads((Path(folder) / "meta.json").read_text())
    keep = ("teacher", "steps", "training_seconds", "training_chunks", "validation_chunks", "final")
    return {"folder": folder, "head": meta["settings"]["head"], "train": meta["settings"]["train"],
            "data": meta["settings"]["data"], **{k: meta[k] for k in keep}}


def head_costs(target_name: str, folders: list[str], repeats: int = 10) -> dict[str, dict]:
    """c of each head (one draft token's ms over one target step's, timed interleaved with the target by the
    calibration's own timer) next to its vocabulary size and validation acceptance: the cost-against-alpha trade-off
    of the draft vocabulary."""
    from specdec.auto.calibration import measure_timings
    from specdec.draft.head_drafter import load_head_drafter
    from specdec.runtime.models import encode_prompt, load_model, load_tokenizer

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


if __name__ == "__main__":  # python -m experiments.bench.heads <out.json> <target> <head folder>...
    import sys

    import torch

    from ..records import machine, write_json

    torch.set_num_threads(1)
    write_json(Path(sys.argv[1]), {"costs": head_costs(sys.argv[2], sys.argv[3:]), "machine": machine("cpu")})
