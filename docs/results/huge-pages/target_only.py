"""Target-only greedy decoding of SmolLM2-135M on the compiled runtime (`runtime=auto`'s settings), 4 prompts x 64 new
tokens, 4 rounds after a warm-up: the median seconds a prompt, and how much of the process is on huge pages.
Run alternately with and without torch's huge pages (what load_model asks for, specdec.runtime.machine.use_huge_pages):
  for r in 1 2 3; do for thp in 0 1; do THP_MEM_ALLOC_ENABLE=$thp python docs/results/huge-pages/target_only.py; done; done
"""
import os
import statistics as st
import time

import torch

from specdec.auto.runtime import RuntimeOptions, put_on_runtime
from specdec.autoregressive import autoregressive_generate
from specdec.runtime.models import encode_prompt, load_model, load_tokenizer
from specdec.sampling import GREEDY

torch.set_num_threads(2)
name = "offline:smollm2-135m-instruct"
opts = RuntimeOptions(name="auto", widths=(16,), dynamic_width=True, packed_rows=(1, 16), cpp_wrapper=True, drafts=True)
t = load_model(name); put_on_runtime(t, opts, device="cpu", max_new_tokens=64)
tok = load_tokenizer(name)
prompts = ["Explain in two sentences why the sky is blue.", "Write a haiku about autumn leaves.",
           "List three uses of a paperclip.", "What is the capital of France? Answer briefly."]
ids = [encode_prompt(tok, p) for p in prompts]
for x in ids: autoregressive_generate(t, x, max_new_tokens=64, sampling=GREEDY)
a = []
for r in range(4):
    for x in ids:
        s = time.perf_counter(); autoregressive_generate(t, x, max_new_tokens=64, sampling=GREEDY); a.append(time.perf_counter() - s)
huge = [l for l in open('/proc/self/status') if 'HugePages' in l or 'AnonHuge' in l]
smaps = sum(int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages'))
print(f"THP={os.environ.get('THP_MEM_ALLOC_ENABLE','0')} median {st.median(a):.4f} mean {st.mean(a):.4f} anonhuge_kB {smaps}")
