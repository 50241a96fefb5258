"""The compiled runtime's call overhead, before and after, side by side in one process.

Before: every model's graphs under one code object (CompiledForward.run) and every tensor that is not a parameter
guarded, the packed kernel's panels among them. After: the runtime as the library builds it (a code object per
model, no guards on its buffers). Each side gets its own target (SmolLM2-135M, make run's profile: one graph for
1-16 tokens, packed kernel, C++ wrapper) and its own weight-only int8 copy (one 1-token graph). Target-only and
speculative decoding (the int8 copy reading the target's cache, k = 6), greedy, 128 tokens on the first prompt of
three categories, the sides interleaved over REPS rounds (medians); every output must be the same on both sides.

    python docs/results/guards/ab.py [REPS] >> docs/results/guards/ab-xeon-amx.jsonl

Prints one JSON line.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import torch

torch.set_num_threads(2)
from specdec import GREEDY, ModelDrafter, autoregressive_generate, speculative_generate  # noqa: E402
from specdec.runtime.compiled import build_graphs, compile_model  # noqa: E402
from specdec.runtime.models import encode_prompt, load_model, load_tokenizer  # noqa: E402

NAME, N, K = "offline:smollm2-135m-instruct", 128, 6
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def pair(before: bool):
    """A target and its int8 copy on the compiled runtime; before: compiled as the runtime did before."""
    target, draft = load_model(NAME), load_model(NAME, quantization="packed_int8")
    for model, settings in ((target, {"widths": (16,), "dynamic_width": True}), (draft, {"widths": (1,)})):
        runtime = compile_model(model, packed_rows=(1, 16), cpp_wrapper=True, **settings)
        if before:  # the shared code object of CompiledForward.run, every guard kept
            runtime.compiled = torch.compile(runtime.run, fullgraph=True, dynamic=False, options=runtime.options)
        build_graphs(model)
    drafter = ModelDrafter(draft, reads_target_cache=True)
    return {"target_only": lambda ids: autoregressive_generate(target, ids, sampling=GREEDY, max_new_tokens=N),
            "speculative_k6": lambda ids: speculative_generate(target, drafter, ids, k=K, sampling=GREEDY,
                                                               max_new_tokens=N)}


tokenizer = load_tokenizer(NAME)
firsts = {}
for line in open("data/prompts.jsonl"):
    row = json.loads(line)
    firsts.setdefault(row["category"], row)
prompts = [encode_prompt(tokenizer, row["prompt"]) for row in firsts.values()][:3]
sides = {"before": pair(True), "after": pair(False)}
outputs = {(side, name): [run(ids).tokens.tolist() for ids in prompts] for side, runs in sides.items()
           for name, run in runs.items()}
assert len({json.dumps(out) for out in outputs.values()}) == 1, "outputs differ"
samples = {key: [] for key in outputs}
start_load = os.getloadavg()[0]
for rep in range(REPS):
    for side in (("before", "after") if rep % 2 == 0 else ("after", "before")):
        for name, run in sides[side].items():
            start = time.perf_counter()
            tokens = sum(run(ids).tokens.numel() for ids in prompts)
            samples[side, name].append(tokens / (time.perf_counter() - start))
tok_s = {f"{side}/{name}": round(statistics.median(v), 2) for (side, name), v in samples.items()}
flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0]
print(json.dumps({
    "tok_s": tok_s,
    "after_over_before": {name: round(tok_s[f"after/{name}"] / tok_s[f"before/{name}"], 3) for name in sides["after"]},
    "speculative_over_target_only": {side: round(tok_s[f"{side}/speculative_k6"] / tok_s[f"{side}/target_only"], 3)
                                     for side in sides},
    "reps": REPS, "threads": 2, "load_average": [start_load, os.getloadavg()[0]],
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "cpu": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f" {f}" in flags],
    "torch": torch.__version__,
}))
