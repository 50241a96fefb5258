"""RSS of make run's main table, method by method, in one process: after the pair's setup, after the warm-up, after a
trimmed heap (release_memory), and before / peak (the kernel's high-water mark, restarted) / after each method on the
first four bundled prompts. Run from the repository root: python docs/results/memory/per_method.py [overrides]."""

import sys

import psutil
from hydra import compose, initialize_config_dir

from experiments.run.app import Pairs, encode_prompt, load_prompts, plan_of, setup_of, warm_up
from experiments.run.jobs import CONF_DIR
from specdec.runtime.machine import peak_rss_mb, release_memory, reset_peak_rss


def rss() -> float:
    return psutil.Process().memory_info().rss / 2**20


with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    cfg = compose(config_name="config", overrides=["logger=none", *sys.argv[1:]])
plan = plan_of(cfg)
prompts = load_prompts(cfg.dataset)
setup = setup_of(cfg, Pairs(), plan)
print("after setup", round(rss()), flush=True)
warm_up(prompts[0], setup)
print("after warm up", round(rss()), flush=True)
release_memory()
print("after release", round(rss()), flush=True)
for prompt in prompts[:4]:
    ids = encode_prompt(setup.pair.tokenizer, prompt.text, chat=setup.plan.chat)
    for method in setup.plan.methods:
        before = rss()
        reset_peak_rss()
        setup.generate(method, ids, setup.plan.max_new_tokens)
        print(prompt.id, ids.shape[-1], method, "rss before", round(before), "peak", round(peak_rss_mb()), "after",
              round(rss()), flush=True)
release_memory()
print("after the prompts and a release", round(rss()), flush=True)
