"""What `make run`'s compiled profile costs to compile, cold and warm, with and without the C++ wrapper: one process per
call, the offline SmolLM2-135M target, two torch threads (as threads=auto chose in `make run`), widths [8], the
packed kernel for passes of 1-16 rows.

    python docs/results/compile-profile/probe.py VARIANT INDUCTOR_CACHE_DIR   # VARIANT: cpp, python, cpp_separate

Prints one JSON line: seconds to compile (or load) the graphs at build time, and the median ms of a pass of 8.
"""

import json
import os
import sys
import time

variant, cache = sys.argv[1], sys.argv[2]
os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
import torch

torch.set_num_threads(2)
from specdec.runtime.compiled import build_graphs, compile_model, time_buckets
from specdec.runtime.models import load_model

model = load_model("offline:smollm2-135m-instruct")
options = {"cpp": {"cpp_wrapper": True}, "python": {"cpp_wrapper": False},
           "cpp_separate": {"cpp_wrapper": True}}[variant]
if variant == "cpp_separate":
    import torch._inductor.config as inductor_config

    inductor_config.cpp_wrapper_build_separate = True
runtime = compile_model(model, widths=(8,), packed_rows=(1, 16), **options)
start = time.perf_counter()
build_graphs(model)
seconds = time.perf_counter() - start
pass_ms = time_buckets(model, repeats=15)
print(json.dumps({"variant": variant, "build_seconds": round(seconds, 1), "warm": runtime.record.warm,
                  "pass_ms_8": round(pass_ms[8], 2), "load": os.getloadavg()[0]}))
