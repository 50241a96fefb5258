"""The int8 copy's linears (SmolLM2-135M, every PackedInt8Linear, one row each) on 2 threads and on 1, with the packed
kernel built as shipped and with other prefetch distances (FAR, NEAR bytes); the float32 target's linears beside them. Run from the repository root:
python docs/results/kernel/int8_threads.py"""

import statistics

import torch

from specdec.runtime.models import load_model
from specdec.runtime.packed import (
    SOURCE,
    PackedInt8Linear,
    PackedLinear,
    build_library,
    load_kernel,
    use_packed_kernel,
)
from specdec.runtime.timing import interleaved_samples

torch.set_num_threads(2)
variants = {"pf0": (0, 0), "pf16k": (16384, 4096), "pf3k": (3072, 1024)}
for n, (far, near) in variants.items():
    build_library(f"specdec_{n}", SOURCE, (f"-DSPECDEC_PREFETCH_FAR={far}", f"-DSPECDEC_PREFETCH_NEAR={near}", f"-DSPECDEC_LIBRARY=specdec_{n}"))
name = "offline:smollm2-135m-instruct"
t = load_model(name); use_packed_kernel(t, (1, 16))
d = load_model(name, quantization="packed_int8"); load_kernel()
mods = [m for m in d.modules() if isinstance(m, PackedInt8Linear)]
xs = {m.in_features: torch.randn(1, m.in_features) for m in mods}
def run(ns):
    op = getattr(torch.ops, ns)
    return lambda: [op.packed_int8_mm(xs[m.in_features], m.packed, m.scales, m.out_features) for m in mods]
jobs = {ns: run(ns) for ns in ["specdec"] + [f"specdec_{n}" for n in variants]}
targets = [m for m in t.modules() if isinstance(m, PackedLinear)]
jobs["float32 target"] = lambda: [torch.ops.specdec.packed_mm(xs[m.in_features], m.packed, m.out_features) for m in targets]
for threads in (2, 1):
    torch.set_num_threads(threads)
    s = interleaved_samples(jobs, 15, warmup=2)
    print(threads, {k: round(1000 * statistics.median(v), 2) for k, v in s.items()})
