"""The packed kernel with and without its software prefetch, side by side in one process.

Builds src/specdec/runtime/kernels/packed_mm.cpp twice, as it is and with SPECDEC_PREFETCH_FAR=NEAR=0 (under
another library name), packs every linear of the offline SmolLM2-135M target (30 layers of q, k, v, o, gate, up,
down and the tied 49152x576 head, 538 MB of float32) for each, and times one call of every linear at 1..16 rows,
the builds and row counts interleaved over 7 rounds (medians). The bound is the time to read as many bytes once
(`sum` over a float32 tensor of that size, in the same rounds). Both builds must give the same products, bit for bit.
The same rounds time the int8 kernel of the prefetching build (pack_int8: int8 panels, a scale per output) on the
same linears: the weight-only int8 copy's matrix products, a quarter of the bytes.

    python docs/results/kernel/prefetch.py THREADS >> docs/results/kernel/prefetch-xeon-amx.jsonl

(int8_* keys: int8_vs_bound is over the float32 bound; a quarter of it is the int8 weights' own.)

Prints one JSON line.
"""

import json
import os
import statistics
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[1]))
from torch.utils.cpp_extension import load

from specdec.runtime.models import load_model
from specdec.runtime.offline import cache_dir
from specdec.runtime.packed import SOURCE, load_kernel, ninja_on_path

ROWS = range(1, 17)
load_kernel()  # torch.ops.specdec: the kernel as the library builds it
ninja_on_path()
build = cache_dir() / "kernels-no-prefetch"
build.mkdir(parents=True, exist_ok=True)
load(name="specdec_packed_mm_no_prefetch", sources=[str(SOURCE)], build_directory=str(build), is_python_module=False,
     extra_cflags=["-O3", "-mavx512f", "-mfma", "-fopenmp", "-DSPECDEC_PREFETCH_FAR=0", "-DSPECDEC_PREFETCH_NEAR=0",
                   "-DSPECDEC_LIBRARY=specdec_no_prefetch"], extra_ldflags=["-fopenmp"])
builds = {"prefetch": torch.ops.specdec, "no_prefetch": torch.ops.specdec_no_prefetch}

model = load_model("offline:smollm2-135m-instruct")
weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
packed = [torch.ops.specdec.pack(w) for w in weights]  # one layout: both builds share PANEL
packed_int8 = [torch.ops.specdec.pack_int8(w) for w in weights]
nbytes = sum(w.numel() * 4 for w in weights)
stream = torch.randn(nbytes // 4)
inputs = {(n, k): torch.randn(n, k) for n in ROWS for k in {w.shape[1] for w in weights}}


def linears(ops, rows):
    return [ops.packed_mm(inputs[rows, w.shape[1]], p, w.shape[0]) for w, p in zip(weights, packed)]


def int8_linears(rows):
    return [torch.ops.specdec.packed_int8_mm(inputs[rows, w.shape[1]], p, scales, w.shape[0])
            for w, (p, scales) in zip(weights, packed_int8)]


def seconds(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


out = {"threads": int(sys.argv[1]), "load": os.getloadavg()[0], "cpu": torch.backends.cpu.get_cpu_capability(),
       "weights_mb": round(nbytes / 1e6, 1)}
with torch.inference_mode():
    out["same_products"] = all(torch.equal(a, b) for rows in (1, 5, 9, 16)
                               for a, b in zip(linears(builds["prefetch"], rows), linears(builds["no_prefetch"], rows)))
    samples = {(name, rows): [] for name in (*builds, "int8") for rows in ROWS}
    bound = []
    for _ in range(7):
        bound.append(seconds(stream.sum))
        for rows in ROWS:
            for name, ops in builds.items():
                samples[name, rows].append(seconds(lambda: linears(ops, rows)))
            samples["int8", rows].append(seconds(lambda: int8_linears(rows)))
out["bound_ms"] = round(1000 * statistics.median(bound), 2)
for name in (*builds, "int8"):
    ms = {rows: 1000 * statistics.median(samples[name, rows]) for rows in ROWS}
    out[f"{name}_ms"] = {rows: round(v, 2) for rows, v in ms.items()}
    out[f"{name}_cost"] = {rows: round(v / ms[1], 3) for rows, v in ms.items()}
    out[f"{name}_vs_bound"] = {rows: round(v / out["bound_ms"], 3) for rows, v in ms.items()}
print(json.dumps(out))
