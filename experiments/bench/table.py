"""The benchmark's result -> bench.md: goals, ratios, contenders, chain vs tree, pass cost, cost model, machine."""

from __future__ import annotations

from ..records import cell, machine_sentence, markdown_table
from .goals import ISSUE_9


def load_plain_share(run: dict) -> float | None:
    """Share of a load run's rounds that drafted nothing (None for target-only)."""
    rounds = [p["rounds"] for p in run["prompts"]]
    shares = [p["plain_step_share"] for p in run["prompts"]]
    if not any(rounds) or any(s is None for s in shares):
        return None
    return sum(s * n for s, n in zip(shares, rounds)) / sum(rounds)


def bench_table(result: dict) -> str:
    """bench.md: issue 9's goals, ratios to target-only per category, contenders, chain vs tree, pass cost
    vs width, the cost model's prediction, the other ratios, the greedy check and the machine."""
    s = result["settings"]
    head = (
        f"model={s.get('model')}, k={s['k']}, k_max={s.get('k_max')}, temperature={s['temperature']}, "
        f"max_new_tokens={s['max_new_tokens']}, repetitions={s['repetitions']}, prompts={len(s['prompts'])}"
    )
    lines = [head, "", (f"The default run drafts with {s.get('draft')}. Each contender is `python -m experiments.run` "
             "with the bench's command line and these overrides:"), ""]
    lines.append(markdown_table(
        ["contender", "method", "overrides"],
        [[name, f["method"], " ".join(f["overrides"]) or "(the default run)"] for name, f in result["contenders"].items()],
    ))  # fmt: skip
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
    goals = result.get("goals", {})

    def target(key: str) -> str:
        goal = goals.get(key)
        if goal is None:
            return ""
        relation = "= " if goal.get("target_for") == "greedy" else ">= "
        return relation + f"{goal['target']}" + (f" ({goal['target_for']})" if goal.get("target_for") else "")

    def met(key: str) -> str:
        flag = goals.get(key, {}).get("met")
        return "" if flag is None else "yes" if flag else "no"

    ratio_rows = [[key, value, target(key), met(key)] for key, value in result["ratios"].items()]
    if result.get("load"):
        load = result["load"]
        lines += ["", (f"Load scenario: {load['processes']} busy loop(s) from each process's start (loading, threads="
                       f"auto and calibration included) until {load['seconds']} s into its generation; one fresh "
                       "process per contender, every prompt once:"), "",
                  markdown_table(["contender", "tokens", "seconds", "tokens/s", "generation started (s)",
                                  "load stopped (s)", "plain steps"],
                                 [[name, r["tokens"], r["seconds"], r["tokens_per_second"], r["generation_started_s"],
                                   r["load_stopped_s"], load_plain_share(r)] for name, r in load["runs"].items()])]  # fmt: skip
    if result.get("pairwise"):
        lines += ["", "Pairwise (median tokens/s, ours over theirs):", "",
                  markdown_table(["ratio", "value"], [[k, v] for k, v in result["pairwise"].items()])]  # fmt: skip
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
