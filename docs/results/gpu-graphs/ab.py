"""CUDA graphs on and off over the same compiled kernels, in one process, interleaved: what a target pass costs by
width, target-only and speculative tokens per second, and whether the outputs agree.

    python docs/results/gpu-graphs/ab.py --out ab.json          # random-weight Llama-3 8B, bf16, drafting for itself
    python docs/results/gpu-graphs/ab.py --draft random:llama3-1b --out ab.json     # and a random 1B draft
    python docs/results/gpu-graphs/ab.py --target random:tiny-target --draft random:tiny-draft --device cpu \
        --dtype float32  # a rehearsal

The models run on the compiled runtime (buckets 1 and 8, inductor's default kernels). The target drafting for itself
(alpha = 1 up to rounding, on a second cache of the same model) shows what a round costs besides its passes; a
random-weight draft accepts next to nothing. "off" sets the runtime's
CudaGraphs aside (runtime.cuda_graphs=false); "on" is the default. On a CPU there are no CUDA graphs: both columns
then run the same code and only the script is rehearsed. Hugging Face's eager generate runs once as an outside anchor.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from specdec import GREEDY, ModelDrafter, autoregressive_generate, speculative_generate
from specdec.runtime.cached import CachedLM
from specdec.runtime.compiled import compile_model, compiled_forward
from specdec.runtime.models import load_model
from specdec.runtime.probes import build_graphs, timed_step
from specdec.runtime.timing import stopwatch

MODES = ("off", "on")


def switch(models, mode: str, saved: dict) -> None:
    """CUDA graphs on or off for every model (their recordings kept while off)."""
    for model in models:
        runtime = compiled_forward(model)
        saved.setdefault(id(model), runtime.graphs)
        runtime.graphs = saved[id(model)] if mode == "on" else None


def pass_ms(model, device, context: int, widths: range, repeats: int) -> dict[int, float]:
    """Median ms of a pass of each width after `context` tokens, the widths interleaved."""
    lm = CachedLM(model)
    lm.forward(torch.randint(0, 256, (1, context), device=device), last_only=True)
    samples: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(repeats):
        for width in widths:
            run, undo = timed_step(lm, torch.randint(0, 256, (1, width), device=device))
            seconds: dict[str, float] = {}
            with stopwatch(seconds, "pass", device):
                run()
            undo()
            samples[width].append(1000 * seconds["pass"])
    return {w: statistics.median(ms) for w, ms in samples.items()}


def timed(fn, device) -> tuple[object, float]:
    seconds: dict[str, float] = {}
    with stopwatch(seconds, "call", device):
        out = fn()
    return out, seconds["call"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="random:llama3-8b")
    parser.add_argument("--draft", default=None, help="a draft model besides the target drafting for itself")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", default="ab.json")
    args = parser.parse_args()
    device = args.device
    result: dict = {"args": vars(args), "torch": torch.__version__, "host": platform.processor() or platform.machine(),
                    "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None}
    start = time.perf_counter()
    target = load_model(args.target, dtype=args.dtype, device=device)
    draft = load_model(args.draft, dtype=args.dtype, device=device) if args.draft else None
    result["load_seconds"] = time.perf_counter() - start
    prompt = torch.randint(0, 256, (1, args.context), generator=torch.Generator().manual_seed(0)).to(device)
    for _ in range(2):  # the second call: the first initialises the device's libraries
        hf = timed(lambda: target.generate(prompt, max_new_tokens=args.new_tokens, do_sample=False), device)
    result["hf_generate_eager_tokens_per_second"] = (hf[0].shape[1] - prompt.shape[1]) / hf[1]
    print(f"loaded in {result['load_seconds']:.1f} s; HF eager generate "
          f"{result['hf_generate_eager_tokens_per_second']:.1f} tok/s", flush=True)
    models, saved = tuple(m for m in (target, draft) if m is not None), {}
    for model in models:
        compile_model(model, widths=(1, 8), capacity=512, autotune=False)
        start = time.perf_counter()
        build_graphs(model)
        result.setdefault("compile_seconds", []).append(time.perf_counter() - start)
        print(f"compiled in {result['compile_seconds'][-1]:.1f} s", flush=True)
    rows: dict[str, dict[str, list]] = {mode: {"ar": [], "spec": [], "spec_self": [], "passes": []} for mode in MODES}
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    for round_ in range(args.rounds):
        for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
            switch(models, mode, saved)
            ar, seconds = timed(lambda: autoregressive_generate(target, prompt, sampling=GREEDY,
                                                                max_new_tokens=args.new_tokens), device)
            rows[mode]["ar"].append(args.new_tokens / seconds)
            spec, seconds = timed(lambda: speculative_generate(target, ModelDrafter(draft or target), prompt,
                                                               k=args.k, sampling=GREEDY,
                                                               max_new_tokens=args.new_tokens), device)
            rows[mode]["spec"].append(args.new_tokens / seconds)  # (without --draft: the self-drafted run twice)
            own, seconds = timed(lambda: speculative_generate(target, ModelDrafter(target), prompt, k=args.k,
                                                             sampling=GREEDY, max_new_tokens=args.new_tokens),
                                 device)  # the target drafts for itself, on a second cache of the same model
            rows[mode]["spec_self"].append(args.new_tokens / seconds)
            rows[mode]["passes"].append(pass_ms(target, device, args.context, range(1, 9), 5))
            print(round_, mode, {key: [round(x, 2) if isinstance(x, float) else x for x in values[-1:]]
                                 for key, values in rows[mode].items() if isinstance(values, list)}, flush=True)
            outputs.setdefault(mode, {"ar": ar.tokens, "spec": spec.tokens, "spec_self": own.tokens})
            rows[mode].setdefault("acceptance", {"spec": spec.stats.acceptance_rate,
                                                 "spec_self": own.stats.acceptance_rate})
    switch(models, "on", saved)
    for mode in MODES:
        passes = rows[mode].pop("passes")
        step = statistics.median(p[1] for p in passes)
        result[mode] = {
            "target_only_tokens_per_second": statistics.median(rows[mode]["ar"]),
            "speculative_tokens_per_second": statistics.median(rows[mode]["spec"]),
            "self_drafted_tokens_per_second": statistics.median(rows[mode]["spec_self"]),
            "acceptance": rows[mode]["acceptance"],
            "step_ms": step,
            "pass_cost_by_width": {w: statistics.median(p[w] for p in passes) / step for w in range(1, 9)},
            "runs": rows[mode],
        }
    graphs = [compiled_forward(m).graphs for m in models]
    result["recorded"] = [g.recorded if g else None for g in graphs]
    result["replayed"] = [g.replayed if g else None for g in graphs]
    result["failed"] = [g.failed if g else None for g in graphs]
    if device.startswith("cuda"):
        result["cuda_max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9
    result["same_tokens_on_and_off"] = {kind: bool(torch.equal(outputs["on"][kind], outputs["off"][kind]))
                                        for kind in ("ar", "spec", "spec_self")}
    result["speculative_equals_target_only"] = {mode: {kind: bool(torch.equal(outputs[mode]["ar"], outputs[mode][kind]))
                                                       for kind in ("spec", "spec_self")} for mode in MODES}
    result["on_over_off"] = {key: result["on"][key] / result["off"][key] for key in
                             ("target_only_tokens_per_second", "speculative_tokens_per_second",
                              "self_drafted_tokens_per_second", "step_ms")}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(json.dumps({k: v for k, v in result.items() if k not in MODES}, indent=1, default=str))
    for mode in MODES:
        print(mode, json.dumps({k: v for k, v in result[mode].items() if k != "runs"}, default=str))


if __name__ == "__main__":
    main()
