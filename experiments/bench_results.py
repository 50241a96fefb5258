"""The benchmark's runs -> throughput per contender and category, measured costs, ratios and the table."""

from __future__ import annotations

import math
import statistics

import torch
from transformers import PreTrainedModel

from specdec.metrics import expected_tokens_per_pass, walltime_improvement
from specdec.timing import forward_ms

from .contenders import CONTENDERS, EQUAL_WIDTH, HF_PROMPT_LOOKUP_TOKENS, Run
from .goals import GOALS, ISSUE_9
from .prompts import Prompt
from .records import cell, machine_sentence, markdown_table

HEADLINE = {  # ratio -> (ours, Hugging Face's), pooled tokens/s over tokens/s, at the same k
    "speedup_vs_hf_assisted": ("spec_model", "hf_assisted"),
    "speedup_vs_hf_prompt_lookup": ("spec_ngram", "hf_lookup"),
    "ar_vs_hf_plain": ("ar", "hf_plain"),
}


def spread(values: list[float]) -> dict:
    """Median, min, max and count of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def pooled_stats(stats: list[dict]) -> dict:
    """Our Stats summaries of several runs, totalled: counters, seconds, the cost model's sums, histograms."""

    def total(key: str) -> float:
        return sum(s[key] for s in stats)

    histogram: list[int] = []
    for s in stats:
        h = s.get("chosen_k_histogram") or []
        width = max(len(h), len(histogram))
        histogram = [a + b for a, b in zip(histogram + [0] * (width - len(histogram)), h + [0] * (width - len(h)))]
    rounds = total("tree_rounds")
    measured, predicted = total("measured_seconds"), total("predicted_seconds")
    return {
        "emitted": total("emitted"),
        "drafted": total("drafted"),
        "accepted": total("accepted"),
        "target_forwards": total("target_forwards"),
        "draft_forwards": total("draft_forwards"),
        "acceptance_rate": total("accepted") / total("drafted") if total("drafted") else None,
        "mean_accepted_length": total("emitted") / total("target_forwards"),  # tokens per target pass
        "alpha": total("overlap_sum") / total("overlap_count") if total("overlap_count") else None,
        "seconds": {
            key: total(f"seconds_{key}")
            for key in ("prefill", "draft", "verify", "total")
            if all(f"seconds_{key}" in s for s in stats)
        },
        "chosen_k_histogram": histogram,
        # k="auto": the cost model's expected rate over the rounds it predicted, and what they measured
        "predicted_tokens_per_second": total("predicted_tokens") / predicted if predicted else None,
        "measured_tokens_per_second": total("measured_tokens") / measured if measured else None,
        # token trees: nodes per pass and accepted depth per pass
        "mean_tree_nodes": total("tree_nodes_sum") / rounds if rounds else None,
        "mean_tree_depth": total("tree_depth_sum") / rounds if rounds else None,
        "mean_accepted_depth": total("accepted") / rounds if rounds else None,
    }


def contender_figures(per_prompt: dict[str, list[Run]], prompts: list[Prompt]) -> dict:
    """Throughput per repetition (prompts pooled), per category, per prompt; forwards; our stats pooled."""
    reps = len(next(iter(per_prompt.values())))
    runs = [r for rs in per_prompt.values() for r in rs]

    def pooled(ids: list[str]) -> list[float]:  # tokens/s of each repetition over the given prompts
        return [
            sum(len(per_prompt[i][r].tokens) for i in ids) / sum(per_prompt[i][r].seconds for i in ids)
            for r in range(reps)
        ]

    categories = sorted({p.category for p in prompts})
    figures = {
        "tokens_per_second": spread(pooled([p.id for p in prompts])),
        "by_category": {c: spread(pooled([p.id for p in prompts if p.category == c])) for c in categories},
        "by_prompt": {
            p.id: {"tokens": len(per_prompt[p.id][0].tokens), **spread(pooled([p.id]))} for p in prompts
        },
        "model_forward_share": sum(sum(r.model_seconds.values()) for r in runs)
        / sum(r.seconds for r in runs),
        "forwards_per_token": {
            m: sum(r.model_calls[m] for r in runs) / sum(len(r.tokens) for r in runs)
            for m in runs[0].model_calls
        },
    }
    stats = [r.stats for r in runs if r.stats]
    if stats:
        figures["stats"] = pooled_stats(stats)
    return figures


def pass_widths(k: int, max_width: int) -> list[int]:
    """Widths of the pass-cost curve: 1..max_width, and the chain passes k + 1 and 2k + 1."""
    return sorted(set(range(1, max_width + 1)) | {k + 1, 2 * k + 1})


def cost_figures(
    target: PreTrainedModel, draft: PreTrainedModel | None, prefix: torch.Tensor, k: int, max_width: int = 17
) -> dict:
    """Measured costs: c = draft step / target step, and one target pass's time vs its width.

    A pass of width w scores w new tokens after the prefix (causal mask): width 1 is a plain step,
    k + 1 a chain's verification, nodes + 1 a tree's (whose 4D mask is not part of this curve).
    """
    pass_ms = {w: forward_ms(target, prefix, w) for w in pass_widths(k, max_width)}
    target_ms = pass_ms[1]
    draft_ms = forward_ms(draft, prefix, 1) if draft is not None else float("nan")
    return {
        "context_tokens": prefix.shape[-1],
        "target_step_ms": target_ms,
        "draft_step_ms": draft_ms,
        "c": draft_ms / target_ms,
        "target_verify_ms_by_k": {n - 1: pass_ms[n] for n in sorted({2, k + 1, 2 * k + 1})},
        "pass_ms_by_width": pass_ms,
        "pass_cost_by_width": {w: ms / target_ms for w, ms in pass_ms.items()},  # in target steps
    }


def decode_rate(figures: dict) -> float:
    """Tokens per second after the prefill, from our Stats pooled over every run."""
    seconds = figures["stats"]["seconds"]
    return figures["stats"]["emitted"] / (seconds["total"] - seconds["prefill"])


def lookup_k(name: str, k: int) -> int:
    """The draft length of a Hugging Face prompt-lookup contender."""
    if name == "hf_lookup":
        return k
    if name == "hf_lookup_default":
        return HF_PROMPT_LOOKUP_TOKENS
    return int(name.removeprefix("hf_lookup_k"))


def ratios(result: dict) -> tuple[dict[str, float], str | None]:
    """The ratios (higher is better), the Thm 3.8 comparison, the goal ratios over categories, and
    the name of our best configuration (highest geometric mean over categories vs target-only).

    Also fills result["vs_target_only"] (every contender per category vs ar, geometric mean, worst),
    result["best"] (which contender each goal ratio used) and result["chain_vs_tree"], result["cost_model"].
    """
    c = result["contenders"]
    k = result["settings"]["k"]

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
        return [n for n in c if n in CONTENDERS and CONTENDERS[n].owner == owner and CONTENDERS[n].drafts in drafts]

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
    speedup = tps("spec_model") / tps("ar")
    alpha = (c.get("spec_model", {}).get("stats") or {}).get("alpha")
    cost = result["costs"]
    if alpha is not None and "ar" in c:
        theory = walltime_improvement(min(alpha, 1.0), cost["c"], k)  # Thm 3.8
        verify_ratio = cost["target_verify_ms_by_k"][k] / cost["target_step_ms"]
        refined = expected_tokens_per_pass(min(alpha, 1.0), k) / (k * cost["c"] + verify_ratio)
        decode = decode_rate(c["spec_model"]) / decode_rate(c["ar"])  # prefills excluded, as in the theory
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
        chosen["hf_lookup_best_k"] = lookup_k(hf_fixed, k)
    out["vs_hf_assisted_default"] = geomean(over_categories(model, "hf_assisted_default")) if model else math.nan
    out["vs_hf_assisted_fixed_k"] = geomean(over_categories(model, "hf_assisted")) if model else math.nan
    out["vs_hf_assisted_same_k"] = geomean(over_categories("spec_model", "hf_assisted"))
    both = [out["vs_hf_assisted_default"], out["vs_hf_assisted_fixed_k"]]
    out["vs_hf_assisted"] = float("nan") if any(map(math.isnan, both)) else min(both)
    result["best"] = chosen
    result["chain_vs_tree"] = chain_vs_tree(result)
    result["cost_model"] = cost_model_check(c)
    return out, best_name


def annotate_goals(goals: dict, best: dict, k: int) -> None:
    """Name, next to each goal ratio, the contenders it compares."""
    for key in ("best_vs_target_only_geomean", "best_vs_target_only_min_category"):
        if key in goals:
            goals[key].update(contender=best.get("offline"), against="ar")
    if "vs_hf_prompt_lookup" in goals:
        goals["vs_hf_prompt_lookup"].update(
            contender=best.get("ngram"),
            against="hf_lookup_default",
            against_k=HF_PROMPT_LOOKUP_TOKENS,
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
    c, settings = result["contenders"], result["settings"]
    out = {}
    for drafter, (wide, fixed, tree) in EQUAL_WIDTH.items():
        chain = wide if wide in c else fixed if settings["k"] == settings.get("nodes") else None
        if not (chain in c and tree in c and "stats" in c[chain] and "stats" in c[tree]):
            continue
        entry = {"pass_width": settings["nodes"] + 1}
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


def bench_table(result: dict) -> str:
    """bench.md: issue 9's goals, ratios to target-only per category, contenders, chain vs tree, pass cost
    vs width, the cost model's prediction, the other ratios, the greedy check and the machine."""
    s = result["settings"]
    head = (
        f"k={s['k']}, k_max={s.get('k_max')}, tree nodes={s.get('nodes')}, temperature={s['temperature']}, "
        f"max_new_tokens={s['max_new_tokens']}, repetitions={s['repetitions']}, prompts={len(s['prompts'])}"
    )
    lines = [head]
    if s.get("model"):
        lines += ["", f"Pairs: --model {s['model']} (draft: {s.get('draft')}), --ngram {s.get('ngram')}."]
    if "calibration" in result:
        lines += ["", f"Draft calibration chose {result['calibration']['chosen']}: {result['calibration']['reason']}"]
    if "machine" in result:
        lines += ["", machine_sentence(result["machine"])]
    goals = result.get("goals", {})
    lines += [
        "",
        markdown_table(
            ["goal", "value", "target", "met", "ours", "against"],
            [
                [
                    key,
                    g["value"],
                    f">= {g['target']}",
                    {True: "met", False: "not met", None: "-"}[g["met"]],
                    g.get("contender") or "",
                    g.get("against") if isinstance(g.get("against"), str) else " / ".join(g.get("against") or []),
                ]
                for key, g in goals.items()
                if key in ISSUE_9
            ],
        ),
    ]
    lookup = goals.get("vs_hf_prompt_lookup", {})
    if lookup.get("hf_best_fixed_k") is not None:
        lines += [
            "",
            f"Hugging Face prompt lookup's best fixed k: {lookup['hf_best_fixed_k']} "
            f"({lookup['hf_best_fixed_k_contender']}); ours ({lookup.get('contender')}) against it: "
            + cell(result["ratios"].get("vs_hf_prompt_lookup_best_fixed_k")),
        ]
    categories = sorted(next(iter(result["contenders"].values()))["by_category"])
    if "vs_target_only" in result:
        lines += [
            "",
            "Tokens/s over target-only (`ar`), per category (median over repetitions), geometric mean and worst:",
            "",
            markdown_table(
                ["contender", *categories, "geomean", "worst"],
                [
                    [name, *(v["by_category"][cat] for cat in categories), v["geomean"], v["min_category"]]
                    for name, v in result["vs_target_only"].items()
                ],
                fmt="{:.2f}",
            ),
        ]
    rows = []
    for name, f in result["contenders"].items():
        t, st = f["tokens_per_second"], f.get("stats") or {}
        rss = result.get("memory", {}).get(name, {}).get("peak_rss_mb")
        rows.append(
            [
                name,
                t["median"],
                t["min"],
                t["max"],
                f"{100 * f['model_forward_share']:.0f}%",
                " / ".join(f"{v:.2f}" for v in f["forwards_per_token"].values()),
                cell(st.get("mean_accepted_length"), "{:.2f}"),
                cell(st.get("alpha"), "{:.3f}"),
                cell(rss, "{:.0f}"),
            ]
        )
    lines += [
        "",
        markdown_table(
            [
                "contender",
                "tok/s median",
                "min",
                "max",
                "time in model forwards",
                "target / draft forwards per token",
                "tokens per target pass",
                "alpha",
                "peak RSS (MB)",
            ],
            rows,
            fmt="{:.1f}",
        ),
        "",
        markdown_table(
            ["contender (tok/s)", *categories],
            [
                [name, *(f["by_category"][c]["median"] for c in categories)]
                for name, f in result["contenders"].items()
            ],
            fmt="{:.1f}",
        ),
    ]
    trees = result.get("chain_vs_tree") or {}
    if trees:
        lines += [
            "",
            "Chain vs tree at the same pass width:",
            "",
            markdown_table(
                ["drafter", "pass width", "shape", "contender", "tokens per pass", "tok/s", "verify ms per pass"],
                [
                    [d, e["pass_width"], shape, e[shape]["contender"], e[shape]["tokens_per_pass"],
                     e[shape]["tokens_per_second"], cell(e[shape]["verify_ms_per_pass"], "{:.1f}")]
                    for d, e in trees.items()
                    for shape in ("chain", "tree")
                ],
                fmt="{:.2f}",
            ),
        ]
    c = result["costs"]
    if "pass_ms_by_width" in c:
        widths = list(c["pass_ms_by_width"])
        lines += [
            "",
            f"Target pass cost vs width (tokens in the pass) at a {c['context_tokens']}-token context:",
            "",
            markdown_table(
                ["width", *map(str, widths)],
                [["ms", *c["pass_ms_by_width"].values()], ["/ one step", *c["pass_cost_by_width"].values()]],
                fmt="{:.2f}",
            ),
        ]
    if result.get("cost_model"):
        lines += [
            "",
            'k="auto": the cost model\'s prediction over the rounds it predicted vs what they measured:',
            "",
            markdown_table(
                ["contender", "predicted tok/s", "measured tok/s", "measured / predicted", "chosen k histogram"],
                [
                    [name, v["predicted_tokens_per_second"], v["measured_tokens_per_second"],
                     v["measured_over_predicted"], str(v["chosen_k_histogram"])]
                    for name, v in result["cost_model"].items()
                ],
                fmt="{:.2f}",
            ),
        ]
    ratio_rows = [
        [
            key,
            value,
            f">= {GOALS[key]}" if key in GOALS else "",
            "" if key not in GOALS or math.isnan(value) else ("yes" if value >= GOALS[key] else "no"),
        ]
        for key, value in result["ratios"].items()
    ]
    lines += [
        "",
        f"Best configuration of ours (geometric mean over categories): {result.get('best_configuration')}",
        "",
        markdown_table(["ratio", "value", "target", "met"], ratio_rows),
    ]
    check = result.get("greedy_check")
    if check and check.get("skipped"):
        lines += ["", f"Output check skipped: {check['skipped']}"]
    elif check:
        lines += [
            "",
            f"Greedy outputs identical across contenders: {check['identical']}"
            + ("" if check["identical"] else f" (mismatches: {check['mismatches']})"),
        ]
    lines += [
        "",
        f"Costs at a {c['context_tokens']}-token context: target step {c['target_step_ms']:.1f} ms, "
        f"draft step {c['draft_step_ms']:.1f} ms (c = {c['c']:.3f}); target pass over k+1 tokens: "
        + ", ".join(f"k={kk}: {ms:.1f} ms" for kk, ms in c["target_verify_ms_by_k"].items()),
    ]
    return "\n".join(lines) + "\n"
