"""GPU benchmark on a real-architecture pair with random weights (no downloads), for a CUDA device.

Target: Llama-3-8B-shaped, draft: Llama-3.2-1B-shaped, both bf16 with random weights. Random weights give
meaningless text but real costs: it measures
  1. c = draft step / target step (one cached token, the Thm 3.8 cost ratio),
  2. the target's verification cost as k grows (one pass over k+1 tokens),
  3. the target's pass cost vs width (1..17 tokens, then 24, 32, 48, 64): what a tree of n nodes costs;
  4. the loops at greedy: target-only (ours, HF plain) and speculative with the draft equal to the target
     (alpha = 1 up to bf16 rounding, so all remaining cost is per-step overhead) and with the 1B draft,
     ours at fixed k, at k="auto" and as a top-b token tree (fixed and k="auto") against HF assisted generation at the same
     fixed k and at its defaults; prompt lookup (chain at k="auto", n-gram trie) needs no draft.
     Tokens per target pass and, for k="auto", the cost model's predicted vs measured rate.
Without CUDA it says so and exits 0.

    python -m experiments.gpu_bench --out bench_out/gpu       # not timed yet with the tree and k=auto loops
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specdec.timing import forward_ms
from specdec.tiny import tiny_model

from .contenders import Setting, bind
from .records import machine, markdown_table, write_result
from .schedule import interleaved, timed

SHAPES = {  # public architecture shapes; weights are random
    "llama3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "n_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
    "llama3-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "n_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
    },
    # --dry-run: the same code path on the CPU with toy shapes, to check the script before spending GPU time
    "tiny-target": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "n_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "tie_word_embeddings": False,
    },
    "tiny-draft": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "n_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "tie_word_embeddings": True,
    },
}
LOOPS = {  # loop -> (contender, draft: "self" = the target drafts for itself, "small" = the 1B-shaped draft)
    "ar": ("ar", None),
    "hf_plain": ("hf_plain", None),
    "spec_self": ("spec_model", "self"),
    "hf_assisted_self": ("hf_assisted", "self"),
    "spec_1b": ("spec_model", "small"),
    "spec_auto_1b": ("spec_model_auto", "small"),
    "tree_1b": ("tree_model", "small"),
    "tree_auto_1b": ("tree_model_auto", "small"),
    "hf_assisted_1b": ("hf_assisted", "small"),
    "hf_assisted_default_1b": ("hf_assisted_default", "small"),
    "spec_ngram_auto": ("spec_ngram_auto", None),
    "tree_ngram": ("tree_ngram", None),
    "tree_ngram_auto": ("tree_ngram_auto", None),
    "hf_lookup_default": ("hf_lookup_default", None),
}
RATIOS = {
    "ar/hf_plain": ("ar", "hf_plain"),
    "spec_self/hf_assisted_self": ("spec_self", "hf_assisted_self"),
    "spec_1b/hf_assisted_1b": ("spec_1b", "hf_assisted_1b"),
    "spec_auto_1b/hf_assisted_default_1b": ("spec_auto_1b", "hf_assisted_default_1b"),
    "tree_1b/hf_assisted_default_1b": ("tree_1b", "hf_assisted_default_1b"),
    "tree_auto_1b/hf_assisted_default_1b": ("tree_auto_1b", "hf_assisted_default_1b"),
    "spec_ngram_auto/hf_lookup_default": ("spec_ngram_auto", "hf_lookup_default"),
    "tree_ngram/hf_lookup_default": ("tree_ngram", "hf_lookup_default"),
}
PASS_WIDTHS = (*range(1, 18), 24, 32, 48, 64)


def random_llama(shape: str, device: str) -> PreTrainedModel:
    """A bf16 Llama of the given shape with random weights, built directly on the device."""
    return tiny_model(
        "llama", seed=0, dtype=torch.bfloat16, device=device, max_position_embeddings=8192, **SHAPES[shape]
    )


def loop_stats(summary: dict | None) -> dict | None:
    """Tokens per target pass, tree size, the chosen k and the cost model's prediction of one of our runs."""
    if summary is None:
        return None
    rounds = summary["tree_rounds"]
    return {
        "tokens_per_pass": summary["mean_accepted_length"],
        "mean_tree_nodes": summary["tree_nodes_sum"] / rounds if rounds else None,
        "chosen_k_histogram": summary["chosen_k_histogram"],
        "predicted_tokens_per_second": summary["predicted_tokens_per_second"],
        "measured_tokens_per_second": summary["measured_tokens_per_second"],
    }


def loops(
    target, draft, prompt: torch.Tensor, k: int, new: int, repeats: int, k_max: int = 8, nodes: int = 7
) -> dict:
    """Tokens/s (median of repeats) of each loop; greedy outputs compared with our target-only (no EOS)."""
    settings = {
        which: Setting(target, model, k=k, k_max=k_max, nodes=nodes)
        for which, model in ((None, None), ("self", target), ("small", draft))
    }
    fns = {name: bind(contender, settings[which]) for name, (contender, which) in LOOPS.items()}
    for fn in fns.values():
        fn(prompt, new, 0)  # warm-up
    seconds = {name: [] for name in fns}
    outputs, stats = {}, {}
    for _, _, name in interleaved(list(fns), [prompt], repeats):
        run = timed(fns[name], prompt, new, 0)
        seconds[name].append(run.seconds)
        outputs[name], stats[name] = run.tokens, loop_stats(run.stats)
    tps = {name: len(outputs[name]) / statistics.median(s) for name, s in seconds.items()}
    return {
        "tokens_per_second": tps,
        "identical_to_ar": {name: out == outputs["ar"] for name, out in outputs.items()},
        "ours_vs_hf": {key: tps[a] / tps[b] for key, (a, b) in RATIOS.items()},
        "stats": {name: st for name, st in stats.items() if st is not None},
    }


def measured_vs_predicted(st: dict | None) -> list:
    """[tokens per pass, measured / predicted tokens/s] of one of our loops; None where it does not apply."""
    if st is None:
        return [None, None]
    predicted, measured = st["predicted_tokens_per_second"], st["measured_tokens_per_second"]
    ratio = None if math.isnan(predicted) else measured / predicted  # NaN: no round was predicted
    return [st["tokens_per_pass"], ratio]


def gpu_table(r: dict) -> str:
    """gpu_bench.md: c, verification cost vs k, the loops and ours over HF."""
    loop = r["loops"]
    return (
        "\n".join(
            [
                f"{r['date']}, {r['device']}, torch {r['torch']}, transformers {r['transformers']}",
                "",
                (
                    f"c = draft step / target step = {r['draft_step_ms']:.2f} / {r['target_step_ms']:.2f} ms "
                    f"= {r['c']:.3f}"
                ),
                "",
                markdown_table(
                    ["k", "target pass over k+1 tokens (ms)", "/ one step"],
                    [[k, ms, ms / r["target_step_ms"]] for k, ms in r["verify_ms_by_k"].items()],
                    fmt="{:.2f}",
                ),
                "",
                markdown_table(
                    ["width", "target pass (ms)", "/ one step"],
                    [[w, ms, ms / r["target_step_ms"]] for w, ms in r["pass_ms_by_width"].items()],
                    fmt="{:.2f}",
                ),
                "",
                markdown_table(
                    ["loop", "tok/s", "output equals ours target-only", "tokens per pass", "auto: measured / predicted"],
                    [
                        [n, t, str(loop["identical_to_ar"][n]), *measured_vs_predicted(loop["stats"].get(n))]
                        for n, t in loop["tokens_per_second"].items()
                    ],
                    fmt="{:.2f}",
                ),
                "",
                markdown_table(["ours / HF", "ratio"], [[n, v] for n, v in loop["ours_vs_hf"].items()]),
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", type=Path, default=None, help="output folder (default bench_out/gpu-<timestamp>)"
    )
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round for the fixed-k loops")
    ap.add_argument("--k-max", type=int, default=8, help='longest draft k="auto" may choose')
    ap.add_argument("--nodes", type=int, default=7, help="token-tree node budget (pass width nodes + 1)")
    ap.add_argument("--context", type=int, default=512, help="prompt tokens (random ids)")
    ap.add_argument("--new-tokens", type=int, default=128, help="generated tokens per loop run (EOS ignored)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per loop, interleaved")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="toy shapes on the CPU: checks the whole script in seconds; its numbers mean nothing",
    )
    args = ap.parse_args(argv)
    if not (torch.cuda.is_available() or args.dry_run):
        print(
            "no CUDA device: experiments/gpu_bench.py measures GPU costs and needs one; nothing measured "
            "(--dry-run checks the script on the CPU)"
        )
        return 0
    device = "cpu" if args.dry_run else "cuda"
    shapes = ("tiny-target", "tiny-draft") if args.dry_run else ("llama3-8b", "llama3-1b")
    out = args.out or Path("bench_out") / datetime.now().strftime("gpu-%Y%m%d-%H%M%S")
    target, draft = random_llama(shapes[0], device), random_llama(shapes[1], device)
    vocab = SHAPES[shapes[0]]["vocab_size"]
    prompt = torch.randint(0, vocab, (1, args.context), generator=torch.Generator().manual_seed(0)).to(device)
    env = machine(device)
    name = "cpu (dry run, toy shapes)" if args.dry_run else env["device_name"]
    r = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": name,
        "torch": torch.__version__,
        "transformers": env["packages"]["transformers"],
        "command": " ".join(sys.argv),
        "context": args.context,
        "k": args.k,
        "k_max": args.k_max,
        "nodes": args.nodes,
        "new_tokens": args.new_tokens,
    }
    r["target_step_ms"] = forward_ms(target, prompt, 1, repeats=20, warmup=3)
    r["draft_step_ms"] = forward_ms(draft, prompt, 1, repeats=20, warmup=3)
    r["c"] = r["draft_step_ms"] / r["target_step_ms"]
    r["verify_ms_by_k"] = {
        k: forward_ms(target, prompt, k + 1, repeats=20, warmup=3) for k in (1, 2, 4, 8, 16)
    }
    r["pass_ms_by_width"] = {w: forward_ms(target, prompt, w, repeats=20, warmup=3) for w in PASS_WIDTHS}
    print(json.dumps(r, indent=1), flush=True)
    r["loops"] = loops(target, draft, prompt, args.k, args.new_tokens, args.repeats, args.k_max, args.nodes)
    r["peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    r["machine"] = env
    write_result(out, "gpu_bench", r, gpu_table(r))
    print(gpu_table(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
