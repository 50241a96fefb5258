"""Frozen against unfrozen weights on `make run`'s compiled profile: the offline SmolLM2-135M target, two torch threads,
width 8, every linear on the packed kernel, the C++ wrapper. One process builds both graphs (a copy of the model
each) and times their 8-token passes interleaved; run it twice on one cache folder for the cold and the warm build.

    python docs/results/compile-profile/freezing.py INDUCTOR_CACHE_DIR >> freezing-xeon-amx-2threads.jsonl

Prints one JSON line: each variant's build seconds, whether AOTAutograd's cache held its graph, and the median ms of
an 8-token pass in each of 6 interleaved rounds (11 passes a round).
"""

import json
import os
import statistics
import sys
import time

os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[1]
import torch

torch.set_num_threads(2)
from torch._dynamo.utils import counters

from specdec.runtime.compiled import build_graphs, compile_model, time_buckets
from specdec.runtime.models import load_model

models, out = {}, {"load": os.getloadavg()[0]}
for frozen in (True, False):
    model = load_model("offline:smollm2-135m-instruct")
    runtime = compile_model(model, widths=(8,), packed_rows=(1, 16), cpp_wrapper=True)
    runtime.options = dict(runtime.options, freezing=frozen)  # the library's choice here is unfrozen
    runtime.compiled = torch.compile(runtime.run, fullgraph=True, dynamic=False, options=runtime.options)
    before = dict(counters["aot_autograd"])
    start = time.perf_counter()
    build_graphs(model)
    name = "frozen" if frozen else "unfrozen"
    out[f"{name}_build_seconds"] = round(time.perf_counter() - start, 1)
    out[f"{name}_aot_cache"] = {k: v - before.get(k, 0) for k, v in counters["aot_autograd"].items()
                                if k.startswith("autograd_cache") and v - before.get(k, 0)}
    models[name] = model
rounds = {name: [] for name in models}
for _ in range(6):
    for name, model in models.items():
        rounds[name].append(round(time_buckets(model, repeats=11)[8], 2))
for name, ms in rounds.items():
    out[f"{name}_pass8_ms"], out[f"{name}_pass8_median_ms"] = ms, round(statistics.median(ms), 2)
print(json.dumps(out))
