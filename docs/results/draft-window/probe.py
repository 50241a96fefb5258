"""A draft that attends only to the first S and the last W positions of a long context (python
docs/results/draft-window/probe.py): how often its greedy token is the full model's, the float32 target teacher-forced
over its own greedy continuation (64 tokens) of the 6 long prompts (conf/dataset/long.yaml). Its step would read a
fixed window of the cache instead of the whole context; this measures what that costs in acceptance."""
import torch
from omegaconf import OmegaConf

from experiments.run.prompts import load_prompts
from specdec.runtime.models import encode_prompt, load_model, load_tokenizer

torch.set_num_threads(2)
name = "offline:smollm2-135m-instruct"
tok = load_tokenizer(name)
model = load_model(name, dtype="float32").eval()
prompts = load_prompts(OmegaConf.load("conf/dataset/long.yaml"))
N = 64
windows = [(4, 256), (4, 512), (64, 512), (4, 1024)]
agree = {w: [0, 0] for w in windows}
for p in prompts:
    ids = encode_prompt(tok, p.text)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=N, do_sample=False)
        L = ids.shape[1]; T = out.shape[1]
        full = model(out).logits[0, L - 1:T - 1].argmax(-1)
        pos = torch.arange(T)
        for S, W in windows:
            vis = (pos[None, :] <= pos[:, None]) & ((pos[None, :] < S) | (pos[None, :] > pos[:, None] - W))
            mask = torch.where(vis, 0.0, float("-inf"))[None, None]
            got = model(out, attention_mask=mask).logits[0, L - 1:T - 1].argmax(-1)
            agree[(S, W)][0] += int((got == full).sum()); agree[(S, W)][1] += len(full)
    print(p.id, L, {f"{S}+{W}": round(a / n, 3) for (S, W), (a, n) in agree.items()}, flush=True)
