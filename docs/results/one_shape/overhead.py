"""The loop's own time per generated token (wall time outside the models' forwards, by forward hooks on both
models): a load-robust before/after measure. Batch 1 (4 prompts, one at a time) and the same prompts as one batch.

    PYTHONPATH=<checkout>/src python docs/results/one_shape/overhead.py <prompts.jsonl>
"""

import json
import sys
import time

import torch

from specdec import GREEDY, ModelDrafter, NGramTreeDrafter, autoregressive_generate, speculative_generate, tree_generate

try:  # the layout by role
    from specdec.runtime.models import dynamic_int8_copy, encode_prompt, load_model, load_tokenizer
except ImportError:  # before it
    from specdec.models import dynamic_int8_copy, encode_prompt, load_model, load_tokenizer

torch.set_num_threads(1)
NAME = "offline:smollm2-135m-instruct"
target, tok = load_model(NAME), load_tokenizer(NAME)
draft = dynamic_int8_copy(load_model(NAME))
inside = [0.0]


def hook(model):
    model.register_forward_pre_hook(lambda *_: inside.append(time.perf_counter()))
    model.register_forward_hook(lambda *_: inside.__setitem__(0, inside[0] + time.perf_counter() - inside.pop()))


hook(target)
hook(draft)
prompts = [encode_prompt(tok, json.loads(line)["prompt"]) for line in list(open(sys.argv[1]))[:4]]
common = dict(sampling=GREEDY, max_new_tokens=64)
METHODS = {
    "autoregressive": lambda ids: autoregressive_generate(target, ids, **common),
    "spec_k4": lambda ids: speculative_generate(target, ModelDrafter(draft, reads_target_cache=True), ids, k=4,
                                                **common),
    "tree_ngram_k4": lambda ids: tree_generate(target, NGramTreeDrafter(depth=8, nodes=16), ids, k=4, max_nodes=16,
                                               **common),
}


def overhead(call, inputs) -> dict:
    tokens = wall = forwards = 0.0
    for ids in inputs:
        inside[0] = 0.0
        start = time.perf_counter()
        g = call(ids)
        wall += time.perf_counter() - start
        forwards += inside[0]
        tokens += g.stats.emitted
    return {"overhead_ms_per_token": 1000 * (wall - forwards) / tokens, "wall_ms_per_token": 1000 * wall / tokens}


for call in METHODS.values():  # warm-up
    call(prompts[0][:, :12])
out = {name: overhead(call, prompts) for name, call in METHODS.items()}
out.update({f"{name}_batch4": overhead(call, [[p[0] for p in prompts]]) for name, call in METHODS.items()})
print(json.dumps(out))
