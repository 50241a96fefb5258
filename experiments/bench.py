"""Side-by-side benchmark: our decoding loops against Hugging Face `generate` on one pair, in one process.

The pair comes from conf/model (--model for the model draft, --ngram for the n-gram drafter's settings),
the prompts from conf/dataset, the methods from experiments.contenders (same prompts, sampling,
max_new_tokens and seeds for all):
  ar               our target-only loop                 hf_plain             HF generate
  spec_model       our chain, model draft, fixed k      hf_assisted          HF assisted generation, same draft, k
  spec_model_auto  the same, k="auto" (k_max)           hf_assisted_default  the same at HF's defaults (dynamic)
  spec_model_shared(_auto)  the same (fixed k / auto), the draft reading the target's KV cache
  spec_model_wide  the same, k = tree nodes (when --nodes differs from --k)
  tree_model       our tree, top-b model branches
  tree_model_auto  the same, k="auto": depth and nodes per round (tree_model_shared_auto: reading the target's cache)
  spec_ngram       our chain, n-gram drafter, fixed k   hf_lookup            HF prompt lookup, same k
  spec_ngram_auto  the same, k="auto"                   hf_lookup_k2, _k8    HF prompt lookup, other fixed k
  spec_ngram_wide  the same, k = tree nodes             hf_lookup_default    HF prompt lookup at its defaults
  tree_ngram       our tree, an n-gram trie
  tree_ngram_auto  the same, k="auto"
  tree_hybrid      n-gram trie and model tree under one root
Every repetition runs every prompt through every contender, in an order rotated per repetition,
so machine drift hits all contenders alike; one warm-up pass is excluded. Ratios are per category
(median over repetitions), their geometric mean over categories, checked against experiments.goals.
bench.json also holds chain vs tree tokens per pass at equal width, the target's pass cost vs width
and, for k="auto", the cost model's predicted vs measured rate. At temperature > 0 the outputs are
samples, so the greedy equality check is skipped (bench.json says so).

    python -m experiments.bench --threads 1           # offline SmolLM2 pair, every category, greedy, 128 tokens
    python -m experiments.bench --threads 1 --temperature 1      # the same table at temperature 1
    python -m experiments.bench --scaling             # time per token vs max_new_tokens and prompt length
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from specdec.models import encode_prompt

from .bench_figures import contender_figures, cost_figures
from .bench_ratios import annotate_goals, ratios
from .bench_table import bench_table
from .contenders import CONTENDERS, Setting, bind, check_identical
from .goals import goal_entries
from .prompts import Prompt
from .records import machine, peak_rss_mb, reset_peak_rss, write_result
from .schedule import ForwardClock, Run, interleaved

CONF = Path(__file__).resolve().parents[1] / "conf"
DEFAULT_CONTENDERS = (  # what issue 9's ratios need; hf_plain, tree_hybrid and the *_wide chains on request
    "ar",
    "spec_model",
    "spec_model_auto",
    "tree_model",
    "tree_model_auto",
    "hf_assisted",
    "hf_assisted_default",
    "spec_ngram",
    "spec_ngram_auto",
    "tree_ngram",
    "tree_ngram_auto",
    "hf_lookup",
    "hf_lookup_k2",
    "hf_lookup_k8",
    "hf_lookup_default",
)
DEFAULT_CATEGORIES = "all"


def run_bench(
    setting: Setting,
    prompts: list[Prompt],
    ids: dict[str, torch.Tensor],
    *,
    contenders: tuple[str, ...] = DEFAULT_CONTENDERS,
    max_new_tokens: int = 128,
    repetitions: int = 1,
    seed: int = 0,
    max_width: int = 17,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Interleaved repetitions of every contender on every prompt (ids: prompt id -> (1, L)); bench.json."""
    names = [name for name in contenders if setting.draft is not None or not CONTENDERS[name].needs_draft]
    fns = {name: bind(name, setting) for name in names}
    clock = ForwardClock({"target": setting.target, "draft": setting.draft})
    for name in names:  # warm-up, excluded: first calls allocate, build kernels and caches
        fns[name](ids[prompts[0].id], min(8, max_new_tokens), seed)
    runs: dict[str, dict[str, list[Run]]] = {name: {p.id: [] for p in prompts} for name in names}
    for rep, prompt, name in interleaved(names, prompts, repetitions):
        run = clock.measure(fns[name], ids[prompt.id], max_new_tokens, seed + rep)
        runs[name][prompt.id].append(run)
        log(
            f"rep {rep} {prompt.id:16s} {name:20s} {len(run.tokens):4d} tok "
            f"{len(run.tokens) / run.seconds:6.1f} tok/s"
        )
    clock.remove()
    s = setting.sampling
    result = {
        "settings": {
            "k": setting.k,
            "k_max": setting.k_max,
            "nodes": setting.nodes,
            "auto_nodes": setting.auto_nodes,
            "branches": list(setting.branches),
            "temperature": s.temperature,
            "top_k": s.top_k,
            "top_p": s.top_p,
            "max_new_tokens": max_new_tokens,
            "repetitions": repetitions,
            "seed": seed,
            "max_ngram": setting.max_ngram,
            "min_ngram": setting.min_ngram,
            "eos_token_id": setting.eos,
            "prompts": [p.id for p in prompts],
        },
        "contenders": {name: contender_figures(runs[name], prompts) for name in names},
    }
    if s.greedy:
        outputs = {name: {pid: rs[0].tokens for pid, rs in runs[name].items()} for name in names}
        result["greedy_check"] = check_identical(outputs, reference="ar" if "ar" in names else names[0])
    else:
        result["greedy_check"] = {
            "identical": None,
            "skipped": f"temperature {s.temperature} > 0: outputs are samples (each loop draws its own random "
            "numbers), so equal outputs are not expected; exactness at T > 0 is what the chi-square tests check",
        }
    log("measuring the target's pass cost vs width")
    result["costs"] = cost_figures(setting.target, setting.draft, ids[prompts[0].id], setting.k, max_width)
    result["ratios"], result["best_configuration"] = ratios(result)
    result["goals"] = goal_entries(result["ratios"])
    annotate_goals(result["goals"], result["best"], setting.k)
    return result


# ---------------------------------------------------------------------------- configs and memory


def compose_config(*overrides: str) -> DictConfig:
    """The experiment config (conf/config.yaml) with these overrides, composed by Hydra, validated."""
    from .settings import validate

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["logger=none", *overrides])
    validate(cfg)
    return cfg


def configs(args: argparse.Namespace) -> tuple[DictConfig, DictConfig]:
    """(config of the model-draft pair, config of the n-gram pair) from the command line."""
    categories = "null" if args.categories == "all" else f"[{args.categories}]"
    common = [
        f"dataset={args.dataset}",
        f"dataset.categories={categories}",
        f"dataset.n_per_category={args.per_category}",
        f"k={args.k}",
        f"temperature={args.temperature}",
        f"max_new_tokens={args.max_new_tokens}",
        f"seed={args.seed}",
    ]
    model, ngram = (
        compose_config(f"model={args.model}", *common),
        compose_config(f"model={args.ngram}", *common),
    )
    if ngram.model.draft.kind != "ngram" or ngram.model.target.name != model.model.target.name:
        raise SystemExit(
            f"--ngram {args.ngram}: needs an n-gram pair with the target of --model {args.model}"
        )
    return model, ngram


def memory_of(contender: str, args: argparse.Namespace) -> dict:
    """Peak RSS of a fresh process that loads only what `contender` needs and runs it once on one prompt."""
    cmd = [
        sys.executable,
        "-m",
        "experiments.bench",
        "--memory-of",
        contender,
        "--model",
        args.model,
        "--ngram",
        args.ngram,
        "--dataset",
        args.dataset,
        "--categories",
        args.categories,
        "--per-category",
        str(args.per_category),
        "--k",
        str(args.k),
        "--k-max",
        str(args.k_max),
        "--nodes",
        str(args.nodes),
        "--auto-nodes",
        str(args.auto_nodes),
        "--temperature",
        str(args.temperature),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--threads",
        str(args.threads),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_memory_of(contender: str, setting: Setting, ids: torch.Tensor, n: int, seed: int) -> dict:
    loaded = peak_rss_mb()
    reset_peak_rss()  # restart the high-water mark after loading
    after_load = peak_rss_mb()
    bind(contender, setting)(ids, n, seed)
    return {"peak_rss_mb": peak_rss_mb(), "rss_after_loading_mb": after_load, "peak_while_loading_mb": loaded}


# ---------------------------------------------------------------------------- command line


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="model pair with a draft model, a conf/model entry")
    ap.add_argument("--ngram", default="smollm2_ngram", help="n-gram pair (same target), a conf/model entry")
    ap.add_argument("--dataset", default="bundled", help="prompt set, a conf/dataset entry")
    ap.add_argument("--categories", default=DEFAULT_CATEGORIES, help="comma-separated, or all")
    ap.add_argument("--per-category", type=int, default=1, help="prompts per category")
    ap.add_argument(
        "--k", type=int, default=4, help="draft tokens per round (gamma) of every fixed-k chain, ours and HF's"
    )
    ap.add_argument("--k-max", type=int, default=8, help='longest draft k="auto" may choose')
    ap.add_argument(
        "--nodes", type=int, default=4, help="tree node budget: a pass of nodes + 1 tokens, as a chain of k = nodes"
    )
    ap.add_argument("--auto-nodes", type=int, default=16, help='node limit of the k="auto" trees')
    ap.add_argument("--max-width", type=int, default=17, help="pass cost measured for widths 1..max-width")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (outputs are checked equal)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repetitions", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 keeps torch's default")
    ap.add_argument(
        "--contenders",
        default=",".join(DEFAULT_CONTENDERS),
        help=f"comma-separated subset of {', '.join(CONTENDERS)}",
    )
    ap.add_argument("--scaling", action="store_true", help="run the scaling study instead of the comparison")
    ap.add_argument("--no-memory", action="store_true", help="skip the per-contender memory subprocesses")
    ap.add_argument(
        "--memory-of", choices=list(CONTENDERS), help=argparse.SUPPRESS
    )  # internal: one memory run
    ap.add_argument("--out", type=Path, default=None, help="output folder (default bench_out/<timestamp>)")
    args = ap.parse_args(argv)
    unknown = set(args.contenders.split(",")) - set(CONTENDERS)
    if unknown:
        ap.error(f"--contenders: unknown {sorted(unknown)}; choices: {', '.join(CONTENDERS)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    from .pair import load_pair
    from .prompts import load_prompts
    from .settings import sampling_of

    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_cfg, ngram_cfg = configs(args)
    contenders = (args.memory_of,) if args.memory_of else tuple(args.contenders.split(","))
    needs_draft = any(CONTENDERS[name].needs_draft for name in contenders)
    pair = load_pair(model_cfg if needs_draft else ngram_cfg)  # the n-gram pair loads the target alone
    prompts = load_prompts(model_cfg.dataset)
    ids = {p.id: encode_prompt(pair.tokenizer, p.text, chat=model_cfg.dataset.chat) for p in prompts}
    sampling = sampling_of(model_cfg)
    setting = Setting(
        pair.target,
        pair.draft_model,
        k=args.k,
        sampling=sampling,
        eos=pair.eos_token_id,
        max_ngram=ngram_cfg.model.draft.max_ngram,
        min_ngram=ngram_cfg.model.draft.min_ngram,
        k_max=args.k_max,
        nodes=args.nodes,
        auto_nodes=args.auto_nodes,
    )
    if args.memory_of:
        print(
            json.dumps(
                run_memory_of(args.memory_of, setting, ids[prompts[0].id], args.max_new_tokens, args.seed)
            )
        )
        return {}
    out = args.out or Path("bench_out") / datetime.now().strftime("%Y%m%d-%H%M%S")
    print(f"writing to {out}", flush=True)
    command = "python -m experiments.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.scaling:
        from .bench_scaling import run_scaling, scaling_table

        first = ids[prompts[0].id]
        result = run_scaling(
            setting,
            first,
            lengths=[128, 256, 512, 1024],
            prompt_lengths=[128, 512, 1024],
            filler=first.repeat(1, 64),
            seed=args.seed,
            log=print,
        )
        result.update(machine=machine(), command=command)
        write_result(out, "scaling", result, scaling_table(result))
        return result
    result = run_bench(
        setting,
        prompts,
        ids,
        contenders=contenders,
        max_new_tokens=args.max_new_tokens,
        repetitions=args.repetitions,
        seed=args.seed,
        max_width=args.max_width,
        log=lambda s: print(s, flush=True),
    )
    result["settings"].update(
        model=args.model, ngram=args.ngram, dataset=args.dataset, draft=pair.draft_quantization if needs_draft else None
    )
    if needs_draft and pair.calibration is not None:  # model.draft.kind=calibrated: what it measured and chose
        cal = pair.calibration
        result["calibration"] = {"chosen": cal.chosen, "reason": cal.reason, "candidates": cal.rows()}
    if not args.no_memory:
        result["memory"] = {name: memory_of(name, args) for name in result["contenders"]}
    result.update(machine=machine(), command=command)
    table = bench_table(result)
    write_result(out, "bench", result, table)
    print(table)
    return result


if __name__ == "__main__":
    main()
