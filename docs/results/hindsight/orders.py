"""How much of a prompt lookup the target's own text confirms, by match order: a replay of greedy outputs.

For the first bundled prompt of each category, SmolLM2-135M-Instruct writes up to 128 tokens greedily (target-only,
eager, to its end-of-sequence token). At every position of that text, NGramDrafter.replay asks what an 8-token lookup there would have proposed
and counts the proposed tokens the text then repeated, up to the first miss. The mean count, per category and per
match order (the longest suffix of 3, 2 or 1 tokens that occurred before; 0: no match, nothing proposed), is what
the online choice learns per context (specdec.choose.online).

    python docs/results/hindsight/orders.py > docs/results/hindsight/orders.json

Prints one JSON object.
"""

import json
import subprocess
from collections import defaultdict

import torch

torch.set_num_threads(2)
from specdec import GREEDY, NGramDrafter, autoregressive_generate  # noqa: E402
from specdec.runtime.models import encode_prompt, load_model, load_tokenizer  # noqa: E402

NAME, N, K = "offline:smollm2-135m-instruct", 128, 8

target, tokenizer, lookup = load_model(NAME), load_tokenizer(NAME), NGramDrafter(max_ngram=3)
firsts = {}
for line in open("data/prompts.jsonl"):
    row = json.loads(line)
    firsts.setdefault(row["category"], row)
result = {}
for category, row in firsts.items():
    ids = encode_prompt(tokenizer, row["prompt"])
    text = autoregressive_generate(target, ids, sampling=GREEDY, max_new_tokens=N,
                                   eos_token_id=tokenizer.eos_token_id).tokens.reshape(-1)
    seq = torch.cat([ids[0], text])
    hits = defaultdict(list)
    for t in range(ids.shape[1], seq.numel()):
        replay = lookup.replay(seq[:t], seq[t:].tolist(), K)
        if replay is not None:  # None: the text ended before it could tell (the last few positions)
            hits[replay[0]].append(int(sum(replay[1])))
    result[category] = {"tokens": text.numel()} | {str(order): {"positions": len(v), "mean_confirmed": round(sum(v) / len(v), 2)}
                        for order, v in sorted(hits.items())}
print(json.dumps({
    "by_category": result, "k": K, "max_new_tokens": N,
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "torch": torch.__version__,
}, indent=1))
