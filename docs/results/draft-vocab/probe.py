"""A draft whose output layer covers only the N most frequent tokens (python docs/results/draft-vocab/probe.py): how
many of the target's own greedy tokens lie in that set, and what the int8 copy's output layer costs at N rows against
all 49,152. Frequencies: the assistant turns of ShareGPT conversations 100-2,099 (the long prompts are among the first
ten), tokenized by SmolLM2's tokenizer. Outputs: the float32 target's greedy continuations (64 tokens) of the 7
bundled prompts and the 6 long prompts. Such a draft's q is zero outside the set, which speculative sampling allows
(the output stays exact); a token outside it is rejected at once."""
import collections
import itertools
import statistics
import time

import torch
from omegaconf import OmegaConf

from experiments.run.prompts import load_prompts
from specdec.runtime.models import encode_prompt, load_model, load_tokenizer
from specdec.runtime.packed import PackedInt8Linear
from specdec.train.conversations import sharegpt

torch.set_num_threads(2)
NAME = "offline:smollm2-135m-instruct"
SIZES = (4096, 8192, 16384, 32768)
tok = load_tokenizer(NAME)
model = load_model(NAME, dtype="float32").eval()

counts = collections.Counter()
for turns in itertools.islice(sharegpt(), 100, 2100):
    for turn in turns:
        if turn["role"] == "assistant":
            counts.update(tok(turn["content"], add_special_tokens=False)["input_ids"])
ranked = [t for t, _ in counts.most_common()]
top = {n: set(ranked[:n]) for n in SIZES}
print(f"frequency corpus: {sum(counts.values())} tokens, {len(counts)} distinct")

sets = {  # conf/dataset/'s prompt sets; every bundled prompt, not one per category
    "bundled": OmegaConf.merge(OmegaConf.load("conf/dataset/bundled.yaml"), {"n_per_category": None}),
    "long": OmegaConf.load("conf/dataset/long.yaml"),
}
for label, spec in sets.items():
    outputs = []
    for p in load_prompts(spec):
        ids = encode_prompt(tok, p.text)
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=64, do_sample=False)
        outputs += out[0, ids.shape[1]:].tolist()
    cover = {n: sum(t in top[n] for t in outputs) / len(outputs) for n in SIZES}
    print(label, len(outputs), "tokens; share in the top N:", {n: round(c, 3) for n, c in cover.items()})

weight = model.get_output_embeddings().weight.detach()
layers = {}
for n in (*SIZES, weight.shape[0]):
    rows = torch.tensor(ranked[:n]) if n < weight.shape[0] else torch.arange(weight.shape[0])
    linear = torch.nn.Linear(weight.shape[1], n, bias=False)
    linear.weight = torch.nn.Parameter(weight[rows].clone(), requires_grad=False)
    layers[n] = PackedInt8Linear(linear)
x = torch.randn(1, weight.shape[1])
times = {n: [] for n in layers}
with torch.inference_mode():
    for _ in range(3):
        for layer in layers.values():
            layer(x)
    for _ in range(30):
        for n, layer in layers.items():
            start = time.perf_counter()
            layer(x)
            times[n].append(time.perf_counter() - start)
print("int8 output layer, one row, median ms of 30 interleaved:",
      {n: round(1000 * statistics.median(t), 3) for n, t in times.items()})
