"""Before/after at batch size 1: the same loop calls on the offline pair, one code version per process."""
import json, sys, time, torch
torch.set_num_threads(1)
from specdec import ModelDrafter, NGramDrafter, GREEDY, speculative_generate, autoregressive_generate, tree_generate, NGramTreeDrafter
from specdec.models import load_model, load_tokenizer, encode_prompt
name = "offline:smollm2-135m-instruct"
t, tok = load_model(name), load_tokenizer(name)
d = load_model(name, quantization="dynamic_int8")
texts = ["Summarize in two sentences: The city council met on Tuesday to discuss the new park. Residents asked for more trees, a playground and longer opening hours; the council agreed to the trees and the playground.",
         "What is the capital of France, and why is it famous?",
         "Write a Python function that returns the n-th Fibonacci number."]
ids = [encode_prompt(tok, x) for x in texts]
out = {}
runs = {"ar": lambda x: autoregressive_generate(t, x, sampling=GREEDY, max_new_tokens=64),
        "spec_k4_reads": lambda x: speculative_generate(t, ModelDrafter(d, reads_target_cache=True), x, k=4, sampling=GREEDY, max_new_tokens=64),
        "spec_auto": lambda x: speculative_generate(t, ModelDrafter(d, reads_target_cache=True), x, k="auto", sampling=GREEDY, max_new_tokens=64),
        "tree_ngram": lambda x: tree_generate(t, NGramTreeDrafter(), x, sampling=GREEDY, max_new_tokens=64)}
for f in runs.values(): f(ids[1][:, :8])
for name_, f in runs.items():
    n, s, toks = 0, 0.0, []
    for x in ids:
        a = time.perf_counter(); g = f(x); s += time.perf_counter() - a; n += g.tokens.numel(); toks.append(g.tokens.tolist())
    out[name_] = {"tok_s": n / s, "tokens": toks}
print(json.dumps({k: v["tok_s"] for k, v in out.items()}))
json.dump(out, open(sys.argv[1], "w"))
