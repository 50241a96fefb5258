"""Per-prompt rows -> per-method table, run metrics with stable names, the theory they meet, what the run chose, and
summary.md.

Notation of Leviathan et al.: alpha = expected acceptance of one draft token, k = gamma draft tokens per round, c =
cost of one draft step / cost of one target step. A round is one target pass; its accepted depth is the number of
draft tokens it accepted (the depth of the accepted path of a tree, the accepted prefix of a chain).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from specdec.auto.calibration import Calibration
from specdec.auto.runtime import runtimes_json, runtimes_markdown
from specdec.markdown import cell, markdown_table
from specdec.metrics import Stats, ratio, round_statistics, theory_check
from specdec.runtime.compiled import CompiledForward
from specdec.runtime.machine import machine_sentence
from specdec.runtime.probes import ThreadChoice

from ..records import pd, strict_json, write_result
from .settings import BASELINE

TABLE_COLUMNS = {  # column -> how the markdown table prints it
    "prompts": "{:.0f}", "new_tokens": "{:.0f}", "latency_s": "{:.2f}", "tokens_per_second": "{:.2f}",
    "speedup": "{:.2f}", "decode_tokens_per_second": "{:.2f}", "acceptance_rate": "{:.3f}", "mean_accepted_length": "{:.2f}", "alpha": "{:.3f}",
    "nll_per_token": "{:.3f}", "agreement": "{:.3f}", "distinct_2": "{:.3f}", "repetition_4": "{:.3f}",
    "article_log_likelihood": "{:.4f}", "weights_mb": "{:.0f}", "peak_rss_mb": "{:.0f}", "peak_cuda_mb": "{:.0f}",
}  # fmt: skip
PER_METHOD = {  # run metric <name>/<method> -> its method table column
    "tokens_per_second": "tokens_per_second", "latency_s": "latency_s", "peak_memory_mb": "peak_rss_mb",
    "cuda_peak_memory_mb": "peak_cuda_mb", **{c: c for c in ("weights_mb", "nll_per_token", "agreement",
                                                             "distinct_2", "repetition_4", "decode_tokens_per_second")},
}  # fmt: skip


def wall_seconds(rows: pd.DataFrame) -> float:
    """Seconds the method ran: each prompt's own, or each batch's wall time once (batch_size > 1)."""
    if "batch_seconds" in rows and rows["batch_seconds"].notna().any():
        return float(rows.drop_duplicates("batch")["batch_seconds"].sum())
    return float(rows["seconds_total"].sum())


def method_row(method: str, rows: pd.DataFrame) -> dict[str, float]:
    """One method's prompts: tokens/s over all their time and after the prefill (decode), quality as a mean."""
    speculative, prefill = rows["drafted"].sum() > 0, rows.get("seconds_prefill", math.nan)
    return {
        "prompts": len(rows),
        "new_tokens": rows["emitted"].sum(),
        "latency_s": rows["seconds_total"].mean(),  # per row: to its last token (a batch's rows end apart)
        "tokens_per_second": ratio(rows["emitted"].sum(), wall_seconds(rows)),  # throughput over every row
        "decode_tokens_per_second": ratio(rows["emitted"].sum(), (rows["seconds_total"] - prefill).sum()),
        "acceptance_rate": ratio(rows["accepted"].sum(), rows["drafted"].sum()) if speculative else math.nan,
        "mean_accepted_length": ratio(rows["emitted"].sum(), rows["target_forwards"].sum())
        if speculative or method == BASELINE else math.nan,
        "alpha": ratio(rows["overlap_sum"].sum(), rows["overlap_count"].sum()) if speculative else math.nan,
        "nll_per_token": rows["nll"].mean(),
        **rows[["agreement", "distinct_2", "repetition_4"]].mean(),
        "article_log_likelihood": rows.get("article_log_likelihood", pd.Series([math.nan])).mean(),
        **rows[["weights_mb", "peak_rss_mb", "peak_cuda_mb"]].max(),
    }  # fmt: skip


def method_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per method (baseline first) with throughput, speedup, acceptance, quality and memory."""
    order = [m for m in ("autoregressive", "speculative", "naive", "hf") if m in set(rows["method"])]
    table = pd.DataFrame({m: method_row(m, rows[rows["method"] == m]) for m in order}).T
    table.index.name = "method"
    base = table.loc[BASELINE, "tokens_per_second"] if BASELINE in table.index else math.nan
    table.insert(4, "speedup", table["tokens_per_second"] / base)
    return table


def stats_of(rows: pd.DataFrame) -> list[Stats]:
    """The rows' statistics back as the library's Stats (Stats.from_row)."""
    return [Stats.from_row(row) for row in rows.to_dict("records")]


def run_metrics(table: pd.DataFrame, rows: pd.DataFrame, k: int | None, longest: int) -> tuple[dict, dict]:
    """Flat metrics with the same names in every run, so W&B groups a sweep in one dashboard, and the
    histograms of the speculative rounds. k: the fixed chain length Thm 3.8 is checked at (None for
    k=auto and trees); longest: the longest draft (k, k_max or the tree depth)."""
    metrics: dict[str, float] = {}
    if "speculative" in table.index:
        metrics.update(table.loc["speculative", ["acceptance_rate", "mean_accepted_length", "alpha", "speedup"]])
        if k is not None:  # Thm 3.8 against the measured alpha, c and k (specdec.metrics.theory_check)
            metrics.update(theory_check(stats_of(rows[rows["method"] == BASELINE]),
                                        stats_of(rows[rows["method"] == "speculative"]), k))
    if "naive" in table.index:
        metrics["speedup/naive"] = table.loc["naive", "speedup"]
        metrics["article_log_likelihood"] = table.loc["naive", "article_log_likelihood"]
    for method, row in table.iterrows():
        metrics.update({f"{name}/{method}": row[column] for name, column in PER_METHOD.items()})
    for method in ("autoregressive", "speculative"):
        if method in table.index:
            done = rows[rows["method"] == method]
            metrics[f"tokens_per_pass/{method}"] = ratio(done["emitted"].sum(), done["target_forwards"].sum())
    rounds, histograms = round_statistics(stats_of(rows[rows["method"] == "speculative"]), longest)
    metrics.update(rounds)
    return {key: float(value) for key, value in metrics.items()}, histograms


def naive_sentence(table: pd.DataFrame, greedy: bool) -> str:
    """A plain sentence on how far the naive method's outputs are from the target's."""
    if "naive" not in table.index:
        return "The naive method did not run (method or pair without a draft model)."
    base, naive = table.loc[BASELINE], table.loc["naive"]
    gap = naive["nll_per_token"] - base["nll_per_token"]
    sentence = (
        f"The naive method (draft-then-score) returns the draft model's text unchanged: the target assigns it "
        f"{naive['nll_per_token']:.3f} nats per token against {base['nll_per_token']:.3f} for its own output "
        f"({gap:+.3f} nats, {math.exp(gap):.2f}x the perplexity)"
    )
    if greedy:
        sentence += f", and only {naive['agreement']:.0%} of its tokens match the target's greedy output"
        if "speculative" in table.index:
            sentence += f" (speculative decoding: {table.loc['speculative', 'agreement']:.0%})"
    return sentence + "."


def rounding_sentence(rows: pd.DataFrame, greedy: bool) -> str:
    """Where greedy speculative output parted from target-only's (the first token, over the prompts), and why: the
    target's logits at a position differ in their last bits between a one-token step and a wider pass (kernels that
    are not batch-invariant: bf16, a quantized target), so a near-tie can flip. Empty when every output is identical."""
    if not greedy or "parted_at" not in rows:
        return ""
    ours = rows[~rows["method"].isin([BASELINE, "naive"])]
    parted = ours[ours["parted_at"].notna()]
    if parted.empty:
        return ""
    first = parted.loc[parted["parted_at"].idxmin()]
    return (f" Greedy {first['method']} output parted from target-only's on {len(parted)} of {len(ours)} outputs, "
            f"first at token {int(first['parted_at'])} of prompt {first['prompt_id']}: the target "
            f"({first['dtype']}, quantization {first['target_quantization']}) rounds a position's logits differently "
            f"in a one-token step and in a pass of several tokens, so a near-tie can flip. That is rounding, not the "
            f"acceptance rule, which keeps the distribution the verification pass computes.")


def method_markdown(table: pd.DataFrame) -> str:
    """The method table as a GitHub markdown table (NaN printed as a dash)."""
    columns = [c for c in TABLE_COLUMNS if c in table.columns and table[c].notna().any()]
    rows = [[method, *(cell(float(row[c]), TABLE_COLUMNS[c]) for c in columns)] for method, row in table.iterrows()]
    return markdown_table(["method", *columns], rows)


def listed_shares(metrics: dict[str, float], prefix: str, unit: str = "") -> str:
    """The shares of one prefix as a sentence's list, largest first ("dynamic_int8 60%, nf4 8%")."""
    found = {key.split("/", 1)[1]: v for key, v in metrics.items() if key.startswith(prefix + "/")}
    return ", ".join(f"{name}{unit} {100 * v:.0f}%" for name, v in sorted(found.items(), key=lambda x: -x[1]))


def rounds_markdown(metrics: dict[str, float], histograms: dict[str, list[int]]) -> str:
    """What the speculative rounds did, in sentences (empty when the method did not run)."""
    if "rounds" not in metrics:
        return ""

    def listed(name: str) -> str:
        return ", ".join(f"{value}: {n}" for value, n in enumerate(histograms[name]))

    lines = [(f"Speculative rounds (target passes): {metrics['rounds']:.0f}, {metrics['tokens_per_pass/speculative']:.2f}"
              f" tokens per target pass (target-only: {metrics.get('tokens_per_pass/autoregressive', math.nan):.2f}).")]
    lines.append(f"Accepted depth (draft tokens accepted per round): mean {metrics['accepted_depth_mean']:.2f}; "
                 f"rounds by depth {listed('accepted_depth')}.")  # fmt: skip
    if "chosen_k" in histograms:
        lines.append(f"Chosen k: mean {metrics['chosen_k_mean']:.2f}; rounds by k {listed('chosen_k')}.")
        lines.append(f"Plain target steps (no draft): {100 * metrics['plain_step_share']:.0f}% of the rounds (the "
                     "last round of a budget, where no draft token fits, included).")  # fmt: skip
    threads, drafts = listed_shares(metrics, "threads_share", " threads"), listed_shares(metrics, "draft_share")
    if threads:
        lines.append(f"Torch thread count chosen each round (threads=auto): {threads} of the rounds.")
    if drafts:
        lines.append(f"Draft chosen each round (k=auto over the calibrated candidates, specdec.choose.online): {drafts} "
                     "of the rounds (figures/decisions.png: the choices over the run).")  # fmt: skip
    if "tree_nodes_mean" in metrics:
        lines.append(f"Tree size: {metrics['tree_nodes_mean']:.2f} nodes per pass, depth {metrics['tree_depth_mean']:.2f}.")
    if "predicted_tokens_per_second" in metrics:
        lines.append(f"Cost model over the rounds it predicted: {metrics['predicted_tokens_per_second']:.1f} tokens/s "
                     f"predicted, {metrics['measured_tokens_per_second']:.1f} measured "
                     f"(ratio {metrics['predicted_over_measured']:.2f}).")  # fmt: skip
    return "\n".join(lines) + "\n\n"


def write_summary(run_dir: Path, keys: dict, table: pd.DataFrame, metrics: dict, histograms: dict[str, list[int]],
                  sentence: str, done: int) -> str:  # fmt: skip
    """summary.md (printed too), summary.csv and summary.json (what the report reads)."""
    theory = "" if "c" not in metrics else (
            f"Theory (Leviathan Thm 3.8) for the measured alpha {metrics['alpha']:.3f}, c {metrics['c']:.3f} "
            f"and k {keys['k']}: speedup {metrics['theoretical_speedup']:.2f}x (measured "
            f"{metrics['speedup']:.2f}x; optimal k {metrics['optimal_k']:.0f}). A verification pass cost "
            f"{metrics['verify_cost']:.2f} target decode steps here (the theory assumes 1); with that pass cost "
            f"the theorem predicts {metrics['theoretical_speedup_with_verify_cost']:.2f}x.\n\n"
        )
    settings = ", ".join(f"{key}={value}" for key, value in keys.items())
    env = json.loads((run_dir / "environment.json").read_text())
    text = (f"# Summary\n\n{settings}; prompts finished: {done}\n\n{machine_sentence(env)}\n\n"
            f"{method_markdown(table)}\n\n{rounds_markdown(metrics, histograms)}{theory}{sentence}\n")  # fmt: skip
    choices = {}  # threads=auto's choice, the calibrated draft's and the compiled runtime's, and why (write_choices)
    for name in ("threads", "calibration", "runtime"):
        if (run_dir / f"{name}.json").exists():
            text += f"\n{(run_dir / f'{name}.md').read_text()}"
            choices[name] = json.loads((run_dir / f"{name}.json").read_text())
    (run_dir / "summary.md").write_text(text)
    table.to_csv(run_dir / "summary.csv")
    summary = {"config": keys, "metrics": {k: strict_json(v) for k, v in metrics.items()},
               "histograms": histograms,  # name -> rounds per value 0, 1, ... (chosen_k, accepted_depth)
               "prompts_done": done, "machine": {"cpu": env["cpu"], "bitsandbytes_cpu": env["bitsandbytes_cpu"]},
               **choices}  # fmt: skip
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return text


def write_choices(run_dir: Path, threads: ThreadChoice | None, calibration: Calibration | None) -> None:
    """threads.md / .json when threads=auto chose the thread count; calibration.md / .json when the pair's draft was
    calibrated."""
    if threads is not None:
        write_result(run_dir, "threads", asdict(threads), threads.markdown())
    if calibration is not None:
        write_result(run_dir, "calibration", calibration.to_json(), calibration.markdown())


def write_runtime(run_dir: Path, runtimes: dict[str, CompiledForward]) -> None:
    """runtime.md / .json when models ran on the compiled runtime (after the run: graphs compile at first use)."""
    if runtimes:
        write_result(run_dir, "runtime", runtimes_json(runtimes), runtimes_markdown(runtimes))
