"""The runtime study: what a target pass costs against its width, eager and compiled, next to the memory bound.
The measurements are specdec.runtime.study's (its docstring says what it measures); here the profiles of the config,
the end-to-end loops, the headline keys and the table.

python -m experiments.bench bench=runtime

The profiles: eager; compiled with inductor's default GEMMs; compiled with max_autotune's C++ GEMM template;
compiled with the linears on specdec's packed kernel, with a Python or a C++ wrapper; eager and autotuned on a
bfloat16 copy of the weights. End to end, greedy: our target-only loop and speculative decoding with prompt lookup
(k = 3, a 4-wide pass).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from specdec import GREEDY, NGramDrafter, autoregressive_generate, speculative_generate
from specdec.runtime.study import Loop, RuntimeProfile
from specdec.runtime.study import runtime_study as measure

from ..records import machine, markdown_table, write_result
from ..run.methods import Setup
from ..run.runtime import runtime_options
from .goals import runtime_goal_entries


def loops(n: int, eos: list[int]) -> dict[str, Loop]:
    """The end-to-end loops: our target-only loop (`ar`) and prompt lookup at k = 3 (`lookup_k3`), greedy."""
    return {
        "ar": lambda model, ids: autoregressive_generate(model, ids, sampling=GREEDY, max_new_tokens=n,
                                                         eos_token_id=eos).tokens,
        "lookup_k3": lambda model, ids: speculative_generate(model, NGramDrafter(), ids, k=3, sampling=GREEDY,
                                                             max_new_tokens=n, eos_token_id=eos).tokens,
    }  # fmt: skip


def profiles_of(study: DictConfig) -> dict[str, RuntimeProfile]:
    """The config's profiles: a runtime node each (conf/runtime/), compiled when its name says so."""
    return {name: RuntimeProfile(OmegaConf.to_container(p), p.get("dtype"),
                                 runtime_options(p).compile_settings() if p.name == "compiled" else None)
            for name, p in study.profiles.items()}  # fmt: skip


def run_runtime_study(model, prompts: list[torch.Tensor], study: DictConfig, *, n: int, eos: list[int]) -> dict:
    """specdec.runtime.study.runtime_study on the config's profiles, its headline keys and their goals."""
    result = measure(model, prompts, profiles_of(study), loops(n, eos), max_width=study.max_width,
                     repeats=study.repeats, n=n, eos=eos, log=print)
    keys = headline(result, study.report)
    return result | {"keys": keys, "goals": runtime_goal_entries(keys)}


def headline(result: dict, report: str) -> dict:
    """The issue's bench.json keys, for the reported profile (the run's compiled runtime) against eager."""
    p, eager = result["profiles"][report], result["profiles"]["eager"]
    cost = p["pass_cost"]
    compile_ = p.get("compile", {})
    return {
        "profile": report,
        "pass_cost_max_width_2_to_5": max(cost[w] for w in range(2, 6) if w in cost),
        "pass_cost_width_9": cost.get(9),
        "target_step_vs_memory_bound": p["step_vs_memory_bound"],
        "ar_vs_hf_plain": p["ar_tokens_per_s"] / result["hf_plain_tokens_per_s"],
        "ar_vs_eager_ar": p["ar_tokens_per_s"] / eager["ar_tokens_per_s"],
        "lookup_vs_target_only": p["lookup_k3_tokens_per_s"] / p["ar_tokens_per_s"],
        "lookup_vs_eager_target_only": p["lookup_k3_tokens_per_s"] / eager["ar_tokens_per_s"],
        "compile_seconds_cold": compile_.get("cold", {}).get("seconds"),
        "compile_seconds_warm": compile_.get("warm", {}).get("seconds"),
    }


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
    keys = "\n".join(f"- {k}: {v:.3f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in result["keys"].items())
    goals = "\n".join(f"- goal {k}: {g['direction'].replace('_', ' ')} {g['target']}, "
                      f"{'met' if g['met'] else 'not met' if g['met'] is False else 'not measured'}"
                      for k, g in result["goals"].items())
    return "\n".join([
        (f"Memory bound: {result['memory_bound_ms']:.1f} ms ({result['read_gb_per_s']:.1f} GB/s); Hugging Face plain "
        f"generate {result['hf_plain_tokens_per_s']:.1f} tok/s. Pass cost: ms of a w-token pass over the step's."), "",
        markdown_table(header, rows, fmt="{:.2f}"), "", keys, goals, ""])


def fresh_inductor_cache() -> str:
    """An empty inductor disk cache for this study (so that 'cold' is cold); returns its folder."""
    folder = tempfile.mkdtemp(prefix="specdec-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


def remove_cache(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def runtime_study(setup: Setup, prompts: list[torch.Tensor], cfg: DictConfig, command: str, out: Path) -> dict:
    """bench=runtime: pass costs eager and compiled (experiments/bench/runtime.py), in an empty inductor cache."""
    folder = fresh_inductor_cache()
    try:
        result = run_runtime_study(setup.pair.target, prompts, cfg.bench.runtime_study, n=cfg.max_new_tokens,
                                   eos=setup.pair.eos_token_id)
    finally:
        remove_cache(folder)
    result.update(machine=machine(setup.plan.device), command=command)
    table = runtime_table(result)
    write_result(out, "runtime", result, table)
    print(table)
    return result
