"""Loop overhead (wall time outside the models' forwards) per generated token, before/after: load-robust."""
import json, sys, time
import torch
from specdec import GREEDY, ModelDrafter, NGramDrafter, NGramTreeDrafter, speculative_generate, tree_generate, autoregressive_generate
from specdec.models import dynamic_int8_copy, encode_prompt, load_model, load_tokenizer
torch.set_num_threads(1)
NAME = "offline:smollm2-135m-instruct"
target, tok = load_model(NAME), load_tokenizer(NAME)
draft = dynamic_int8_copy(load_model(NAME))
inside = [0.0]
def hook(model):
    model.register_forward_pre_hook(lambda *_: inside.append(time.perf_counter()))
    model.register_forward_hook(lambda *_: inside.__setitem__(0, inside[0] + time.perf_counter() - inside.pop()))
hook(target); hook(draft)
rows = [json.loads(l) for l in open(sys.argv[1])][:4]
prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
shared = ModelDrafter(draft, reads_target_cache=True)
M = {
 "autoregressive": lambda ids: autoregressive_generate(target, ids, sampling=GREEDY, max_new_tokens=64),
 "spec_shared_k4": lambda ids: speculative_generate(target, shared, ids, k=4, sampling=GREEDY, max_new_tokens=64),
 "tree_ngram_auto": lambda ids: tree_generate(target, NGramTreeDrafter(depth=8, nodes=16), ids, k="auto", max_nodes=16, sampling=GREEDY, max_new_tokens=64),
 "spec_ngram_auto": lambda ids: speculative_generate(target, NGramDrafter(), ids, k="auto", sampling=GREEDY, max_new_tokens=64),
}
for f in M.values(): f(prompts[0][:, :12])
out = {}
for name, f in M.items():
    tokens = wall = fwd = 0.0
    for ids in prompts:
        inside[0] = 0.0
        start = time.perf_counter(); g = f(ids); wall += time.perf_counter() - start
        fwd += inside[0]; tokens += g.tokens.numel()
    out[name] = {"overhead_ms_per_token": 1000 * (wall - fwd) / tokens, "wall_ms_per_token": 1000 * wall / tokens}
print(json.dumps(out))
