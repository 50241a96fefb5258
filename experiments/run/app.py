"""One experiment: a model pair over a prompt set, the target-only baseline next to the chosen methods.

    python -m experiments.run                         # offline default (conf/config.yaml), CPU
    python -m experiments.run model=gemma2 k=4        # a hub pair on a GPU
    python -m experiments.run -m k=1,2,4,8 temperature=0,0.7,1 quantization=none,nf4
    python -m experiments.run model=smollm2_ngram tree=ngram # a token tree per pass (conf/tree/)
    python -m experiments.run runtime=compiled               # torch.compile'd forwards (conf/runtime/)

For every prompt each method gets a fresh torch.Generator(seed) and the same max_new_tokens; one
short warm-up generation per method runs first and is not counted. Per-prompt rows are appended
to results.jsonl in the Hydra run folder as each prompt finishes, so an interrupted run (Ctrl-C)
keeps them; the summary table, figures and W&B run are written from whatever finished.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specdec import Stats
from specdec.auto.runtime import compiled_runtimes
from specdec.metrics import round_statistics
from specdec.quality import output_quality
from specdec.runtime.machine import peak_memory, release_memory
from specdec.runtime.models import encode_prompt

from ..records import append_rows, machine, pd, read_rows, write_json
from . import summary
from .logger import make_logger
from .methods import Setup, setup_of
from .pair import Pairs
from .prompts import Prompt, load_prompts
from .settings import Plan, plan_of

log = logging.getLogger(__name__)
LIST_FIELDS = (  # per-round detail kept for the summary's histograms and the figures
    "accepted_per_round", "drafted_at", "accepted_at", "reached_at", "chosen_k", "chosen_draft", "chosen_threads",
    "tree_nodes", "tree_depths",
)  # fmt: skip
ROUND_MEANS = ("chosen_k_mean", "plain_step_share", "tree_nodes_mean", "accepted_depth_mean")  # per prompt


def round_means(stats: Stats) -> dict[str, float | None]:
    """Per prompt: mean chosen k (chains), nodes per pass (trees), accepted depth (specdec.metrics.round_statistics);
    None where not drafted."""
    means = round_statistics([stats])[0]
    return {key: None if math.isnan(means.get(key, math.nan)) else means[key] for key in ROUND_MEANS}


def rows_of(prompts: list[Prompt], setup: Setup, batch: int | None = None) -> list[dict]:
    """Run every method on one prompt (batch None), or on one batch of prompts decoded together; one row per prompt
    and method with stats, quality, memory and text. A batch's rows hold each row's own counts and latency and the
    batch's wall time (throughput is every row's tokens over it)."""
    plan, pair = setup.plan, setup.pair
    ids = [encode_prompt(pair.tokenizer, p.text, chat=plan.chat) for p in prompts]  # (1, L_b) each
    outputs, memory = {}, {}
    for method in plan.methods:
        with peak_memory(plan.device) as memory[method]:
            outputs[method] = setup.generate(method, ids if batch is not None else ids[0], plan.max_new_tokens)
    rows, scored = [], {}  # identical outputs (greedy) are scored by the target once
    for b, prompt in enumerate(prompts):
        parts = {method: (out.tokens[b], out.rows[b]) if batch is not None else (out.tokens, out.stats)
                 for method, out in outputs.items()}  # fmt: skip
        reference = parts["autoregressive"][0] if plan.greedy else None
        for method, (tokens, stats) in parts.items():
            key = (b, tuple(tokens.tolist()))
            if key not in scored:
                scored[key] = output_quality(pair.target, ids[b], tokens, reference)
            whole = outputs[method].stats  # a batch's
            together = {} if batch is None else {"batch": batch, "batch_size": len(prompts),
                                                 "batch_seconds": whole.seconds["total"],
                                                 "batch_passes": whole.extras.get("passes")}  # fmt: skip
            rows.append({
                "prompt_id": prompt.id, "category": prompt.category, "method": method,
                "prompt_tokens": ids[b].shape[-1], **stats.summary(), **round_means(stats),
                **{name: list(getattr(stats, name)) for name in LIST_FIELDS}, **scored[key], **together,
                "weights_mb": pair.weights_mb(method), "peak_rss_mb": memory[method].rss_mb,
                "peak_cuda_mb": memory[method].cuda_mb,
                "text": pair.tokenizer.decode(tokens, skip_special_tokens=True),
            })  # fmt: skip
    return rows


def batches(prompts: list[Prompt], size: int) -> list[list[Prompt]]:
    """The prompts in order, grouped `size` at a time (the last group may be smaller)."""
    return [prompts[i : i + size] for i in range(0, len(prompts), size)]


def warm_up(prompt: Prompt, setup: Setup) -> None:
    """One short generation per method (allocator, kernels, caches), not recorded."""
    ids = encode_prompt(setup.pair.tokenizer, prompt.text, chat=setup.plan.chat)
    for method in setup.plan.methods:
        setup.generate(method, ids, setup.plan.warmup_tokens)


def run_keys(cfg: DictConfig, setup: Setup) -> dict:
    """The settings that tell runs of a sweep apart (saved with the summary for the report)."""
    pair, trees = setup.pair, setup.plan.trees
    return {
        "model": cfg.model.name,
        "draft": pair.draft,  # what drafts, from its config node
        "draft_cost": pair.drafter.draft_cost,  # per_token: a draft model; per_call: a lookup
        "target_quantization": pair.target_quantization,
        "draft_quantization": pair.draft_quantization,
        "method": cfg.method, "k": cfg.k, "k_max": cfg.k_max,
        "tree": type(setup.drafter).__name__ if trees else "none",
        "verify": type(setup.acceptance).__name__,  # the acceptance rule
        "tree_node_budget": cfg.tree.get("nodes") if trees else None,  # rows hold tree_nodes per round
        "tree_depth": cfg.tree.get("depth") if trees else None,
        "temperature": float(cfg.temperature), "top_k": cfg.top_k, "top_p": float(cfg.top_p),
        "max_new_tokens": cfg.max_new_tokens, "batch_size": cfg.batch_size, "seed": cfg.seed,
        "dataset": cfg.dataset.name, "device": cfg.device, "dtype": cfg.dtype, "threads": torch.get_num_threads(),
    }  # fmt: skip


def samples(rows: pd.DataFrame, prompts: list[Prompt]) -> pd.DataFrame:
    """Side by side: each prompt with the output of every method."""
    table = rows.pivot(index="prompt_id", columns="method", values="text")
    text = {p.id: p.text for p in prompts}
    table.insert(0, "prompt", [text[i] for i in table.index])
    return table.reset_index()


def summarize(run_dir: Path, plan: Plan, keys: dict, prompts: list[Prompt], logger) -> pd.DataFrame:
    """Table, metrics, histograms, figures and logs from the rows in results.jsonl."""
    rows = read_rows(run_dir / "results.jsonl")
    table, k, longest = summary.method_table(rows), plan.chain_k, plan.longest
    metrics, histograms = summary.run_metrics(table, rows, k, longest)
    sentences = summary.naive_sentence(table, plan.greedy) + summary.rounding_sentence(rows, plan.greedy)
    text = summary.write_summary(run_dir, keys, table, metrics, histograms, sentences, rows["prompt_id"].nunique())
    from .figures import run_figures  # matplotlib and seaborn (50 MB) load here, after the timed runs
    figures = run_figures(rows, metrics, histograms, k, longest, run_dir / "figures")
    scalar_rows = rows.drop(columns=list(LIST_FIELDS))
    logger.log_run(metrics, {"results": scalar_rows, "samples": samples(rows, prompts)}, figures, histograms)
    print(text)
    return table


def interrupt_on_sigterm() -> None:
    """Treat SIGTERM (a scheduler stopping the job) like Ctrl-C: keep results, close the W&B run."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def run_experiment(
    cfg: DictConfig, run_dir: Path, overrides: list[str] | None = None, pairs: Pairs | None = None,
    launch: dict | None = None,
) -> pd.DataFrame | None:
    """Validate, load prompts and the pair, run every prompt, then summarize; returns the method table.
    pairs: the pair cache of a sweep (its jobs share a pair while the weights stay the same); launch: how the
    job was launched (experiments.run.jobs.prepare), recorded in environment.json."""
    plan = plan_of(cfg)  # a bad value fails before any dataset or model loads
    prompts = load_prompts(cfg.dataset)
    setup = setup_of(cfg, pairs or Pairs(), plan)
    plan, pair, methods = setup.plan, setup.pair, setup.plan.methods
    if pair.target_quantization != "none":
        log.warning("the target is %s-quantized: its logits depend on the other tokens in a forward pass, so "
                    "speculative decoding reproduces its step-by-step output only approximately (see agreement)",
                    pair.target_quantization)
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**machine(plan.device), "launch": launch or {"launcher": "none (called in-process)"}}
    write_json(run_dir / "environment.json", env)
    summary.write_choices(run_dir, pair.threads, pair.calibration)  # threads.md, calibration.md: in the summary
    keys = run_keys(cfg, setup)
    config = {**OmegaConf.to_container(cfg, resolve=True), "overrides": overrides or [], "environment": env}
    schedule = f"tree{keys['tree']}-k{plan.tree_k}" if plan.trees else f"k{plan.k}"
    name = f"{keys['model']}-{keys['draft_quantization']}-{schedule}-T{keys['temperature']:g}"
    logger = make_logger(cfg.logger, run_dir, config, name)
    interrupted, done = False, 0
    interrupt_on_sigterm()
    try:
        warm_up(prompts[0], setup)
        batched = plan.batch_size > 1  # else one prompt at a time
        groups = batches(prompts, plan.batch_size)
        for index, group in enumerate(tqdm(groups, desc=f"{name} ({', '.join(methods)})",
                                           unit="batch" if batched else "prompt")):
            rows = rows_of(group, setup, index if batched else None)
            append_rows(run_dir / "results.jsonl", [{**keys, **row} for row in rows])
            for offset in range(len(group)):
                logger.log_prompt(done + offset, rows[offset * len(methods) : (offset + 1) * len(methods)])
            done += len(group)
    except KeyboardInterrupt:
        interrupted = True
        log.warning("interrupted after %d of %d prompts; summarizing those", done, len(prompts))
    summary.write_runtime(run_dir, compiled_runtimes(pair.target, setup.drafter))  # graphs compiled so far
    release_memory(plan.device)  # what the runs freed, before pandas, the plots and the logger's tables load
    try:
        table = summarize(run_dir, plan, keys, prompts, logger) if done else None
    finally:
        logger.finish(interrupted)
    if interrupted:
        raise SystemExit(130)
    return table
