"""The benchmark's runs -> throughput per contender and category, measured costs, ratios and the table."""

from __future__ import annotations

import math
import statistics

import torch
from transformers import PreTrainedModel

from specdec.metrics import expected_tokens_per_pass, walltime_improvement
from specdec.timing import forward_ms

from .contenders import Run
from .goals import GOALS
from .prompts import Prompt
from .records import cell, markdown_table

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

        def total(key):
            return sum(s[key] for s in stats)

        figures["stats"] = {
            "emitted": total("emitted"),
            "drafted": total("drafted"),
            "accepted": total("accepted"),
            "target_forwards": total("target_forwards"),
            "draft_forwards": total("draft_forwards"),
            "acceptance_rate": total("accepted") / total("drafted") if total("drafted") else None,
            "mean_accepted_length": total("emitted") / total("target_forwards"),
            "alpha": total("overlap_sum") / total("overlap_count") if total("overlap_count") else None,
            "seconds": {
                key: total(f"seconds_{key}")
                for key in ("prefill", "draft", "verify", "total")
                if f"seconds_{key}" in stats[0]
            },
        }
    return figures


def cost_figures(
    target: PreTrainedModel, draft: PreTrainedModel | None, prefix: torch.Tensor, k: int
) -> dict:
    """Measured step costs: c = draft step / target step, and the target's verification cost vs k."""
    target_ms = forward_ms(target, prefix, 1)
    draft_ms = forward_ms(draft, prefix, 1) if draft is not None else float("nan")
    verify_ms = {n - 1: forward_ms(target, prefix, n) for n in sorted({2, k + 1, 2 * k + 1})}
    return {
        "context_tokens": prefix.shape[-1],
        "target_step_ms": target_ms,
        "draft_step_ms": draft_ms,
        "c": draft_ms / target_ms,
        "target_verify_ms_by_k": verify_ms,
    }


def decode_rate(figures: dict) -> float:
    """Tokens per second after the prefill, from our Stats pooled over every run."""
    seconds = figures["stats"]["seconds"]
    return figures["stats"]["emitted"] / (seconds["total"] - seconds["prefill"])


def ratios(result: dict) -> tuple[dict[str, float], str | None]:
    """The ratios (higher is better), the Thm 3.8 comparison, the goal ratios over categories, and
    the name of our best configuration (highest geometric mean over categories vs target-only)."""
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
    for category in ("summarization", "retrieval"):
        rates = [tps(name, category) for name in ("spec_model", "spec_ngram")]
        best = max((r for r in rates if not math.isnan(r)), default=float("nan"))
        out[f"best_drafter_vs_ar_{category}"] = best / tps("ar", category)
    # the goals of the speculation work: per category, geometric mean over categories
    ours = [name for name, f in c.items() if name != "ar" and "stats" in f]
    best_name = None
    if "ar" in c and ours:
        best_name = max(ours, key=lambda name: geomean(over_categories(name, "ar")))
        out["best_vs_target_only_geomean"] = geomean(over_categories(best_name, "ar"))
        out["best_vs_target_only_min_category"] = min(over_categories(best_name, "ar"))
    out["vs_hf_prompt_lookup"] = geomean(over_categories("spec_ngram", "hf_lookup_default"))
    out["vs_hf_prompt_lookup_same_k"] = geomean(over_categories("spec_ngram", "hf_lookup"))
    out["vs_hf_assisted_default"] = geomean(over_categories("spec_model", "hf_assisted_default"))
    out["vs_hf_assisted_same_k"] = geomean(over_categories("spec_model", "hf_assisted"))
    both = [out["vs_hf_assisted_default"], out["vs_hf_assisted_same_k"]]
    out["vs_hf_assisted"] = float("nan") if any(map(math.isnan, both)) else min(both)
    return out, best_name


def bench_table(result: dict) -> str:
    """bench.md: contenders, tokens/s per category, ratios against goals, greedy check and costs."""
    s = result["settings"]
    head = (
        f"k={s['k']}, temperature={s['temperature']}, max_new_tokens={s['max_new_tokens']}, "
        f"repetitions={s['repetitions']}, prompts={len(s['prompts'])}"
    )
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
    contenders = markdown_table(
        [
            "contender",
            "tok/s median",
            "min",
            "max",
            "time in model forwards",
            "target / draft forwards per token",
            "mean accepted length",
            "alpha",
            "peak RSS (MB)",
        ],
        rows,
        fmt="{:.1f}",
    )
    categories = sorted(next(iter(result["contenders"].values()))["by_category"])
    by_category = markdown_table(
        ["contender (tok/s)", *categories],
        [
            [name, *(f["by_category"][c]["median"] for c in categories)]
            for name, f in result["contenders"].items()
        ],
        fmt="{:.1f}",
    )
    ratio_rows = [
        [
            key,
            value,
            f">= {GOALS[key]}" if key in GOALS else "",
            "" if key not in GOALS or math.isnan(value) else ("yes" if value >= GOALS[key] else "no"),
        ]
        for key, value in result["ratios"].items()
    ]
    lines = [
        head,
        "",
        contenders,
        "",
        by_category,
        "",
        f"Best configuration of ours (geometric mean over categories): {result.get('best_configuration')}",
        "",
        markdown_table(["ratio", "value", "target", "met"], ratio_rows),
    ]
    check = result.get("greedy_check")
    if check:
        lines += [
            "",
            f"Greedy outputs identical across contenders: {check['identical']}"
            + ("" if check["identical"] else f" (mismatches: {check['mismatches']})"),
        ]
    c = result["costs"]
    lines += [
        "",
        f"Costs at a {c['context_tokens']}-token context: target step {c['target_step_ms']:.1f} ms, "
        f"draft step {c['draft_step_ms']:.1f} ms (c = {c['c']:.3f}); target pass over k+1 tokens: "
        + ", ".join(f"k={kk}: {ms:.1f} ms" for kk, ms in c["target_verify_ms_by_k"].items()),
    ]
    return "\n".join(lines) + "\n"
