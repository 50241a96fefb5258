"""Would rounding the int8 copy's inputs to int16 make its products cheaper? The int8 copy's linears (SmolLM2-135M,
every PackedInt8Linear) as shipped (float32 inputs, int8 weights widened to float32) against int16_inputs.cpp
(inputs rounded per row to int16, pairs of products by vpdpwssd), at 1 and 4 rows, 2 threads and 1; ms for all 211
linears, median of 15 interleaved rounds, and the largest difference from the shipped kernel relative to its largest
output. Needs AVX512-VNNI. Run from the repository root: python docs/results/kernel/int16_inputs.py"""

import statistics
from pathlib import Path

import torch

from specdec.runtime.models import load_model
from specdec.runtime.packed import PackedInt8Linear, build_library, load_kernel
from specdec.runtime.timing import interleaved_samples

torch.set_num_threads(2)
build_library("specdec_int16", Path(__file__).with_suffix(".cpp"), ("-mavx512bw", "-mavx512vnni"))
copy = load_model("offline:smollm2-135m-instruct", quantization="packed_int8")
load_kernel()
linears = [m for m in copy.modules() if isinstance(m, PackedInt8Linear)]
pairs = [torch.ops.specdec_int16.pairs(m.packed) for m in linears]


def shipped(x):
    return [torch.ops.specdec.packed_int8_mm(x[m.in_features], m.packed, m.scales, m.out_features) for m in linears]


def int16(x):
    return [torch.ops.specdec_int16.i16_mm(x[m.in_features], p, m.scales, m.out_features) for m, p in zip(linears, pairs)]


for rows in (1, 4):
    x = {m.in_features: torch.randn(rows, m.in_features) for m in linears}
    error = max(((b - a).abs().max() / a.abs().max()).item() for a, b in zip(shipped(x), int16(x)))
    for threads in (2, 1):
        torch.set_num_threads(threads)
        samples = interleaved_samples({"shipped": lambda x=x: shipped(x), "int16 inputs": lambda x=x: int16(x)}, 15,
                                      warmup=2)
        ms = {k: round(1000 * statistics.median(v), 2) for k, v in samples.items()}
        print(f"rows {rows}, threads {threads}: {ms}, largest difference {error:.1e}")
    torch.set_num_threads(2)
