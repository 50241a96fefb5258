"""The benchmark's batch study: throughput against batch size, speculative next to target-only at the same size
(measured by specdec.runtime.study.batch_study), with its goals and tables.

python -m experiments.bench bench=batch

The bundled prompts are cycled so that every size decodes the same rows; each contender decodes every group (batch
1 through the single-sequence loop, exactly what a user at batch size 1 runs). Throughput is every row's new tokens
over the contender's wall time; latency is the mean, over rows, of the seconds from its batch's start to its last
token. Next to each speculative contender: the cost model's view (specdec.choose.cost.CostModel) of the batch, i.e.
the k it chose and the tokens per pass it measured.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from specdec.runtime.study import batch_study as measure

from ..records import machine, markdown_table, peak_memory, write_result
from ..run.prompts import Prompt
from .goals import goal_entries


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
    first = next(iter(contenders.values())).setup
    generate = {name: (lambda ids, n, seed, c=c: c.setup.generate(c.method, ids, n, seed)) for name, c in contenders.items()}
    result = measure(generate, [ids[p.id] for p in prompts], list(b.batching.sizes), b.batching.baseline,
                     max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, repetitions=b.repetitions,
                     peak=lambda: peak_memory(first.plan.device), log=lambda s: print(s, flush=True))  # fmt: skip
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
