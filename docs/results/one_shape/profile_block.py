"""Profile of one block-verification call at batch 4 (the before/after check of its batch-4 ratio): model calls and
where the time goes. PYTHONPATH=<checkout>/src python docs/results/one_shape/profile_block.py"""
import cProfile, json, pstats, time

import torch
from specdec import GREEDY, BlockVerification, ModelDrafter, speculative_generate
try:
    from specdec.runtime.models import dynamic_int8_copy, encode_prompt, load_model, load_tokenizer
except ImportError:
    from specdec.models import dynamic_int8_copy, encode_prompt, load_model, load_tokenizer
torch.set_num_threads(1)
NAME = "offline:smollm2-135m-instruct"
target, tok = load_model(NAME), load_tokenizer(NAME)
draft = dynamic_int8_copy(load_model(NAME))
rows = [json.loads(l) for l in open(__file__.rsplit("/", 1)[0] + "/prompts.jsonl")][:4]
batch = [encode_prompt(tok, r["prompt"])[0] for r in rows]
configured = target.generation_config.eos_token_id
eos = sorted({tok.eos_token_id, *([configured] if isinstance(configured, int) else configured or [])})
run = lambda acc: speculative_generate(target, ModelDrafter(draft, reads_target_cache=True), batch, k=4, sampling=GREEDY, max_new_tokens=64, eos_token_id=eos, acceptance=acc)
run(BlockVerification())
for name, acc in (("block", BlockVerification()), ("token", None)):
    t = time.perf_counter(); out = run(acc); print(name, round(time.perf_counter() - t, 2), "s", out.stats.extras.get("passes"), "passes", out.stats.emitted)
pr = cProfile.Profile(); pr.enable(); run(BlockVerification()); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
