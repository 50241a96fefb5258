"""The benchmark's figures -> ratios: ours vs Hugging Face's and vs target-only, Thm 3.8, the goal ratios,
chain vs tree at equal width and the cost model's prediction vs measurement."""

from __future__ import annotations

import math

from specdec.theory import walltime_improvement

from .figures import decode_rate, geomean

MODEL_CHAIN = "default_k4"  # our chain with the calibrated draft at fixed k (the default run chooses k online)
TREE_SAMPLED, TREE_TRAVERSAL = "tree_model_iid", "tree_model_traversal"  # one tree drafter, two tree rules
CROSS_OURS = ("default", "string_k3", "tli_auto", "tli_k3")  # bench=cross: ours with another tokenizer
CROSS_HF = ("hf_uag_default", "hf_uag_k3")  # Hugging Face's universal assisted generation, same draft
HEADLINE = {  # ratio -> (ours, Hugging Face's), pooled tokens/s over tokens/s, at the same k
    "speedup_vs_hf_assisted": (MODEL_CHAIN, "hf_assisted"),
    "speedup_vs_hf_prompt_lookup": ("spec_ngram", "hf_lookup"),
    "ar_vs_hf_plain": ("ar", "hf_plain"),
}
EQUAL_WIDTH = {"ngram": ("spec_ngram", "tree_ngram"), "model": (MODEL_CHAIN, "tree_model")}  # (chain, tree)


def ratios(result: dict) -> tuple[dict[str, float], str | None]:
    """The ratios (higher is better), the Thm 3.8 comparison, the goal ratios over categories, and
    the name of our best configuration (highest geometric mean over categories vs target-only).

    Also fills result["vs_target_only"] (every contender per category vs ar, geometric mean, worst),
    result["best"] (which contender each goal ratio used) and result["chain_vs_tree"], result["cost_model"].
    """
    c = result["contenders"]
    k = c[MODEL_CHAIN]["k"] if MODEL_CHAIN in c else result["settings"]["k"]

    def tps(name: str, category: str | None = None) -> float:
        if name not in c:
            return float("nan")
        figures = c[name]["by_category"].get(category) if category else c[name]["tokens_per_second"]
        return figures["median"] if figures else float("nan")

    categories = sorted(next(iter(c.values()))["by_category"]) if c else []

    def over_categories(ours: str, other: str) -> list[float]:
        return [tps(ours, cat) / tps(other, cat) for cat in categories]

    def category_geomean(name: str) -> float:  # tokens/s, geometric mean over categories
        return geomean([tps(name, cat) for cat in categories])

    def best(names: list[str]) -> str | None:
        return max(names, key=category_geomean, default=None)

    def group(owner: str, *drafts: str) -> list[str]:
        return [n for n in c if c[n]["owner"] == owner and c[n]["drafts"] in drafts]

    if "ar" in c:
        result["vs_target_only"] = {
            name: {
                "by_category": dict(zip(categories, over_categories(name, "ar"))),
                "geomean": geomean(over_categories(name, "ar")),
                "min_category": min(over_categories(name, "ar")),
            }
            for name in c
            if name != "ar"
        }
    out = {ratio: tps(ours) / tps(hf) for ratio, (ours, hf) in HEADLINE.items()}
    speedup = tps(MODEL_CHAIN) / tps("ar")
    alpha = (c.get(MODEL_CHAIN, {}).get("stats") or {}).get("alpha")
    cost = result["costs"]
    if alpha is not None and "ar" in c and isinstance(k, int) and c[MODEL_CHAIN]["drafts"] == "model":
        theory = walltime_improvement(min(alpha, 1.0), cost["c"], k)  # Thm 3.8
        verify_ratio = cost["target_verify_ms_by_k"][k] / cost["target_step_ms"]
        refined = walltime_improvement(min(alpha, 1.0), cost["c"], k, verify_ratio)  # with the measured pass
        decode = decode_rate(c[MODEL_CHAIN]) / decode_rate(c["ar"])  # prefills excluded, as in the theory
        out.update(
            spec_model_vs_ar=speedup,
            alpha=alpha,
            c=cost["c"],
            theory_speedup=theory,
            efficiency_vs_theory=speedup / theory,
            spec_model_vs_ar_decode_only=decode,
            efficiency_vs_theory_decode_only=decode / theory,
            theory_speedup_with_verify_cost=refined,
            efficiency_vs_theory_with_verify_cost=speedup / refined,
        )
    out["spec_ngram_vs_ar"] = tps("spec_ngram") / tps("ar")
    if "default_block" in c and MODEL_CHAIN in c:  # block against token-level verification, the same draft and k
        per_pass = [(c[name].get("stats") or {}).get("mean_accepted_length") for name in ("default_block", MODEL_CHAIN)]
        out["block_vs_token_tokens_per_pass"] = per_pass[0] / per_pass[1] if all(per_pass) else math.nan
        out["block_vs_token_tokens_per_second"] = tps("default_block") / tps(MODEL_CHAIN)
    if {TREE_SAMPLED, TREE_TRAVERSAL} <= set(c):  # traversal against the token-level tree rules, the same drafter
        per_pass = [(c[name].get("stats") or {}).get("mean_accepted_length") for name in (TREE_TRAVERSAL, TREE_SAMPLED)]
        out["traversal_vs_token_tokens_per_pass"] = per_pass[0] / per_pass[1] if all(per_pass) else math.nan
        out["traversal_vs_token_tokens_per_second"] = tps(TREE_TRAVERSAL) / tps(TREE_SAMPLED)
    ours_cross, hf_cross = [n for n in CROSS_OURS if n in c], [n for n in CROSS_HF if n in c]
    if ours_cross and hf_cross and "ar" in c:  # bench=cross: a draft with another tokenizer, ours against HF's
        out["cross_vocab_vs_hf_uag"] = category_geomean(best(ours_cross)) / category_geomean(best(hf_cross))
        out["cross_vocab_vs_target_only"] = category_geomean(best(ours_cross)) / category_geomean("ar")
    runs = (result.get("load") or {}).get("runs", {})
    if {"ar", "default"} <= set(runs):  # the load scenario: the same schedule of load for both
        out["default_under_load_vs_target_only"] = runs["default"]["tokens_per_second"] / runs["ar"]["tokens_per_second"]
    speculating = group("ours", "model", "ngram", "hybrid")  # every offline configuration of ours
    for category in ("summarization", "retrieval"):
        rates = [r for r in (tps(name, category) for name in speculating) if not math.isnan(r)]
        out[f"best_drafter_vs_ar_{category}"] = max(rates, default=float("nan")) / tps("ar", category)
    # the goals of issue 9: per category, geometric mean over categories
    chosen = {
        "offline": best(speculating),
        "ngram": best(group("ours", "ngram")),
        "model": best(group("ours", "model", "hybrid")),  # configurations that run the draft model
        "hf_lookup_fixed_k": best([n for n in group("hf", "ngram") if n != "hf_lookup_default"]),
    }
    best_name = chosen["offline"]
    if "ar" in c and best_name:
        out["best_vs_target_only_geomean"] = geomean(over_categories(best_name, "ar"))
        out["best_vs_target_only_min_category"] = min(over_categories(best_name, "ar"))
    ngram, model, hf_fixed = chosen["ngram"], chosen["model"], chosen["hf_lookup_fixed_k"]
    out["vs_hf_prompt_lookup"] = geomean(over_categories(ngram, "hf_lookup_default")) if ngram else math.nan
    out["vs_hf_prompt_lookup_best_fixed_k"] = (
        geomean(over_categories(ngram, hf_fixed)) if ngram and hf_fixed else math.nan
    )
    out["vs_hf_prompt_lookup_same_k"] = geomean(over_categories("spec_ngram", "hf_lookup"))
    if hf_fixed:
        chosen["hf_lookup_best_k"] = c[hf_fixed]["prompt_lookup"]
    out["vs_hf_assisted_default"] = geomean(over_categories(model, "hf_assisted_default")) if model else math.nan
    out["vs_hf_assisted_fixed_k"] = geomean(over_categories(model, "hf_assisted")) if model else math.nan
    out["vs_hf_assisted_same_k"] = geomean(over_categories(MODEL_CHAIN, "hf_assisted"))
    both = [out["vs_hf_assisted_default"], out["vs_hf_assisted_fixed_k"]]
    out["vs_hf_assisted"] = float("nan") if any(map(math.isnan, both)) else min(both)
    result["best"] = chosen
    result["chain_vs_tree"] = chain_vs_tree(result)
    result["cost_model"] = cost_model_check(c)
    return out, best_name


def annotate_goals(goals: dict, best: dict, k: int, contenders: dict) -> None:
    """Name, next to each goal ratio, the contenders it compares."""
    for key in ("best_vs_target_only_geomean", "best_vs_target_only_min_category"):
        if key in goals:
            goals[key].update(contender=best.get("offline"), against="ar")
    if "vs_hf_prompt_lookup" in goals:
        goals["vs_hf_prompt_lookup"].update(
            contender=best.get("ngram"),
            against="hf_lookup_default",
            against_k=contenders.get("hf_lookup_default", {}).get("prompt_lookup"),
            hf_best_fixed_k=best.get("hf_lookup_best_k"),
            hf_best_fixed_k_contender=best.get("hf_lookup_fixed_k"),
        )
    if "vs_hf_assisted" in goals:
        goals["vs_hf_assisted"].update(
            contender=best.get("model"), against=["hf_assisted_default", "hf_assisted"], against_fixed_k=k
        )


def chain_vs_tree(result: dict) -> dict:
    """Tokens per target pass (and tokens/s, and measured seconds per pass) of a chain and a tree of the same
    pass width, per drafter."""
    c = result["contenders"]
    out = {}
    for drafter, (chain, tree) in EQUAL_WIDTH.items():
        if not (chain in c and tree in c and "stats" in c[chain] and "stats" in c[tree]):
            continue
        if c[chain]["pass_width"] is None or c[chain]["pass_width"] != c[tree]["pass_width"]:
            continue
        entry = {"pass_width": c[chain]["pass_width"]}
        for shape, name in (("chain", chain), ("tree", tree)):
            st = c[name]["stats"]
            entry[shape] = {
                "contender": name,
                "tokens_per_pass": st["mean_accepted_length"],
                "tokens_per_second": c[name]["tokens_per_second"]["median"],
                "verify_ms_per_pass": 1000 * st["seconds"]["verify"] / st["target_forwards"]
                if "verify" in st["seconds"]
                else None,
                "draft_forwards_per_pass": st["draft_forwards"] / st["target_forwards"],
                "mean_tree_nodes": st.get("mean_tree_nodes"),
            }
        entry["tree_over_chain_tokens_per_pass"] = entry["tree"]["tokens_per_pass"] / entry["chain"]["tokens_per_pass"]
        out[drafter] = entry
    return out


def cost_model_check(c: dict) -> dict:
    """k="auto": the cost model's predicted tokens/s (over the rounds it predicted) vs what they measured."""
    out = {}
    for name, f in c.items():
        st = f.get("stats") or {}
        predicted, measured = st.get("predicted_tokens_per_second"), st.get("measured_tokens_per_second")
        if predicted:
            out[name] = {
                "predicted_tokens_per_second": predicted,
                "measured_tokens_per_second": measured,
                "measured_over_predicted": measured / predicted if measured else None,
                "chosen_k_histogram": st["chosen_k_histogram"],
            }
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (length mismatch counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_identical(outputs: dict[str, dict[str, list[int]]], reference: str = "ar") -> dict:
    """Greedy decoding is deterministic and lossless: every contender must emit the reference's tokens."""
    mismatches = []
    for name, per_input in outputs.items():
        for key, tokens in per_input.items():
            at = first_difference(tokens, outputs[reference][key])
            if at is not None:
                mismatches.append({"contender": name, "prompt": key, "first_difference": at})
    return {"identical": not mismatches, "reference": reference, "mismatches": mismatches}


def pairwise(contenders: dict, pairs: dict[str, list[str]]) -> dict[str, float]:
    """Named ratios of two contenders' median tokens/s (pooled over the prompts): ours over theirs; pairs with
    a contender that did not run (bench.only) are left out."""
    return {key: contenders[a]["tokens_per_second"]["median"] / contenders[b]["tokens_per_second"]["median"]
            for key, (a, b) in pairs.items() if a in contenders and b in contenders}  # fmt: skip
