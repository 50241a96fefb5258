"""The bench's studies, each measured by specdec.runtime.study; here the config mapped to it, goals, and the
result written (tables: experiments.bench.table).

- `bench=scaling` / `bench=context`: ms per token vs max_new_tokens and prompt length (scaling_study), and
  llama-bench at the same depths where llama.cpp is built (specdec.llamacpp).
- `bench=batch`: throughput and row latency against batch size, speculative next to target-only at the same size
  (batch_study), with the k the cost model chose for each batch and the tokens per pass it measured.
- `bench=runtime`: a target pass's cost against its width, eager and compiled (conf/bench/runtime.yaml's profiles),
  next to the memory bound, in an empty inductor cache (runtime_study); end to end, target-only and prompt lookup.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from specdec import GREEDY, NGramDrafter, autoregressive_generate, speculative_generate
from specdec.llamacpp import llamacpp_depths
from specdec.prompts import Prompt
from specdec.runtime.machine import cpu_flags, peak_memory
from specdec.runtime.study import (
    Loop,
    RuntimeProfile,
    batch_study,
    context_ratios,
    runtime_keys,
    runtime_study,
    scaling_study,
)

from ..records import machine, write_result
from ..run.methods import Setup
from ..run.settings import runtime_options
from .goals import goal_entries, runtime_goal_entries
from .table import batch_table, runtime_table, scaling_table


def run_scaling(contenders: dict, prompt: torch.Tensor, cfg: DictConfig, command: str, out: Path) -> dict:
    """bench=scaling: specdec.runtime.study.scaling_study of the contenders (end tokens ignored) after prompt (1, L)."""
    runs = {name: (lambda ids, n, s, c=c: c.run(ids, n, s, stop_at_eos=False)) for name, c in contenders.items()}
    first, scaling = next(iter(contenders.values())).setup, cfg.bench.scaling
    result = scaling_study(runs, first.pair.target, prompt, list(scaling.lengths), list(scaling.prompt_lengths),
                           cfg.seed, print)
    result.update(machine=machine(first.plan.device), command=command)
    if scaling.get("llamacpp"):  # llama-bench's decoding rate at the same depths (llama.cpp's threads), where built
        result["llamacpp"] = llamacpp_depths(first.pair.target.name_or_path, scaling.prompt_lengths, cfg.llamacpp.threads)
    result["ratios"] = context_ratios(result["by_prompt_length"], result.get("llamacpp", {}).get("tokens_per_s_at_depth"))
    result["goals"] = goal_entries(result["ratios"], cpu_flags(result["machine"]))
    write_result(out, "scaling", result, scaling_table(result))
    return result


def run_batching(contenders: dict, prompts: list[Prompt], ids: dict, cfg: DictConfig, command: str, out: Path) -> dict:
    """bench=batch: throughput by batch size (batch_study), with its goals."""
    b = cfg.bench
    first = next(iter(contenders.values())).setup
    generate = {name: (lambda ids, n, seed, c=c: c.setup.generate(c.method, ids, n, seed)) for name, c in contenders.items()}
    result = batch_study(generate, [ids[p.id] for p in prompts], list(b.batching.sizes), b.batching.baseline,
                         max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, repetitions=b.repetitions,
                         peak=lambda: peak_memory(first.plan.device), log=lambda s: print(s, flush=True))  # fmt: skip
    env = machine(first.plan.device)
    speculative = result["ratios"][b.batching.speculative]
    result["batched_vs_target_only"] = speculative
    result["goals"] = goal_entries({"batched_min_vs_target_only": min(speculative.values()),
                                    "batched_b4_vs_target_only": speculative.get("4", float("nan"))},
                                   cpu_flags(env), first.plan.greedy)  # fmt: skip
    result.update(settings={"model": cfg.model.name, "dataset": cfg.dataset.name, "max_new_tokens": cfg.max_new_tokens,
                            "baseline": b.batching.baseline, "speculative": b.batching.speculative,
                            "repetitions": b.repetitions,
                            "temperature": float(cfg.temperature), "contenders": {n: c.figures() for n, c in contenders.items()}},
                  machine=env, command=command)  # fmt: skip
    table = batch_table(result)
    write_result(out, "bench", result, table)
    print(table)
    return result


def loops(n: int, eos: list[int]) -> dict[str, Loop]:
    """The end-to-end loops: our target-only loop (`ar`) and prompt lookup at k = 3 (`lookup_k3`), greedy."""
    common = {"sampling": GREEDY, "max_new_tokens": n, "eos_token_id": eos}
    return {"ar": lambda model, ids: autoregressive_generate(model, ids, **common).tokens,
            "lookup_k3": lambda model, ids: speculative_generate(model, NGramDrafter(), ids, k=3, **common).tokens}


def profiles_of(study: DictConfig) -> dict[str, RuntimeProfile]:
    """The config's profiles: a runtime node each (conf/runtime/), compiled when its name says so."""
    return {name: RuntimeProfile(OmegaConf.to_container(p), p.get("dtype"),
                                 runtime_options(p).compile_settings() if p.name == "compiled" else None)
            for name, p in study.profiles.items()}  # fmt: skip


def run_runtime(setup: Setup, prompts: list[torch.Tensor], cfg: DictConfig, command: str, out: Path) -> dict:
    """bench=runtime: specdec.runtime.study.runtime_study on the config's profiles in an empty inductor disk cache (so
    that 'cold' is cold), its headline keys and their goals."""
    study, n, eos = cfg.bench.runtime_study, cfg.max_new_tokens, setup.pair.eos_token_id
    folder = tempfile.mkdtemp(prefix="specdec-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    try:
        result = runtime_study(setup.pair.target, prompts, profiles_of(study), loops(n, eos), max_width=study.max_width,
                               repeats=study.repeats, n=n, eos=eos, log=print)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    keys = runtime_keys(result, study.report)
    result.update(keys=keys, goals=runtime_goal_entries(keys), machine=machine(setup.plan.device), command=command)
    table = runtime_table(result)
    write_result(out, "runtime", result, table)
    print(table)
    return result
