"""The runtime study: what a target pass costs against its width, eager and compiled, next to the memory bound.
The measurements are specdec.runtime.study's; here the profiles of the config, the end-to-end runs, the table.

python -m experiments.bench bench=runtime

For each runtime profile (eager; compiled with inductor's default GEMMs; compiled with max_autotune's C++ GEMM
template; compiled with the linears on specdec's packed kernel, with a Python or a C++ wrapper; eager and autotuned
on a bfloat16 copy of the weights) on the pair's target, in one process, so that every
ratio compares timings of one machine and load:
- the compile: seconds of each width's first call with an empty disk cache (cold), then again after dynamo's
  in-memory state is dropped (warm: what a later process pays, loading from the disk cache);
- the pass cost: ms of one cached forward of w tokens after the prompt, for w = 1..max_width, over the one-token
  step (widths above the largest bucket run eager on the slot cache);
- the step against the memory bound: the ms to read the weights once, a `sum` over as many bytes, timed in the same
  rounds as the passes (each round one read and one pass of each width);
- the compiled logits against the eager ones on every prompt (largest absolute difference);
- end to end, greedy: our target-only loop, and speculative decoding with prompt lookup (k = 3, a 4-wide pass),
  tokens per second, outputs checked against the eager target-only's of the same weights, next to Hugging Face's
  plain generate.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedModel

from specdec import GREEDY, NGramDrafter, autoregressive_generate, speculative_generate
from specdec.markdown import markdown_table
from specdec.runtime.compiled import eager_model
from specdec.runtime.study import (
    compile_seconds,
    largest_logit_difference,
    last_logits,
    memory_bound_ms,
    pass_ms,
    weight_bytes,
    weights_in,
)

from ..records import machine, write_result
from ..run.methods import Setup
from ..run.settings import runtime_options
from .goals import runtime_goal_entries


def tokens_per_second(generate: Callable[[torch.Tensor], torch.Tensor], prompts: list[torch.Tensor]
                      ) -> tuple[float, list[torch.Tensor]]:
    """Generated tokens over seconds, summed over the prompts; the outputs."""
    outputs, seconds = [], 0.0
    for ids in prompts:
        start = time.perf_counter()
        outputs.append(generate(ids))
        seconds += time.perf_counter() - start
    return sum(o.numel() for o in outputs) / seconds, outputs


def end_to_end(model: PreTrainedModel, prompts: list[torch.Tensor], n: int, eos: list[int]) -> dict:
    """Greedy tokens/s of our target-only loop and of prompt lookup at k = 3, and their outputs."""
    def ours(ids):
        return autoregressive_generate(model, ids, sampling=GREEDY, max_new_tokens=n, eos_token_id=eos).tokens

    def lookup(ids):
        return speculative_generate(model, NGramDrafter(), ids, k=3, sampling=GREEDY, max_new_tokens=n,
                                    eos_token_id=eos).tokens

    ours(prompts[0][:, :8]), lookup(prompts[0][:, :8])  # warm-up
    ar, ar_out = tokens_per_second(ours, prompts)
    spec, spec_out = tokens_per_second(lookup, prompts)
    return {"ar_tokens_per_s": ar, "lookup_k3_tokens_per_s": spec, "outputs": {"ar": ar_out, "lookup": spec_out}}


def hf_plain(model: PreTrainedModel, prompts: list[torch.Tensor], n: int, eos: list[int]) -> float:
    def generate(ids):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos or None, pad_token_id=(eos or [0])[0])
        return out[0, ids.shape[-1]:]

    generate(prompts[0][:, :8])
    return tokens_per_second(generate, prompts)[0]


def run_runtime_study(model: PreTrainedModel, prompts: list[torch.Tensor], study: DictConfig, *, n: int,
                      eos: list[int], log: Callable[[str], None] = print) -> dict:
    """The study (module docstring) on model over prompts (1, L_i); study: profiles, max_width, repeats. A profile
    with a `dtype` runs on a copy of the model in that dtype, against its own memory bound, and its outputs are
    checked against the first profile of the same dtype (the same weights). The model starts eager, whatever runtime
    the bench loaded it on (runtime=auto compiles a target of this size on an AVX-512 CPU)."""
    eager_model(model)
    torch._dynamo.reset()
    bound_ms, gbps = memory_bound_ms(model)
    log(f"memory bound {bound_ms:.1f} ms ({gbps:.1f} GB/s, {weight_bytes(model) / 1e6:.0f} MB of weights)")
    result: dict = {"memory_bound_ms": bound_ms, "read_gb_per_s": gbps, "weight_mb": weight_bytes(model) / 1e6,
                    "hf_plain_tokens_per_s": hf_plain(model, prompts, n, eos), "profiles": {}}
    models, eager_logits, references = {}, {}, {}
    for name, profile in study.profiles.items():
        dtype = profile.get("dtype") or str(model.dtype).removeprefix("torch.")
        if dtype not in models:  # the weights, and their eager logits (before anything compiles them)
            models[dtype] = weights_in(model, dtype)
            eager_logits[dtype] = [last_logits(models[dtype], ids) for ids in prompts]
        entry, outputs = run_profile(models[dtype], prompts, profile, study, eager_logits[dtype], n=n, eos=eos)
        reference = references.setdefault(dtype, outputs["ar"])
        entry["outputs_equal_eager_target_only"] = all(
            torch.equal(a, b) for key in outputs for a, b in zip(outputs[key], reference))
        result["profiles"][name] = entry
        log(f"{name}: step {entry['pass_ms'][1]:.1f} ms, pass cost "
            + " ".join(f"{w}:{c:.2f}" for w, c in entry["pass_cost"].items())
            + f"; target-only {entry['ar_tokens_per_s']:.1f} tok/s, lookup {entry['lookup_k3_tokens_per_s']:.1f}")
    keys = headline(result, study.report)
    return result | {"keys": keys, "goals": runtime_goal_entries(keys)}


def run_profile(model: PreTrainedModel, prompts: list[torch.Tensor], profile: DictConfig, study: DictConfig,
                eager_logits: list[torch.Tensor], *, n: int, eos: list[int]) -> tuple[dict, dict]:
    """One profile's figures (compile, logits against these weights' eager ones, pass costs, step against the
    memory bound of these weights, end to end) and its outputs; the model is eager again afterwards."""
    prefix, widths = prompts[0], list(range(1, study.max_width + 1))
    entry: dict = {"settings": OmegaConf.to_container(profile), "dtype": str(model.dtype).removeprefix("torch.")}
    if profile.name == "compiled":
        entry["compile"] = compile_seconds(model, prefix, **runtime_options(profile).compile_settings())
        entry["logits_max_abs_diff_vs_eager"] = largest_logit_difference(model, prompts, eager_logits)
    ms, bound_ms = pass_ms(model, prefix, widths, study.repeats)
    entry |= {"pass_ms": ms, "pass_cost": {w: ms[w] / ms[1] for w in widths}, "memory_bound_ms": bound_ms,
              "step_vs_memory_bound": ms[1] / bound_ms}
    e2e = end_to_end(model, prompts, n, eos)
    outputs = e2e.pop("outputs")
    eager_model(model)
    torch._dynamo.reset()
    return entry | e2e, outputs


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
