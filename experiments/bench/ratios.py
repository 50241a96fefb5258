"""The benchmark's runs -> figures (throughput per contender and category, our Stats pooled) -> ratios: ours vs
Hugging Face's and vs target-only, Thm 3.8, the goal ratios, chain vs tree at equal width, the trained head's, the
cost model's prediction vs measurement, and the greedy output check."""

from __future__ import annotations

import math

from specdec.draft.head_store import training_record
from specdec.metrics import pooled_summaries
from specdec.prompts import Prompt
from specdec.quality import check_identical
from specdec.runtime.study import ClockedRun, throughput
from specdec.sampling import Sampling
from specdec.theory import walltime_improvement

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


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def contender_figures(per_prompt: dict[str, list[ClockedRun]], prompts: list[Prompt]) -> dict:
    """specdec.runtime.study.throughput of the contender's runs, with our statistics pooled."""
    figures = throughput(per_prompt, {p.id: p.category for p in prompts})
    stats = [r.stats for rs in per_prompt.values() for r in rs if r.stats]
    if stats:
        figures["stats"] = pooled_summaries(stats)
    return figures


class Figures:
    """The contenders' tokens/s as the ratios read them: overall or per category, geometric means, the best of a
    group (highest geometric mean over categories)."""

    def __init__(self, contenders: dict):
        self.c = contenders
        self.categories = sorted(next(iter(contenders.values()))["by_category"]) if contenders else []

    def tps(self, name: str, category: str | None = None) -> float:
        if name not in self.c:
            return float("nan")
        figures = self.c[name]["by_category"].get(category) if category else self.c[name]["tokens_per_second"]
        return figures["median"] if figures else float("nan")

    def over_categories(self, ours: str, other: str) -> list[float]:
        return [self.tps(ours, cat) / self.tps(other, cat) for cat in self.categories]

    def category_geomean(self, name: str) -> float:  # tokens/s, geometric mean over categories
        return geomean([self.tps(name, cat) for cat in self.categories])

    def best(self, names: list[str]) -> str | None:
        return max(names, key=self.category_geomean, default=None)

    def group(self, owner: str, *drafts: str) -> list[str]:
        return [n for n in self.c if self.c[n]["owner"] == owner and self.c[n]["drafts"] in drafts]


def ratios(result: dict) -> tuple[dict[str, float], str | None]:
    """The ratios (higher is better), the Thm 3.8 comparison, the goal ratios over categories, and
    the name of our best configuration (highest geometric mean over categories vs target-only).

    Also fills result["vs_target_only"] (every contender per category vs ar, geometric mean, worst),
    result["best"] (which contender each goal ratio used) and result["chain_vs_tree"], result["cost_model"].
    """
    f = Figures(result["contenders"])
    if "ar" in f.c:
        result["vs_target_only"] = vs_target_only(f)
    out = {ratio: f.tps(ours) / f.tps(hf) for ratio, (ours, hf) in HEADLINE.items()}
    out.update(theory_ratios(f, result))
    out["spec_ngram_vs_ar"] = f.tps("spec_ngram") / f.tps("ar")
    out.update(rule_ratios(f))
    out.update(other_ratios(f, result))
    out.update(head_ratios(f, result))
    chosen, goals = goal_ratios(f)
    out.update(goals)
    result["best"] = chosen
    result["chain_vs_tree"] = chain_vs_tree(result)
    result["cost_model"] = cost_model_check(f.c)
    return out, chosen["offline"]


def vs_target_only(f: Figures) -> dict:
    """Every contender per category over target-only (ar), their geometric mean and the worst category."""
    return {
        name: {"by_category": dict(zip(f.categories, f.over_categories(name, "ar"))),
               "geomean": geomean(f.over_categories(name, "ar")), "min_category": min(f.over_categories(name, "ar"))}
        for name in f.c
        if name != "ar"
    }  # fmt: skip


def theory_ratios(f: Figures, result: dict) -> dict[str, float]:
    """Our model chain against target-only, next to Thm 3.8 (with and without the measured pass cost)."""
    c, cost = f.c, result["costs"]
    k = c[MODEL_CHAIN]["k"] if MODEL_CHAIN in c else result["settings"]["k"]
    speedup = f.tps(MODEL_CHAIN) / f.tps("ar")
    alpha = (c.get(MODEL_CHAIN, {}).get("stats") or {}).get("alpha")
    if alpha is None or "ar" not in c or not isinstance(k, int) or c[MODEL_CHAIN]["drafts"] != "model":
        return {}
    theory = walltime_improvement(min(alpha, 1.0), cost["c"], k)  # Thm 3.8
    verify_ratio = cost["target_verify_ms_by_k"][k] / cost["target_step_ms"]
    refined = walltime_improvement(min(alpha, 1.0), cost["c"], k, verify_ratio)  # with the measured pass
    decode_rate = [c[n]["stats"]["emitted"] / (c[n]["stats"]["seconds"]["total"] - c[n]["stats"]["seconds"]["prefill"])
                   for n in (MODEL_CHAIN, "ar")]  # tokens/s after the prefill: prefills excluded, as in the theory
    decode = decode_rate[0] / decode_rate[1]
    return {"spec_model_vs_ar": speedup, "alpha": alpha, "c": cost["c"], "theory_speedup": theory,
            "efficiency_vs_theory": speedup / theory, "spec_model_vs_ar_decode_only": decode,
            "efficiency_vs_theory_decode_only": decode / theory, "theory_speedup_with_verify_cost": refined,
            "efficiency_vs_theory_with_verify_cost": speedup / refined}  # fmt: skip


def rule_ratios(f: Figures) -> dict[str, float]:
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


def other_ratios(f: Figures, result: dict) -> dict[str, float]:
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


def goal_ratios(f: Figures) -> tuple[dict, dict[str, float]]:
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


def pairwise(contenders: dict, pairs: dict[str, list[str]]) -> dict[str, float]:
    """Named ratios of two contenders' median tokens/s (pooled over the prompts): ours over theirs; pairs with
    a contender that did not run (bench.only) are left out."""
    return {key: contenders[a]["tokens_per_second"]["median"] / contenders[b]["tokens_per_second"]["median"]
            for key, (a, b) in pairs.items() if a in contenders and b in contenders}  # fmt: skip


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
    """bench=heads: the best head (a HeadDrafter: `drafts: head`) over the best copy (our contenders whose every
    draft is a model, `draft_kinds: ["model"]`) and over target-only (`<pair>_head_vs_target_only`); head_c and
    head_tokens_per_pass of the best head chain with a fixed k (k tokens every round: no tree, no confidence stop,
    whose drafting seconds also count rounds that draft nothing). `f` is the bench's ratios.Figures."""
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
