"""One graph for every width against a graph per bucket, on `make run`'s compiled profile: the offline SmolLM2-135M
target, two torch threads, every linear on the packed kernel, the C++ wrapper, unfrozen weights.

- buckets: graphs of 1 and 8 tokens (what runtime=auto built where an 8-row packed pass cost 1.15 steps or more);
  a pass of 2-7 tokens is padded to 8;
- dynamic: one graph whose width is an unbacked size of 1..8 (runtime.dynamic_width), each pass at its own width.

One process builds both (a copy of the model each, on one inductor cache folder), then times passes of 1..8 tokens
after a 32-token prefix, the variants and widths interleaved over 7 rounds, and compares each variant's logits with
the eager model's on the same tokens. Run it twice on one empty cache folder for the cold and the warm build:

    python docs/results/compile-profile/dynamic_width.py INDUCTOR_CACHE_DIR >> dynamic-width-xeon-amx-2threads.jsonl

With `widest` after the folder it compares one graph for 1..8 with one for 1..16 instead, passes of 1..16 tokens
over 5 rounds (a pass wider than the graph's widest runs eager):

    python docs/results/compile-profile/dynamic_width.py INDUCTOR_CACHE_DIR widest >> dynamic-width-16-xeon-amx-2threads.jsonl

Prints one JSON line.
"""

import json
import os
import statistics
import sys
import time

os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[1]
import torch

torch.set_num_threads(2)
from specdec.runtime.cached import CachedLM
from specdec.runtime.compiled import build_graphs, compile_model, time_buckets
from specdec.runtime.models import load_model
from specdec.runtime.timing import stopwatch, timed_step

WIDEST = sys.argv[2:] == ["widest"]
VARIANTS = ({"dynamic8": {"widths": (8,), "dynamic_width": True}, "dynamic16": {"widths": (16,), "dynamic_width": True}}
            if WIDEST else {"buckets": {"widths": (1, 8)}, "dynamic": {"widths": (8,), "dynamic_width": True}})
WIDTHS = range(1, 17 if WIDEST else 9)
out = {"load": os.getloadavg()[0], "cpu": torch.backends.cpu.get_cpu_capability()}
eager = load_model("offline:smollm2-135m-instruct")
models = {}
for name, settings in VARIANTS.items():
    model = load_model("offline:smollm2-135m-instruct")
    compile_model(model, packed_rows=(1, 16), cpp_wrapper=True, **settings)
    start = time.perf_counter()
    build_graphs(model)
    time_buckets(model)
    out[f"{name}_build_seconds"] = round(time.perf_counter() - start, 1)
    models[name] = model

tokens = torch.randint(0, eager.config.vocab_size, (1, 32 + max(WIDTHS)), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    reference = eager(tokens).logits
    for name, model in models.items():
        lm = CachedLM(model)
        lm.forward(tokens[:, :32], last_only=True)
        diffs = []
        for width in WIDTHS:
            run, undo = timed_step(lm, tokens[:, 32:32 + width])
            diffs.append((run() - reference[:, 32:32 + width]).abs().max().item())
            undo()
        out[f"{name}_max_abs_logit_diff"] = max(diffs)

    lms = {name: CachedLM(model) for name, model in models.items()}
    for lm in lms.values():
        lm.forward(tokens[:, :32], last_only=True)
    samples = {(name, w): [] for name in lms for w in WIDTHS}
    for _ in range(5 if WIDEST else 7):
        for width in WIDTHS:
            for name, lm in lms.items():
                run, undo = timed_step(lm, tokens[:, 32:32 + width])
                seconds = {}
                with stopwatch(seconds, "pass", lm.device):
                    run()
                undo()
                samples[name, width].append(1000 * seconds["pass"])
for name in lms:
    ms = {w: statistics.median(samples[name, w]) for w in WIDTHS}
    out[f"{name}_pass_ms"] = {w: round(v, 2) for w, v in ms.items()}
    out[f"{name}_pass_cost"] = {w: round(v / ms[1], 3) for w, v in ms.items()}
print(json.dumps(out))
