"""The benchmark's result -> bench.md: goals, ratios, contenders, chain vs tree, pass cost, cost model, machine; and
the tables of the scaling, batch and runtime studies.

Each section is a function of the result giving its lines (specdec.markdown.section: a sentence, a table)."""

from __future__ import annotations

from specdec.markdown import cell, document, section
from specdec.runtime.machine import machine_sentence
from specdec.runtime.study import plain_step_share

from .goals import AT_MOST, ISSUE_9, NOT_MEASURED


def bench_table(result: dict) -> str:
    """bench.md: the contenders, the goals, ratios to target-only per category, the contenders' figures, chain vs
    tree, pass cost vs width, the cost model's prediction, the load scenario, the other ratios, the greedy check
    and the costs."""
    sections = (head_section, failed_section, goals_section, vs_target_only_section, contenders_section, trees_section,
                pass_cost_section, cost_model_section, load_section, ratios_section, check_section, costs_section)
    return document([line for part in sections for line in part(result)])


def head_section(result: dict) -> list[str]:
    s = result["settings"]
    lines = [(f"model={s.get('model')}, k={s['k']}, k_max={s.get('k_max')}, temperature={s['temperature']}, "
              f"max_new_tokens={s['max_new_tokens']}, repetitions={s['repetitions']}, prompts={len(s['prompts'])}")]
    lines += section(f"The default run drafts with {s.get('draft')}. Each contender is "
                     "`python -m experiments.run` with the bench's command line and these overrides:",
                     ["contender", "method", "overrides"],
                     [[name, f["method"], " ".join(f["overrides"]) or "(the default run)"]
                      for name, f in result["contenders"].items()])  # fmt: skip
    if "calibration" in result:
        lines += ["", f"Draft calibration chose {result['calibration']['chosen']}: {result['calibration']['reason']}"]
    if "machine" in result:
        lines += ["", machine_sentence(result["machine"])]
    return lines


def goals_section(result: dict) -> list[str]:
    goals = result.get("goals", {})
    rows = [[key, g["value"], f">= {g['target']}", {True: "met", False: "not met", None: g.get("status", "-")}[g["met"]],
             g.get("contender") or "",
             g.get("against") if isinstance(g.get("against"), str) else " / ".join(g.get("against") or [])]
            for key, g in goals.items() if key in ISSUE_9]  # fmt: skip
    lines = section(None, ["goal", "value", "target", "met", "ours", "against"], rows)
    lookup = goals.get("vs_hf_prompt_lookup", {})
    if lookup.get("hf_best_fixed_k") is not None:
        lines += ["", f"Hugging Face prompt lookup's best fixed k: {lookup['hf_best_fixed_k']} "
                  f"({lookup['hf_best_fixed_k_contender']}); ours ({lookup.get('contender')}) against it: "
                  + cell(result["ratios"].get("vs_hf_prompt_lookup_best_fixed_k"))]  # fmt: skip
    return lines


def categories_of(result: dict) -> list[str]:
    return sorted(next(iter(result["contenders"].values()))["by_category"])


def vs_target_only_section(result: dict) -> list[str]:
    if "vs_target_only" not in result:
        return []
    categories = categories_of(result)
    rows = [[name, *(v["by_category"][cat] for cat in categories), v["geomean"], v["min_category"]]
            for name, v in result["vs_target_only"].items()]  # fmt: skip
    return section("Tokens/s over target-only (`ar`), per category (median over repetitions), geometric mean "
                   "and worst:",
                   ["contender", *categories, "geomean", "worst"], rows, "{:.2f}")


def contenders_section(result: dict) -> list[str]:
    rows = []
    for name, f in result["contenders"].items():
        t, st = f["tokens_per_second"], f.get("stats") or {}
        rss = result.get("memory", {}).get(name, {}).get("peak_rss_mb")
        ours = f.get("owner") != "llamacpp"  # llama.cpp runs none of our models: no forwards to clock
        rows.append([name, t["median"], t["min"], t["max"], f"{100 * f['model_forward_share']:.0f}%" if ours else "-",
                     " / ".join(f"{v:.2f}" for v in f["forwards_per_token"].values()) if ours else "-",
                     cell(st.get("mean_accepted_length"), "{:.2f}"), cell(st.get("alpha"), "{:.3f}"),
                     cell(rss, "{:.0f}")])  # fmt: skip
    columns = ["contender", "tok/s median", "min", "max", "time in model forwards", "target / draft forwards per token",
               "tokens per target pass", "alpha", "peak RSS (MB)"]  # fmt: skip
    categories = categories_of(result)
    by_category = [[name, *(f["by_category"][c]["median"] for c in categories)]
                   for name, f in result["contenders"].items()]  # fmt: skip
    return (section(None, columns, rows, "{:.1f}")
            + section(None, ["contender (tok/s)", *categories], by_category, "{:.1f}"))


def trees_section(result: dict) -> list[str]:
    trees = result.get("chain_vs_tree") or {}
    rows = [[d, e["pass_width"], shape, e[shape]["contender"], e[shape]["tokens_per_pass"],
             e[shape]["tokens_per_second"], cell(e[shape]["verify_ms_per_pass"], "{:.1f}")]
            for d, e in trees.items() for shape in ("chain", "tree")]  # fmt: skip
    columns = ["drafter", "pass width", "shape", "contender", "tokens per pass", "tok/s", "verify ms per pass"]
    return section("Chain vs tree at the same pass width:", columns, rows, "{:.2f}") if trees else []


def pass_cost_section(result: dict) -> list[str]:
    c = result["costs"]
    if "pass_ms_by_width" not in c:
        return []
    rows = [["ms", *c["pass_ms_by_width"].values()], ["/ one step", *c["pass_cost_by_width"].values()]]
    return section(f"Target pass cost vs width (tokens in the pass) at a {c['context_tokens']}-token "
                   "context:", ["width", *map(str, c["pass_ms_by_width"])], rows, "{:.2f}")


def cost_model_section(result: dict) -> list[str]:
    rows = [[name, v["predicted_tokens_per_second"], v["measured_tokens_per_second"], v["measured_over_predicted"],
             str(v["chosen_k_histogram"])] for name, v in (result.get("cost_model") or {}).items()]  # fmt: skip
    columns = ["contender", "predicted tok/s", "measured tok/s", "measured / predicted", "chosen k histogram"]
    return section('k="auto": the cost model\'s prediction over the rounds it predicted vs what they '
                   "measured:", columns, rows, "{:.2f}") if rows else []


def load_section(result: dict) -> list[str]:
    load = result.get("load")
    if not load:
        return []
    rows = [[name, r["tokens"], r["seconds"], r["tokens_per_second"], r["generation_started_s"], r["load_stopped_s"],
             plain_step_share(r)] for name, r in load["runs"].items()]  # fmt: skip
    columns = ["contender", "tokens", "seconds", "tokens/s", "generation started (s)", "load stopped (s)", "plain steps"]
    return section(f"Load scenario: {load['processes']} busy loop(s) from each process's start (loading, "
                   f"threads=auto and calibration included) until {load['seconds']} s into its generation; "
                   "one fresh process per contender, every prompt once:", columns, rows)  # fmt: skip


def goal_target(goal: dict | None, key: str) -> str:
    if goal is None:
        return ""
    relation = "= " if goal.get("target_for") == "greedy" else "<= " if key in AT_MOST else ">= "
    return relation + f"{goal['target']}" + (f" ({goal['target_for']})" if goal.get("target_for") else "")


def ratios_section(result: dict) -> list[str]:
    goals, pairwise = result.get("goals", {}), result.get("pairwise")
    lines = section("Pairwise (median tokens/s, ours over theirs):", ["ratio", "value"],
                    [[k, v] for k, v in pairwise.items()]) if pairwise else []  # fmt: skip
    rows = [[key, value, goal_target(goals.get(key), key), {None: "", True: "yes", False: "no"}[goals.get(key, {}).get("met")]]
            for key, value in result["ratios"].items()]  # fmt: skip
    return lines + section("Best configuration of ours (geometric mean over categories): "
                           f"{result.get('best_configuration')}",
                           ["ratio", "value", "target", "met"], rows)  # fmt: skip


def check_section(result: dict) -> list[str]:
    check = result.get("greedy_check")
    if check and check.get("skipped"):
        return ["", f"Output check skipped: {check['skipped']}"]
    if check:
        return ["", f"Greedy outputs identical across contenders: {check['identical']}"
                + ("" if check["identical"] else f" (mismatches: {check['mismatches']})")]  # fmt: skip
    return []


def costs_section(result: dict) -> list[str]:
    c = result["costs"]
    return ["", f"Costs at a {c['context_tokens']}-token context: target step {c['target_step_ms']:.1f} ms, "
            f"draft step {c['draft_step_ms']:.1f} ms (c = {c['c']:.3f}); target pass over k+1 tokens: "
            + ", ".join(f"k={kk}: {ms:.1f} ms" for kk, ms in c["target_verify_ms_by_k"].items())]  # fmt: skip


def failed_section(result: dict) -> list[str]:
    """bench.md's list of failed contenders: stage and error line."""
    failed = result.get("failed") or {}
    rows = [[name, f["stage"], f["error"].replace("|", "\\|")[:300]] for name, f in failed.items()]
    title = (f"Failed contenders ({len(failed)}): their figures are missing and the goals that needed them "
             f"are {NOT_MEASURED}.")
    return section(title, ["contender", "stage", "error"], rows) if failed else []


def batch_table(result: dict) -> str:
    """Throughput (tokens/s) and the ratio to the baseline by batch size, one row per contender."""
    sizes, c = result["sizes"], result["contenders"]
    by_size = ["contender", *[f"B={s}" for s in sizes]]
    rows = [[name, s, c[name][str(s)]["latency_s"], c[name][str(s)]["peak_rss_mb"], c[name][str(s)]["tokens_per_row_pass"],
             c[name][str(s)]["chosen_k_mean"], result["agreement"][name][str(s)]] for name in c for s in sizes]  # fmt: skip
    return document(
        section("### tokens/s (all rows) by batch size", by_size,
                [[name, *[c[name][str(s)]["tokens_per_second"] for s in sizes]] for name in c], "{:.1f}")
        + section("### ratio to target-only at the same batch size", by_size,
                  [[name, *[r[str(s)] for s in sizes]] for name, r in result["ratios"].items()], "{:.2f}")
        + section("### mean row latency (s), peak RSS (MB), tokens per row-pass, mean chosen k",
                  ["contender", "B", "latency_s", "peak_rss_mb", "tokens/row-pass", "k mean", "agreement"],
                  rows, "{:.2f}"))


def scaling_table(result: dict) -> str:
    goals = [[key, cell(g["value"]), g["target"], g["met"]] for key, g in result.get("goals", {}).items()]
    depths = [[d, r] for d, r in result.get("llamacpp", {}).get("tokens_per_s_at_depth", {}).items()]
    return document([line for key in ("by_max_new_tokens", "by_prompt_length")
                     for line in section(f"### {key}", list(result[key][0]),
                                         [list(r.values()) for r in result[key]], "{:.1f}")]
                    + (section("### llama.cpp F32, llama-bench", ["context tokens", "decode tokens/s"], depths, "{:.1f}")
                       if depths else [])
                    + section("### ratios", ["ratio", "value"], [[k, cell(v)] for k, v in result.get("ratios", {}).items()])
                    + (section("### goals", ["goal", "value", "target", "met"], goals) if goals else []))  # fmt: skip


def runtime_table(result: dict) -> str:
    profiles = result["profiles"]
    widths = list(next(iter(profiles.values()))["pass_cost"])
    header = ["profile", "step ms", "step / bound", *[f"w={w}" for w in widths], "target-only tok/s",
              "lookup k=3 tok/s", "compile s (cold / warm)"]
    rows = []
    for name, p in profiles.items():
        c = p.get("compile", {})
        compile_cell = " / ".join(f"{c[s]['seconds']:.0f}" if s in c else "-" for s in ("cold", "warm")) if c else "-"
        rows.append([name, p["pass_ms"][1], p["step_vs_memory_bound"], *[p["pass_cost"][w] for w in widths],
                     p["ar_tokens_per_s"], p["lookup_k3_tokens_per_s"], compile_cell])
    keys = [f"- {k}: {v:.3f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in result["keys"].items()]
    goals = [f"- goal {k}: {g['direction'].replace('_', ' ')} {g['target']}, "
             f"{'met' if g['met'] else 'not met' if g['met'] is False else 'not measured'}"
             for k, g in result["goals"].items()]
    title = (f"Memory bound: {result['memory_bound_ms']:.1f} ms ({result['read_gb_per_s']:.1f} GB/s); "
             f"Hugging Face plain generate {result['hf_plain_tokens_per_s']:.1f} tok/s. Pass cost: ms of a "
             "w-token pass over the step's.")
    return document(section(title, header, rows, "{:.2f}") + ["", *keys, *goals])
