"""The benchmark's ratios from its contenders' figures (specdec.comparison compares them with target-only,
Thm 3.8, a tree of the same width and the cost model's prediction): which contenders each ratio compares, ours
vs Hugging Face's and vs target-only, the goal ratios, the trained head's, and the greedy output check."""

from __future__ import annotations

import math

from specdec.comparison import (
    ContenderFigures,
    chain_vs_tree,
    cost_model_check,
    geomean,
    measured_c,
    theory_comparison,
    vs_baseline,
)
from specdec.draft.head_store import training_record
from specdec.quality import check_identical
from specdec.runtime.study import ClockedRun
from specdec.sampling import Sampling

MODEL_CHAIN = "default_k4"  # our chain with the calibrated draft at fixed k (the default run chooses k online)
TREE_SAMPLED, TREE_TRAVERSAL = "tree_model_iid", "tree_model_traversal"  # one tree drafter, two tree rules
CROSS_OURS = ("default", "string_k3", "tli_auto", "tli_k3")  # bench=cross: ours with another tokenizer
CROSS_HF = ("hf_uag_default", "hf_uag_k3")  # Hugging Face's universal assisted generation, same draft
HEADLINE = {  # ratio -> (ours, Hugging Face's), pooled tokens/s over tokens/s, at the same k
    "speedup_vs_hf_assisted": (MODEL_CHAIN, "hf_assisted"),
    "speedup_vs_hf_prompt_lookup": ("spec_ngram", "hf_lookup"),
    "ar_vs_hf_plain": ("ar", "hf_plain"),
}
SHORT_OUTPUTS = 32  # max_new_tokens at or below which the default over target-only is short_outputs_vs_target_only
EQUAL_WIDTH = {"ngram": ("spec_ngram", "tree_ngram"), "model": (MODEL_CHAIN, "tree_model")}  # (chain, tree)


def ratios(result: dict) -> tuple[dict[str, float], str | None]:
    """The ratios (higher is better), the Thm 3.8 comparison, the goal ratios over categories, and
    the name of our best configuration (highest geometric mean over categories vs target-only).

    Also fills result["vs_target_only"] (every contender per category vs ar, geometric mean, worst),
    result["best"] (which contender each goal ratio used) and result["chain_vs_tree"], result["cost_model"].
    """
    f = ContenderFigures(result["contenders"])
    if "ar" in f.c:
        result["vs_target_only"] = vs_baseline(f, "ar")
    out = {ratio: f.tps(ours) / f.tps(hf) for ratio, (ours, hf) in HEADLINE.items()}
    out.update(theory_ratios(f, result))
    out["spec_ngram_vs_ar"] = f.tps("spec_ngram") / f.tps("ar")
    out.update(rule_ratios(f))
    out.update(other_ratios(f, result))
    out.update(head_ratios(f, result))
    out.update(llamacpp_ratios(f))
    chosen, goals = goal_ratios(f)
    out.update(goals)
    result["best"] = chosen
    result["chain_vs_tree"] = chain_vs_tree(f.c, EQUAL_WIDTH)
    result["cost_model"] = cost_model_check(f.c)
    return out, chosen["offline"]


def theory_ratios(f: ContenderFigures, result: dict) -> dict[str, float]:
    """Our model chain of fixed k against target-only, next to Thm 3.8 (comparison.theory_comparison)."""
    chain = f.c.get(MODEL_CHAIN, {})
    if "ar" not in f.c or chain.get("drafts") != "model" or not isinstance(chain["k"], int):
        return {}
    return theory_comparison(chain, f.c["ar"], result["costs"], chain["k"])


def rule_ratios(f: ContenderFigures) -> dict[str, float]:
    """Block against token-level verification (the same draft and k); traversal against the token-level tree
    rules (the same drafter): tokens per pass and tokens/s."""
    out = {}
    for prefix, better, plain in (("block_vs_token", "default_block", MODEL_CHAIN),
                                  ("traversal_vs_token", TREE_TRAVERSAL, TREE_SAMPLED)):  # fmt: skip
        if {better, plain} <= set(f.c):
            per_pass = [(f.c[name].get("stats") or {}).get("mean_accepted_length") for name in (better, plain)]
            out[f"{prefix}_tokens_per_pass"] = per_pass[0] / per_pass[1] if all(per_pass) else math.nan
            out[f"{prefix}_tokens_per_second"] = f.tps(better) / f.tps(plain)
    return out


def other_ratios(f: ContenderFigures, result: dict) -> dict[str, float]:
    """bench=cross (another tokenizer, ours against Hugging Face's), the load scenario, and our best drafter per
    hard category."""
    out = {}
    ours_cross, hf_cross = [n for n in CROSS_OURS if n in f.c], [n for n in CROSS_HF if n in f.c]
    if ours_cross and hf_cross:
        out["cross_vocab_vs_hf_uag"] = f.category_geomean(f.best(ours_cross)) / f.category_geomean(f.best(hf_cross))
    cross_pair = str(result["settings"].get("draft", "")).startswith(("StringDrafter", "TokenIntersectionDrafter"))
    if cross_pair and ours_cross and "ar" in f.c:  # with or without Hugging Face's contender in the run
        out["cross_vocab_vs_target_only"] = f.category_geomean(f.best(ours_cross)) / f.category_geomean("ar")
    runs = (result.get("load") or {}).get("runs", {})
    if {"ar", "default"} <= set(runs):  # the load scenario: the same schedule of load for both
        out["default_under_load_vs_target_only"] = runs["default"]["tokens_per_second"] / runs["ar"]["tokens_per_second"]
    if {"ar", "default"} <= set(f.c) and result["settings"]["max_new_tokens"] <= SHORT_OUTPUTS:
        out["short_outputs_vs_target_only"] = f.category_geomean("default") / f.category_geomean("ar")
    speculating = f.group("ours", "model", "ngram", "hybrid")  # every offline configuration of ours
    for category in ("summarization", "retrieval"):
        rates = [r for r in (f.tps(name, category) for name in speculating) if not math.isnan(r)]
        out[f"best_drafter_vs_ar_{category}"] = max(rates, default=float("nan")) / f.tps("ar", category)
    return out


def goal_ratios(f: ContenderFigures) -> tuple[dict, dict[str, float]]:
    """The goal ratios, per category, geometric mean over categories; and which contender each used."""
    chosen = {
        "offline": f.best(f.group("ours", "model", "ngram", "hybrid")),
        "ngram": f.best(f.group("ours", "ngram")),
        "model": f.best(f.group("ours", "model", "hybrid")),  # configurations that run the draft model
        "hf_lookup_fixed_k": f.best([n for n in f.group("hf", "ngram") if n != "hf_lookup_default"]),
    }
    out = {}
    best_name = chosen["offline"]
    if "ar" in f.c and best_name:
        out["best_vs_target_only_geomean"] = geomean(f.over_categories(best_name, "ar"))
        out["best_vs_target_only_min_category"] = min(f.over_categories(best_name, "ar"))
    ngram, model, hf_fixed = chosen["ngram"], chosen["model"], chosen["hf_lookup_fixed_k"]
    out["vs_hf_prompt_lookup"] = geomean(f.over_categories(ngram, "hf_lookup_default")) if ngram else math.nan
    out["vs_hf_prompt_lookup_best_fixed_k"] = geomean(f.over_categories(ngram, hf_fixed)) if ngram and hf_fixed else math.nan
    out["vs_hf_prompt_lookup_same_k"] = geomean(f.over_categories("spec_ngram", "hf_lookup"))
    if hf_fixed:
        chosen["hf_lookup_best_k"] = f.c[hf_fixed]["prompt_lookup"]
    out["vs_hf_assisted_default"] = geomean(f.over_categories(model, "hf_assisted_default")) if model else math.nan
    out["vs_hf_assisted_fixed_k"] = geomean(f.over_categories(model, "hf_assisted")) if model else math.nan
    out["vs_hf_assisted_same_k"] = geomean(f.over_categories(MODEL_CHAIN, "hf_assisted"))
    both = [out["vs_hf_assisted_default"], out["vs_hf_assisted_fixed_k"]]
    out["vs_hf_assisted"] = float("nan") if any(map(math.isnan, both)) else min(both)
    return chosen, out


def llamacpp_ratios(f: ContenderFigures) -> dict[str, float]:
    """bench=llamacpp: the default (and target-only) over llama.cpp's F32 target-only and its best speculation."""
    speculative = f.group("llamacpp", "model", "ngram")
    pairs = {"default_vs_llamacpp_f32": ("default", "llamacpp_f32"), "ar_vs_llamacpp_f32": ("ar", "llamacpp_f32"),
             "default_vs_llamacpp_speculative": ("default", f.best(speculative) if speculative else None)}
    return {key: geomean(f.over_categories(a, b)) for key, (a, b) in pairs.items() if {a, b} <= set(f.c)}


def output_check(runs: dict[str, dict[str, list[ClockedRun]]], sampling: Sampling, reference: str) -> dict:
    """Greedy: every contender's first output per prompt against the reference's; sampling: skipped, said why."""
    names = list(runs)
    if not sampling.greedy:
        return {"identical": None,
                "skipped": f"temperature {sampling.temperature} > 0: outputs are samples (each loop draws its own random "
                "numbers), so equal outputs are not expected; exactness at T > 0 is what the chi-square tests check"}
    outputs = {name: {pid: rs[0].tokens for pid, rs in runs[name].items()} for name in names}
    return check_identical(outputs, reference=reference if reference in names else names[0])


UNFIXED = ("tree=", "model.draft.confidence=")  # a tree is not a chain; a confidence stop drafts fewer than k tokens


def pair_of(contender: dict) -> str:
    """The target's pair of a head contender, by its overrides (model=gemma3_head -> gemma3); else "target"."""
    pairs = [o.split("=", 1)[1] for o in contender["overrides"] if o.startswith("model=")]
    return pairs[-1].removesuffix("_head") if pairs else "target"


def head_ratios(f: ContenderFigures, result: dict) -> dict[str, float]:
    """bench=heads: the best head (a HeadDrafter: `drafts: head`) over the best copy (our contenders whose every
    draft is a model, `draft_kinds: ["model"]`) and over target-only (`<pair>_head_vs_target_only`); head_c and
    head_tokens_per_pass of the best head chain with a fixed k (k tokens every round: no tree, no confidence stop,
    whose drafting seconds also count rounds that draft nothing). `f`: specdec.comparison.ContenderFigures."""
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
        "head_c": measured_c(f.c[chain], step_ms),
        "head_tokens_per_pass": stats["emitted"] / stats["target_forwards"] if stats["target_forwards"] else math.nan,
        f"{model}_head_vs_target_only": f.category_geomean(best) / f.category_geomean("ar") if "ar" in f.c else math.nan,
    }
