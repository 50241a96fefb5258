"""The benchmark's batch study: throughput against batch size, speculative next to target-only at the same size.

python -m experiments.bench bench=batch

The bundled prompts, cycled to a multiple of the largest batch size so that every size decodes the same rows,
are grouped `size` at a time; each contender decodes every group (batch 1: one prompt per call, through the
single-sequence loop, exactly what a user at batch size 1 runs). Throughput is every row's new tokens over the
contender's wall time; latency is the mean, over rows, of the seconds from its batch's start to its last token.
Next to each speculative contender: the cost model's view (specdec.choose.cost.CostModel) of the batch, i.e. the k it chose
and the tokens per pass it measured. The sizes run in an order rotated between repetitions, so that a slow
phase of the machine does not fall on one size only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig

from specdec.markdown import markdown_table
from specdec.metrics import Generation
from specdec.runtime.machine import peak_memory

from ..records import machine, write_result
from ..run.prompts import Prompt
from .goals import goal_entries


def groups_of(ids: list[torch.Tensor], size: int) -> list[list[torch.Tensor]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def run_size(contender, ids: list[torch.Tensor], size: int, n: int, seed: int) -> dict:
    """One contender over every row at one batch size: tokens, wall seconds, latency, passes, the outputs."""
    tokens, latency, passes, row_passes, chosen, outputs = 0, [], 0, 0, [], []
    model = {"predicted_tokens": 0.0, "predicted_seconds": 0.0, "measured_tokens": 0.0, "measured_seconds": 0.0}
    with peak_memory(contender.setup.plan.device) as peak:
        started = time.perf_counter()
        for group in groups_of(ids, size):
            begun = time.perf_counter()
            if size == 1:
                out = contender.setup.generate(contender.method, group[0], n, seed)
                rows = [out.tokens]
                latency.append(time.perf_counter() - begun)
                stats = out.stats
                passes += stats.target_forwards
                row_passes += stats.target_forwards
            else:
                out: Generation = contender.setup.generate(contender.method, group, n, seed)
                rows = out.tokens
                latency += out.latency
                stats = out.stats
                passes += int(stats.extras.get("passes", 0))
                row_passes += stats.target_forwards
            tokens += sum(r.numel() for r in rows)
            chosen += list(stats.chosen_k)
            for key in model:
                model[key] += getattr(stats, key)
            outputs += [r.tolist() for r in rows]
        seconds = time.perf_counter() - started
    return {
        "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
        "latency_s": statistics.mean(latency), "passes": passes,
        "tokens_per_row_pass": tokens / row_passes if row_passes else None,
        "chosen_k_mean": statistics.mean(chosen) if chosen else None,
        "plain_step_share": statistics.mean([k == 0 for k in chosen]) if chosen else None,
        "peak_rss_mb": peak.rss_mb, "peak_cuda_mb": peak.cuda_mb, "outputs": outputs,
        # the cost model's expected tokens per second over the rounds it predicted, and what they measured
        "predicted_tokens_per_second": ratio(model["predicted_tokens"], model["predicted_seconds"]),
        "measured_tokens_per_second": ratio(model["measured_tokens"], model["measured_seconds"]),
    }  # fmt: skip


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def run_batching(
    contenders: dict, prompts: list[torch.Tensor], batching: DictConfig, *, max_new_tokens: int, seed: int = 0,
    repetitions: int = 1, log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Every contender at every batch size of `batching.sizes`; ratios of batching.speculative over
    batching.baseline at each size. prompts: (1, L) each."""
    sizes = list(batching.sizes)
    rows = [prompts[i % len(prompts)] for i in range(-(-len(prompts) // max(sizes)) * max(sizes))]
    for contender in contenders.values():  # warm-up: allocator, kernels, the calibration's caches
        contender.setup.generate(contender.method, rows[0], 8, seed)
        contender.setup.generate(contender.method, rows[:2], 8, seed)
    measured: dict[str, dict[int, list[dict]]] = {name: {s: [] for s in sizes} for name in contenders}
    for rep in range(repetitions):
        order = sizes[rep % len(sizes) :] + sizes[: rep % len(sizes)]
        for size in order:
            for name, contender in contenders.items():
                r = run_size(contender, rows, size, max_new_tokens, seed)
                measured[name][size].append(r)
                log(f"batch {size} {name}: {r['tokens_per_second']:.1f} tok/s, latency {r['latency_s']:.2f} s")
    result = {"sizes": sizes, "rows": len(rows), "contenders": {}}
    for name, by_size in measured.items():
        result["contenders"][name] = {str(s): summary_of(runs) for s, runs in by_size.items()}
    result["agreement"] = agreement_of(measured, batching.baseline, sizes)
    result["ratios"] = ratios_of(result["contenders"], batching, sizes)
    return result


def summary_of(runs: list[dict]) -> dict:
    """One size's repetitions: medians of the rates, the outputs of the first."""
    keep = {k: v for k, v in runs[0].items() if k != "outputs"}
    for key in ("tokens_per_second", "latency_s", "seconds"):
        keep[key] = statistics.median(r[key] for r in runs)
    keep["tokens_per_second_runs"] = [r["tokens_per_second"] for r in runs]
    keep["outputs"] = runs[0]["outputs"]
    return keep


def agreement_of(measured: dict, baseline: str, sizes: list[int]) -> dict:
    """Share of rows whose output equals the baseline's at batch 1 (greedy: exact methods give 1.0)."""
    reference = measured[baseline][sizes[0]][0]["outputs"]
    return {name: {str(s): statistics.mean(a == b for a, b in zip(runs[0]["outputs"], reference))
                   for s, runs in by_size.items()} for name, by_size in measured.items()}  # fmt: skip


def ratios_of(contenders: dict, batching: DictConfig, sizes: list[int]) -> dict:
    base = contenders[batching.baseline]
    out = {}
    for name in contenders:
        if name == batching.baseline:
            continue
        out[name] = {str(s): contenders[name][str(s)]["tokens_per_second"] / base[str(s)]["tokens_per_second"]
                     for s in sizes}  # fmt: skip
    return out


def batch_table(result: dict) -> str:
    """Throughput (tokens/s) and the ratio to the baseline by batch size, one row per contender."""
    sizes = result["sizes"]
    names = list(result["contenders"])
    lines = ["### tokens/s (all rows) by batch size", ""]
    rows = [[name, *[result["contenders"][name][str(s)]["tokens_per_second"] for s in sizes]] for name in names]
    lines += [markdown_table(["contender", *[f"B={s}" for s in sizes]], rows, fmt="{:.1f}"), ""]
    lines += ["### ratio to target-only at the same batch size", ""]
    rows = [[name, *[r[str(s)] for s in sizes]] for name, r in result["ratios"].items()]
    lines += [markdown_table(["contender", *[f"B={s}" for s in sizes]], rows, fmt="{:.2f}"), ""]
    lines += ["### mean row latency (s), peak RSS (MB), tokens per row-pass, mean chosen k", ""]
    rows = [[name, s, result["contenders"][name][str(s)]["latency_s"], result["contenders"][name][str(s)]["peak_rss_mb"],
             result["contenders"][name][str(s)]["tokens_per_row_pass"], result["contenders"][name][str(s)]["chosen_k_mean"],
             result["agreement"][name][str(s)]] for name in names for s in sizes]  # fmt: skip
    lines += [markdown_table(["contender", "B", "latency_s", "peak_rss_mb", "tokens/row-pass", "k mean", "agreement"],
                             rows, fmt="{:.2f}"), ""]  # fmt: skip
    return "\n".join(lines)


def batch_study(contenders: dict, prompts: list[Prompt], ids: dict, cfg: DictConfig, command: str, out: Path) -> dict:
    """bench=batch: throughput by batch size (experiments.bench.batch), with its goals."""
    b = cfg.bench
    result = run_batching(contenders, [ids[p.id] for p in prompts], b.batching, max_new_tokens=cfg.max_new_tokens,
                          seed=cfg.seed, repetitions=b.repetitions, log=lambda s: print(s, flush=True))  # fmt: skip
    first = next(iter(contenders.values())).setup
    env = machine(first.plan.device)
    speculative = result["ratios"][b.batching.speculative]
    result["batched_vs_target_only"] = speculative
    result["goals"] = goal_entries({"batched_min_vs_target_only": min(speculative.values()),
                                    "batched_b4_vs_target_only": speculative.get("4", float("nan"))},
                                   [f for f, on in env["cpu"]["flags"].items() if on], first.plan.greedy)  # fmt: skip
    result.update(settings={"model": cfg.model.name, "dataset": cfg.dataset.name, "max_new_tokens": cfg.max_new_tokens,
                            "baseline": b.batching.baseline, "speculative": b.batching.speculative,
                            "repetitions": b.repetitions,
                            "temperature": float(cfg.temperature), "contenders": {n: c.figures() for n, c in contenders.items()}},
                  machine=env, command=command)  # fmt: skip
    table = batch_table(result)
    write_result(out, "bench", result, table)
    print(table)
    return result
