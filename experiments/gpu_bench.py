"""GPU benchmark on a real-architecture pair with random weights (no downloads), for a session with a CUDA device.

Target: Llama-3-8B-shaped, draft: Llama-3.2-1B-shaped, both bf16 with random weights. Random weights give
meaningless text but real costs: it measures
  1. c = draft step / target step (one cached token, the Thm 3.8 cost ratio),
  2. the target's verification cost as k grows (one pass over k+1 tokens),
  3. the loops at greedy: target-only (ours, HF plain) and speculative with the draft equal to the target
     (alpha = 1 up to bf16 rounding, so all remaining cost is per-step overhead) and with the 1B draft,
     ours against HF assisted generation at the same fixed k.
Without CUDA it says so and exits 0.

    python -m experiments.gpu_bench --out bench_out/gpu       # about 3 minutes on an H200
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from specdec import GREEDY, ModelDrafter, autoregressive_generate, speculative_generate
from specdec.timing import forward_ms, stopwatch

SHAPES = {  # public architecture shapes; weights are random
    "llama3-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                  "rope_theta": 500000.0, "tie_word_embeddings": False},
    "llama3-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                  "rope_theta": 500000.0, "tie_word_embeddings": True},
    # --dry-run: the same code path on the CPU with toy shapes, to check the script before spending GPU time
    "tiny-target": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": False},
    "tiny-draft": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True},
}


def random_llama(shape: str, device: str) -> LlamaForCausalLM:
    """A bf16 Llama of the given shape with random weights, built directly on the device."""
    config = LlamaConfig(max_position_embeddings=8192, **SHAPES[shape])
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def timed(fn) -> tuple[float, torch.Tensor]:
    wall: dict[str, float] = {}
    with stopwatch(wall, "run"):
        tokens = fn()
    return wall["run"], tokens


def loops(target, draft, prompt: torch.Tensor, k: int, new: int, repeats: int) -> dict:
    """Tokens/s (median of repeats) of each loop; greedy outputs compared with ours target-only."""
    for m in (target, draft):
        m.generation_config.num_assistant_tokens = k
        m.generation_config.num_assistant_tokens_schedule = "constant"
        m.generation_config.assistant_confidence_threshold = 0.0
    hf = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False, "eos_token_id": None,
          "pad_token_id": 0, "attention_mask": torch.ones_like(prompt)}

    def hf_call(**kw):
        @torch.inference_mode()
        def call():
            return target.generate(prompt, **hf, **kw)[0, prompt.shape[-1]:]
        return call

    fns = {
        "ar": lambda: autoregressive_generate(target, prompt, sampling=GREEDY, max_new_tokens=new).tokens,
        "hf_plain": hf_call(),
        "spec_self": lambda: speculative_generate(target, ModelDrafter(target), prompt, k=k, sampling=GREEDY,
                                                  max_new_tokens=new).tokens,
        "hf_assisted_self": hf_call(assistant_model=target),
        "spec_1b": lambda: speculative_generate(target, ModelDrafter(draft), prompt, k=k, sampling=GREEDY,
                                                max_new_tokens=new).tokens,
        "hf_assisted_1b": hf_call(assistant_model=draft),
    }
    for fn in fns.values():
        fn()  # warm-up
    seconds = {name: [] for name in fns}
    outputs = {}
    for rep in range(repeats):
        for name in list(fns)[rep % len(fns):] + list(fns)[: rep % len(fns)]:
            s, tokens = timed(fns[name])
            seconds[name].append(s)
            outputs[name] = tokens.tolist()
    tps = {name: new / statistics.median(s) for name, s in seconds.items()}
    return {"tokens_per_second": tps,
            "identical_to_ar": {name: out == outputs["ar"] for name, out in outputs.items()},
            "ours_vs_hf": {"ar/hf_plain": tps["ar"] / tps["hf_plain"],
                           "spec_self/hf_assisted_self": tps["spec_self"] / tps["hf_assisted_self"],
                           "spec_1b/hf_assisted_1b": tps["spec_1b"] / tps["hf_assisted_1b"]}}


def markdown(r: dict) -> str:
    lines = [f"{r['date']}, {r['device']}, torch {r['torch']}, transformers {r['transformers']}", "",
             f"c = draft step / target step = {r['draft_step_ms']:.2f} / {r['target_step_ms']:.2f} ms = {r['c']:.3f}",
             "", "| k | target pass over k+1 tokens (ms) | / one step |", "|---|---|---|"]
    lines += [f"| {k} | {ms:.2f} | {ms / r['target_step_ms']:.2f} |" for k, ms in r["verify_ms_by_k"].items()]
    lines += ["", "| loop | tok/s | output equals ours target-only |", "|---|---|---|"]
    loop = r["loops"]
    lines += [f"| {n} | {t:.1f} | {loop['identical_to_ar'][n]} |" for n, t in loop["tokens_per_second"].items()]
    lines += ["", "| ours / HF | ratio |", "|---|---|"] + [f"| {n} | {v:.3f} |" for n, v in loop["ours_vs_hf"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="output folder (default bench_out/gpu-<timestamp>)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round for the loops")
    ap.add_argument("--context", type=int, default=512, help="prompt tokens (random ids)")
    ap.add_argument("--new-tokens", type=int, default=128, help="generated tokens per loop run (EOS ignored)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per loop, interleaved")
    ap.add_argument("--dry-run", action="store_true",
                    help="toy shapes on the CPU: checks the whole script in seconds; its numbers mean nothing")
    args = ap.parse_args(argv)
    if not (torch.cuda.is_available() or args.dry_run):
        print("no CUDA device: experiments/gpu_bench.py measures GPU costs and needs one; nothing measured "
              "(--dry-run checks the script on the CPU)")
        return 0
    device = "cpu" if args.dry_run else "cuda"
    shapes = ("tiny-target", "tiny-draft") if args.dry_run else ("llama3-8b", "llama3-1b")
    out = args.out or Path("bench_out") / datetime.now().strftime("gpu-%Y%m%d-%H%M%S")
    target, draft = random_llama(shapes[0], device), random_llama(shapes[1], device)
    vocab = SHAPES[shapes[0]]["vocab_size"]
    prompt = torch.randint(0, vocab, (1, args.context), generator=torch.Generator().manual_seed(0)).to(device)
    name = "cpu (dry run, toy shapes)" if args.dry_run else torch.cuda.get_device_name()
    r = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": name,
         "torch": torch.__version__, "transformers": transformers.__version__, "command": " ".join(sys.argv),
         "context": args.context, "k": args.k, "new_tokens": args.new_tokens}
    r["target_step_ms"] = forward_ms(target, prompt, 1, repeats=20, warmup=3)
    r["draft_step_ms"] = forward_ms(draft, prompt, 1, repeats=20, warmup=3)
    r["c"] = r["draft_step_ms"] / r["target_step_ms"]
    r["verify_ms_by_k"] = {k: forward_ms(target, prompt, k + 1, repeats=20, warmup=3) for k in (1, 2, 4, 8, 16)}
    print(json.dumps(r, indent=1), flush=True)
    r["loops"] = loops(target, draft, prompt, args.k, args.new_tokens, args.repeats)
    r["peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_bench.json").write_text(json.dumps(r, indent=2) + "\n")
    (out / "gpu_bench.md").write_text(markdown(r))
    print(markdown(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
