"""Side-by-side benchmark, a Hydra app over the run's own config groups (conf/bench.yaml, conf/bench/).

A contender is a configuration experiments.run runs: a list of its overrides on top of the bench's
command line, and the configuration's one method (ours, or method=hf: Hugging Face generate). So any
configuration that runs can be benchmarked by naming it, and the default run's own configuration
(`default: []`) is always a contender. Every contender gets the same prompts, sampling, max_new_tokens
and seeds; the pairs share one target (experiments.run.pair.Pairs). Every repetition runs every prompt
through every contender, in an order rotated per repetition, so machine drift hits all alike; one
warm-up pass is excluded. Ratios are per category (median over repetitions), their geometric mean over
categories, checked against experiments.bench.goals. At temperature > 0 the outputs are samples, so the greedy
equality check is skipped (bench.json says so). The load scenario (bench.load): experiments.bench.processes.

    python -m experiments.bench                           # offline pair, every category, greedy, 128 tokens
    python -m experiments.bench temperature=1             # the same table at temperature 1
    python -m experiments.bench bench.only=[ar,spec_ngram] +bench.contenders.mine='["model=smollm2_ngram","k=6"]'
    python -m experiments.bench bench=scaling             # time per token vs max_new_tokens and prompt length
    python -m experiments.bench bench=gpu                 # random-weight Llama-3 shapes on a CUDA device
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specdec.comparison import contender_figures, pairwise
from specdec.llamacpp import engine
from specdec.runtime.machine import cpu_flags
from specdec.runtime.models import encode_prompt
from specdec.runtime.study import ClockedRun, ForwardClock, interleaved_runs, pass_costs

from ..records import machine, write_json, write_result
from ..run.pair import Pairs
from ..run.prompts import Prompt, load_prompts
from ..run.settings import CONF_DIR
from .contenders import DEFAULT, Contender, Failures, check_bench, contenders_of
from .goals import ISSUE_9, annotate_goals, goal_entries, mark_not_measured
from .processes import load_run_of, memory_of, run_load_of, run_memory_of
from .ratios import output_check, ratios
from .studies import run_batching, run_runtime, run_scaling
from .table import bench_table


def run_bench(contenders: dict[str, Contender], prompts: list[Prompt], ids: dict[str, torch.Tensor], *, max_new_tokens: int,
              repetitions: int = 1, seed: int = 0, pass_widths: int = 17, reference: str = "ar",
              pairs: dict[str, list[str]] | None = None, agreements: dict[str, str] | None = None,
              log: Callable[[str], None] = lambda s: None, load: dict | None = None, failures: Failures | None = None, out: Path | None = None) -> dict:  # fmt: skip
    """Interleaved repetitions of every contender on every prompt (ids: prompt id -> (1, L)), clocked inside each
    model (specdec.runtime.study.interleaved_runs); bench.json. failures: contenders that raised (while built, or
    here: it then runs no more); out: where each contender's figures are written as soon as it finished
    (out/contenders/<name>.json)."""
    failures = failures or Failures(log)
    default = contenders[DEFAULT].setup
    pairs_of = [c.setup.pair for c in contenders.values()]  # a contender with settings of its own loads its models
    targets, drafts = ({id(m): m for m in ms if m is not None} for ms in ([p.target for p in pairs_of], [p.draft_model for p in pairs_of]))
    models = {**{f"target{i or ''}": m for i, m in enumerate(targets.values())}, **{f"draft{i or ''}": m for i, m in enumerate(drafts.values())}}
    clock = ForwardClock(models)

    def finished(name: str, runs: dict[str, list[ClockedRun]]) -> None:  # its figures, as soon as it has run everything
        if out is not None:
            write_json(out / "contenders" / f"{name}.json", {**contenders[name].figures(), **contender_figures(runs, prompts)})

    runs = interleaved_runs({name: c.run for name, c in contenders.items()}, {p.id: ids[p.id] for p in prompts},
                            max_new_tokens, repetitions, seed, clock, failures.attempt, finished, log)
    clock.remove()
    runs = {name: runs[name] for name in contenders if name not in failures.failed}  # a contender that raised: no more
    if not runs:
        raise RuntimeError(f"every contender failed: {failures.failed}")
    plan = default.plan
    s = plan.sampling
    result = {
        "settings": {
            "k": plan.k, "k_max": plan.k_max, "max_nodes": plan.max_nodes, "temperature": s.temperature,
            "top_k": s.top_k, "top_p": s.top_p, "max_new_tokens": max_new_tokens, "repetitions": repetitions,
            "seed": seed, "eos_token_id": default.pair.eos_token_id, "prompts": [p.id for p in prompts],
            "draft": default.pair.draft,
        },
        "contenders": {name: {**contenders[name].figures(), **contender_figures(runs[name], prompts)} for name in runs},
        "failed": failures.failed,
    }
    result.update({"load": load} if load is not None else {})
    result["greedy_check"] = output_check(runs, s, reference)
    log("measuring the target's pass cost vs width")
    k = plan.k if isinstance(plan.k, int) else 4
    result["costs"] = pass_costs(default.pair.target, default.pair.draft_model, ids[prompts[0].id], k, pass_widths)
    result["ratios"], result["best_configuration"] = ratios(result)
    result["pairwise"] = pairwise(result["contenders"], pairs or {})
    present = cpu_flags(machine(plan.device))
    agreed = result["greedy_check"].get("agreement", {})  # bench.agreements: {key: contender}, its agreement
    measured = {**result["ratios"], **result["pairwise"], **{k: agreed[n] for k, n in (agreements or {}).items() if n in agreed}}
    result["goals"] = goal_entries(measured, present, s.greedy)
    mark_not_measured(result["goals"], failures.failed, present, s.greedy, ISSUE_9)
    annotate_goals(result["goals"], result["best"], k, result["contenders"])
    calibration = default.pair.calibration
    if calibration is not None:  # the default pair's calibration: what it measured and chose
        result["calibration"] = {"chosen": calibration.chosen, "reason": calibration.reason, "candidates": calibration.rows()}
    return result


def command_line() -> tuple[list[str], str]:
    """The command line's overrides (bench.* and hydra.* left out: they configure the bench, not the runs)
    and the command itself."""
    task = list(HydraConfig.get().overrides.task)
    base = [o for o in task if not o.lstrip("+~").startswith(("bench.", "hydra."))]
    return base, "python -m experiments.bench " + " ".join(task)


def selected(b: DictConfig) -> list[str] | None:
    """Contenders to build (None: all): the runtime study's reference; a memory/load run's; a study's; else bench.only."""
    study = b.scaling or b.get("batching")
    if b.get("runtime_study"):
        return [b.reference]
    if b.memory_of or b.load_of:
        return [b.memory_of or b.load_of]
    return list(study.contenders) if study else b.only and [DEFAULT, *b.only]


def bench(cfg: DictConfig) -> dict:
    """The benchmark the bench group describes: the comparison, the scaling study, or one memory run."""
    base, command = command_line()
    out = Path(HydraConfig.get().runtime.output_dir)
    b = cfg.bench
    check_bench(b)
    started = time.perf_counter()
    one = b.memory_of or b.load_of
    study = b.scaling or b.get("batching")
    failures = None if one or study or b.get("runtime_study") else Failures(lambda s: print(s, flush=True))  # comparison
    contenders = contenders_of(cfg, base, Pairs(), selected(b), failures)
    first = next(iter(contenders.values())).setup
    prompts = load_prompts(cfg.dataset)
    ids = {p.id: encode_prompt(first.pair.tokenizer, p.text, chat=first.plan.chat) for p in prompts}
    if b.memory_of:
        print(json.dumps(run_memory_of(contenders[b.memory_of], ids[prompts[0].id], cfg.max_new_tokens, cfg.seed)))
        return {}
    if b.load_of:
        print(json.dumps(run_load_of(contenders[b.load_of], prompts, ids, cfg.max_new_tokens, cfg.seed, started)))
        return {}
    print(f"writing to {out}", flush=True)
    if b.scaling:
        return run_scaling(contenders, ids[prompts[0].id], cfg, command, out)
    if b.get("batching"):
        return run_batching(contenders, prompts, ids, cfg, command, out)
    if b.get("runtime_study"):
        return run_runtime(contenders[b.reference].setup, [ids[p.id] for p in prompts], cfg, command, out)
    default = contenders[DEFAULT].setup
    load = None
    if b.load:  # before the comparison, which then runs on a quiet machine again
        print(f"load scenario: {b.load.processes} busy loop(s) until {b.load.seconds} s into generation", flush=True)
        overrides = [*base, *b.load.get("overrides", [])]
        load = {"seconds": b.load.seconds, "processes": b.load.processes, "overrides": list(b.load.get("overrides", [])),
                "runs": {name: load_run_of(name, overrides, out, b.load.seconds, b.load.processes)
                         for name in b.load.contenders}}  # fmt: skip
    result = run_bench(
        contenders, prompts, ids, max_new_tokens=cfg.max_new_tokens, repetitions=b.repetitions, seed=cfg.seed,
        pass_widths=b.pass_widths, reference=b.reference, pairs=b.pairwise, agreements=b.get("agreements"),
        log=lambda s: print(s, flush=True), load=load, failures=failures, out=out,
    )  # fmt: skip
    result["settings"].update(model=cfg.model.name, dataset=cfg.dataset.name)
    if b.memory:
        result["memory"] = {name: memory_of(name, base, out) for name in result["contenders"]}
    result.update(machine=machine(default.plan.device), command=command)
    owners = {c["owner"] for c in result["contenders"].values()}
    result.update({"llamacpp": engine().record()} if "llamacpp" in owners else {})  # the build: version, options
    table = bench_table(result)
    write_result(out, "bench", result, table)
    print(table)
    if result["failed"]:
        raise SystemExit(f"bench.json is complete without the failed contenders: {', '.join(result['failed'])}")
    return result


@hydra.main(config_path=str(CONF_DIR), config_name="bench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        bench(cfg)
    except ValueError as e:  # a ConfigError, or an input the library refuses (its message names the fix)
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)

