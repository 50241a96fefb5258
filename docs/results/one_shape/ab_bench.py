"""Before/after benchmark of the one-shape restructuring: run in a process whose PYTHONPATH points at one checkout.

Methods of the default run's kind on the offline pair (greedy, one torch thread): target-only, speculative with the
dynamic int8 copy reading the target's cache (k=4, k=auto, block verification at k=4), a model tree of that copy
(depth 3, 4 nodes), the n-gram trie at k=auto, and the article's method; each on single prompts (batch 1) and on
the same prompts as one batch of 4. Prints one JSON line: per method, per prompt (or batch), tokens and seconds.

    PYTHONPATH=<checkout>/src python docs/results/one_shape/ab_bench.py <prompts.jsonl> <max_new_tokens> [batch4]

With a third argument `batch4`, only the batch of 4 runs (three times; more repetitions of the noisier part).
"""

import json
import sys
import time

import torch

import specdec
from specdec import (
    GREEDY,
    BlockVerification,
    ModelDrafter,
    ModelTreeDrafter,
    NGramTreeDrafter,
    autoregressive_generate,
    draft_then_score,
    speculative_generate,
    tree_generate,
)

try:  # the layout by role
    from specdec.runtime.models import dynamic_int8_copy, encode_prompt, load_model, load_tokenizer
except ImportError:  # before it
    from specdec.models import dynamic_int8_copy, encode_prompt, load_model, load_tokenizer

torch.set_num_threads(1)
NAME = "offline:smollm2-135m-instruct"
target, tok = load_model(NAME), load_tokenizer(NAME)
draft = dynamic_int8_copy(load_model(NAME))
rows = [json.loads(line) for line in open(sys.argv[1])][:4]
prompts = {r["id"]: encode_prompt(tok, r["prompt"]) for r in rows}
N = int(sys.argv[2])
configured = target.generation_config.eos_token_id
eos = sorted({tok.eos_token_id, *([configured] if isinstance(configured, int) else configured or [])})
common = dict(sampling=GREEDY, max_new_tokens=N, eos_token_id=eos)


def shared():
    return ModelDrafter(draft, reads_target_cache=True)


METHODS = {
    "autoregressive": lambda ids: autoregressive_generate(target, ids, **common),
    "spec_k4": lambda ids: speculative_generate(target, shared(), ids, k=4, **common),
    "spec_auto": lambda ids: speculative_generate(target, shared(), ids, k="auto", **common),
    "block_k4": lambda ids: speculative_generate(target, shared(), ids, k=4, acceptance=BlockVerification(),
                                                 **common),
    "tree_model": lambda ids: tree_generate(target, ModelTreeDrafter(draft, branches=(2,), depth=3, nodes=4), ids,
                                            **common),
    "tree_ngram_auto": lambda ids: tree_generate(target, NGramTreeDrafter(depth=8, nodes=16), ids, k="auto",
                                                 max_nodes=16, **common),
    "naive": lambda ids: draft_then_score(target, draft, ids, **common),
}
BATCHED = ("autoregressive", "spec_k4", "spec_auto", "block_k4", "tree_model", "naive")


def tokens_of(out, batch):
    return [t.tolist() for t in out.tokens] if batch else out.tokens.tolist()


first = next(iter(prompts.values()))
for fn in METHODS.values():  # warm-up
    fn(first[:, :16])
ONLY_BATCH = sys.argv[3:] == ["batch4"]
out = {"specdec": specdec.__file__, "batch1": {m: {} for m in METHODS}, "batch4": {}}
for pid, ids in ({} if ONLY_BATCH else prompts).items():
    for name, fn in METHODS.items():  # interleaved per prompt
        start = time.perf_counter()
        g = fn(ids)
        out["batch1"][name][pid] = {"tokens": tokens_of(g, False), "seconds": time.perf_counter() - start}
batch = [ids[0] for ids in prompts.values()]
for repeat in range(3 if ONLY_BATCH else 1):
    for name in BATCHED:
        start = time.perf_counter()
        g = METHODS[name](batch)
        seconds = time.perf_counter() - start
        if seconds < out["batch4"].get(name, {}).get("seconds", float("inf")):  # the fastest of the repeats
            out["batch4"][name] = {"tokens": tokens_of(g, True), "seconds": seconds, "emitted": int(g.stats.emitted)}
print(json.dumps(out))
