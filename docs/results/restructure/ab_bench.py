"""Before/after benchmark of the library loops: run in a process whose PYTHONPATH points at one checkout.

Methods: the default run's (target-only, speculative with the dynamic int8 copy its calibration chose here, reading the
target's cache at k=4 and k=auto, naive) plus the n-gram chain and trie at k=auto. Greedy, fixed prompts,
one torch thread. Prints one JSON line: per method, per prompt, tokens and seconds.
"""

import json
import sys
import time

import torch

import specdec
from specdec import (
    GREEDY,
    ModelDrafter,
    NGramDrafter,
    NGramTreeDrafter,
    autoregressive_generate,
    draft_then_score,
    speculative_generate,
    tree_generate,
)
from specdec.models import dynamic_int8_copy, encode_prompt, load_model, load_tokenizer

torch.set_num_threads(1)
NAME = "offline:smollm2-135m-instruct"
target, tok = load_model(NAME), load_tokenizer(NAME)
draft = dynamic_int8_copy(load_model(NAME))  # the draft the default run's calibration chose on this machine
rows = [json.loads(line) for line in open(sys.argv[1])]
prompts = {r["id"]: encode_prompt(tok, r["prompt"]) for r in rows}
N = int(sys.argv[2])
eos = sorted({tok.eos_token_id, *([target.generation_config.eos_token_id] if isinstance(target.generation_config.eos_token_id, int) else target.generation_config.eos_token_id or [])})
common = dict(sampling=GREEDY, max_new_tokens=N, eos_token_id=eos)
shared = ModelDrafter(draft, reads_target_cache=True)
METHODS = {
    "autoregressive": lambda ids: autoregressive_generate(target, ids, **common),
    "spec_shared_k4": lambda ids: speculative_generate(target, shared, ids, k=4, **common),
    "spec_shared_auto": lambda ids: speculative_generate(target, shared, ids, k="auto", **common),
    "spec_ngram_auto": lambda ids: speculative_generate(target, NGramDrafter(), ids, k="auto", **common),
    "tree_ngram_auto": lambda ids: tree_generate(target, NGramTreeDrafter(depth=8, nodes=16), ids, k="auto",
                                                 max_nodes=16, **common),
    "naive": lambda ids: draft_then_score(target, draft, ids, **common),
}
for fn in METHODS.values():  # warm-up
    fn(next(iter(prompts.values()))[:, :16])
out = {"specdec": specdec.__file__, "methods": {}}
for name, fn in METHODS.items():
    out["methods"][name] = {}
for pid, ids in prompts.items():
    for name, fn in METHODS.items():  # interleaved per prompt
        start = time.perf_counter()
        g = fn(ids)
        out["methods"][name][pid] = {"tokens": g.tokens.tolist(), "seconds": time.perf_counter() - start}
print(json.dumps(out))
