"""Side-by-side benchmark: our decoding loops against Hugging Face `generate` on one pair, in one process.

Contenders (same prompts, k, sampling, max_new_tokens and seeds):
  ar            our target-only loop                  hf_plain      HF generate
  spec_model    our speculative loop, model draft      hf_assisted   HF assisted generation, same draft, fixed k
  spec_ngram    our speculative loop, n-gram drafter   hf_lookup     HF prompt lookup, same k
Every repetition runs every prompt through every contender, in an order rotated per repetition,
so machine drift hits all contenders alike; one warm-up pass is excluded.

    python -m experiments.bench                       # offline SmolLM2 pair, writes bench_out/<time>/
    python -m experiments.bench --scaling             # time per token vs max_new_tokens and prompt length
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers
from transformers import GenerationConfig, PreTrainedModel

from specdec import (
    GREEDY,
    ModelDrafter,
    NGramDrafter,
    Sampling,
    autoregressive_generate,
    speculative_generate,
)
from specdec.metrics import expected_tokens_per_pass, walltime_improvement
from specdec.timing import forward_ms, stopwatch

HEADLINE = {  # ratio -> (ours, Hugging Face's), tokens/s over tokens/s
    "speedup_vs_hf_assisted": ("spec_model", "hf_assisted"),
    "speedup_vs_hf_prompt_lookup": ("spec_ngram", "hf_lookup"),
    "ar_vs_hf_plain": ("ar", "hf_plain"),
}
CONTENDERS = ("ar", "hf_plain", "spec_model", "hf_assisted", "spec_ngram", "hf_lookup")
OFFLINE = "offline:smollm2-135m-instruct"


@dataclass
class Prompt:
    id: str
    category: str
    ids: torch.Tensor  # (1, L)


@dataclass
class Run:
    """One contender on one prompt: the new tokens, wall seconds, seconds and calls inside each model, our Stats."""

    tokens: list[int]
    seconds: float
    model_seconds: dict[str, float]
    model_calls: dict[str, int]
    stats: dict | None = None


# ---------------------------------------------------------------------------- contenders


def hf_config(model: PreTrainedModel, sampling: Sampling, max_new_tokens: int, eos: int | None) -> GenerationConfig:
    """A generation config that states everything, so model defaults cannot differ between contenders."""
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        do_sample=not sampling.greedy,
        eos_token_id=eos,
        pad_token_id=eos if eos is not None else model.config.pad_token_id or 0,
    )
    if not sampling.greedy:
        config.update(temperature=sampling.temperature, top_k=sampling.top_k or None, top_p=sampling.top_p)
    else:
        config.update(temperature=None, top_k=None, top_p=None)
    return config


def fix_assistant_k(draft: PreTrainedModel, k: int) -> None:
    """HF reads these from the assistant's own generation config: constant k, no confidence early stop."""
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0


def make_contenders(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    *,
    k: int,
    sampling: Sampling,
    eos: int | None,
    max_ngram: int,
) -> dict[str, Callable[[torch.Tensor, int, int], tuple[torch.Tensor, dict | None]]]:
    """name -> fn(input_ids (1, L), max_new_tokens, seed) -> (new tokens (n,), our stats summary or None)."""
    ngram = NGramDrafter(max_ngram=max_ngram)

    def ours(fn, **kw):
        def call(ids, n, seed):
            g = fn(ids, sampling=sampling, max_new_tokens=n, eos_token_id=eos,
                   generator=torch.Generator().manual_seed(seed), **kw)
            return g.tokens, g.stats.summary()
        return call

    def hf(assistant_model: PreTrainedModel | None = None, **config):
        def call(ids, n, seed):
            torch.manual_seed(seed)
            generation_config = hf_config(target, sampling, n, eos)
            generation_config.update(**config)
            with torch.inference_mode():
                out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant_model,
                                      generation_config=generation_config)
            return out[0, ids.shape[-1]:], None
        return call

    fns = {
        "ar": ours(lambda ids, **kw: autoregressive_generate(target, ids, **kw)),
        "hf_plain": hf(),
        "spec_ngram": ours(lambda ids, **kw: speculative_generate(target, ngram, ids, k=k, **kw)),
        "hf_lookup": hf(prompt_lookup_num_tokens=k),
    }
    if draft is not None:  # None: a memory run of a contender that needs no draft model
        fix_assistant_k(draft, k)
        drafter = ModelDrafter(draft)
        fns["spec_model"] = ours(lambda ids, **kw: speculative_generate(target, drafter, ids, k=k, **kw))
        fns["hf_assisted"] = hf(assistant_model=draft)
    return {name: fns[name] for name in CONTENDERS if name in fns}


# ---------------------------------------------------------------------------- measurement


class ForwardClock:
    """Seconds and calls inside each model's forward, by hooks: what the models cost, for ours and HF's alike.

    Wall time minus this is the loop's own overhead (sampling, acceptance, cache bookkeeping, Python).
    """

    def __init__(self, models: dict[str, torch.nn.Module]):
        self.seconds = dict.fromkeys(models, 0.0)
        self.calls = dict.fromkeys(models, 0)
        self.handles = []
        for name, model in models.items():
            self.handles.append(model.register_forward_pre_hook(lambda *_, n=name: self._start(n)))
            self.handles.append(model.register_forward_hook(lambda *_, n=name: self._stop(n)))

    def _start(self, name: str) -> None:
        self.started = time.perf_counter()

    def _stop(self, name: str) -> None:
        self.seconds[name] += time.perf_counter() - self.started
        self.calls[name] += 1

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.calls = dict.fromkeys(self.calls, 0)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux VmHWM), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn, ids: torch.Tensor, n: int, seed: int, clock: ForwardClock) -> Run:
    clock.reset()
    wall: dict[str, float] = {}
    with stopwatch(wall, "run", ids.device):
        tokens, stats = fn(ids, n, seed)
    return Run(tokens.tolist(), wall["run"], dict(clock.seconds), dict(clock.calls), stats)


def summarize(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (length mismatch counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_identical(outputs: dict[str, dict[str, list[int]]], reference: str = "ar") -> dict:
    """Greedy decoding is deterministic and lossless: every contender must emit the reference's tokens."""
    mismatches = []
    for name, per_prompt in outputs.items():
        for pid, tokens in per_prompt.items():
            at = first_difference(tokens, outputs[reference][pid])
            if at is not None:
                mismatches.append({"contender": name, "prompt": pid, "first_difference": at})
    return {"identical": not mismatches, "reference": reference, "mismatches": mismatches}


# ---------------------------------------------------------------------------- the benchmark


def run_bench(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: list[Prompt],
    *,
    k: int = 4,
    sampling: Sampling = GREEDY,
    max_new_tokens: int = 128,
    repetitions: int = 3,
    seed: int = 0,
    eos: int | None = None,
    max_ngram: int = 3,
    contenders: tuple[str, ...] = CONTENDERS,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Interleaved repetitions of every contender on every prompt; returns the bench.json content."""
    fns = {name: fn for name, fn in make_contenders(
        target, draft, k=k, sampling=sampling, eos=eos, max_ngram=max_ngram).items() if name in contenders}
    names = list(fns)
    clock = ForwardClock({"target": target, "draft": draft})
    for name in names:  # warm-up, excluded: first calls allocate, build kernels and caches
        fns[name](prompts[0].ids, min(8, max_new_tokens), seed)
    runs: dict[str, dict[str, list[Run]]] = {name: {p.id: [] for p in prompts} for name in names}
    for rep in range(repetitions):
        for j, prompt in enumerate(prompts):
            shift = (rep * len(prompts) + j) % len(names)
            for name in names[shift:] + names[:shift]:  # round-robin start: no contender always runs first
                run = timed(fns[name], prompt.ids, max_new_tokens, seed + rep, clock)
                runs[name][prompt.id].append(run)
                log(f"rep {rep} {prompt.id:16s} {name:12s} {len(run.tokens):4d} tok {len(run.tokens) / run.seconds:6.1f} tok/s")
    clock.remove()
    result = {
        "settings": {"k": k, "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                     "max_new_tokens": max_new_tokens, "repetitions": repetitions, "seed": seed,
                     "max_ngram": max_ngram, "eos_token_id": eos, "prompts": [p.id for p in prompts]},
        "contenders": {name: contender_figures(runs[name], prompts) for name in names},
    }
    if sampling.greedy:
        outputs = {name: {pid: rs[0].tokens for pid, rs in runs[name].items()} for name in names}
        result["greedy_check"] = check_identical(outputs, reference=names[0])
    result["costs"] = cost_figures(target, draft, prompts[0].ids, k)
    result["ratios"] = ratios(result)
    return result


def contender_figures(per_prompt: dict[str, list[Run]], prompts: list[Prompt]) -> dict:
    """Throughput per repetition (all prompts pooled), per category, per prompt; memory; our stats pooled."""
    reps = len(next(iter(per_prompt.values())))
    runs = [r for rs in per_prompt.values() for r in rs]

    def pooled(ids: list[str]) -> list[float]:  # tokens/s of each repetition over the given prompts
        return [sum(len(per_prompt[i][r].tokens) for i in ids) / sum(per_prompt[i][r].seconds for i in ids)
                for r in range(reps)]

    categories = sorted({p.category for p in prompts})
    figures = {
        "tokens_per_second": summarize(pooled([p.id for p in prompts])),
        "by_category": {c: summarize(pooled([p.id for p in prompts if p.category == c])) for c in categories},
        "by_prompt": {p.id: {"tokens": len(per_prompt[p.id][0].tokens), **summarize(pooled([p.id]))} for p in prompts},
        "model_forward_share": sum(sum(r.model_seconds.values()) for r in runs) / sum(r.seconds for r in runs),
        "forwards_per_token": {m: sum(r.model_calls[m] for r in runs) / sum(len(r.tokens) for r in runs)
                               for m in runs[0].model_calls},
    }
    stats = [r.stats for r in runs if r.stats]
    if stats:
        def total(key):
            return sum(s[key] for s in stats)
        figures["stats"] = {
            "emitted": total("emitted"), "drafted": total("drafted"), "accepted": total("accepted"),
            "target_forwards": total("target_forwards"), "draft_forwards": total("draft_forwards"),
            "acceptance_rate": total("accepted") / total("drafted") if total("drafted") else None,
            "mean_accepted_length": total("emitted") / total("target_forwards"),
            "alpha": total("overlap_sum") / total("overlap_count") if total("overlap_count") else None,
            "seconds": {key: total(f"seconds_{key}") for key in ("prefill", "draft", "verify", "total")
                        if f"seconds_{key}" in stats[0]},
        }
    return figures


def cost_figures(target: PreTrainedModel, draft: PreTrainedModel, prefix: torch.Tensor, k: int) -> dict:
    """Measured step costs: c = draft step / target step, and the target's verification cost vs k."""
    target_ms = forward_ms(target, prefix, 1)
    draft_ms = forward_ms(draft, prefix, 1)
    verify_ms = {n - 1: forward_ms(target, prefix, n) for n in sorted({2, k + 1, 2 * k + 1})}
    return {"context_tokens": prefix.shape[-1], "target_step_ms": target_ms, "draft_step_ms": draft_ms,
            "c": draft_ms / target_ms, "target_verify_ms_by_k": verify_ms}


def decode_rate(figures: dict) -> float:
    """Tokens per second after the prefill, from our Stats pooled over every run."""
    seconds = figures["stats"]["seconds"]
    return figures["stats"]["emitted"] / (seconds["total"] - seconds["prefill"])


def ratios(result: dict) -> dict:
    """The headline ratios (higher is better) and the Thm 3.8 comparison."""
    c = result["contenders"]
    k = result["settings"]["k"]

    def tps(name: str, category: str | None = None) -> float:
        if name not in c:
            return float("nan")
        figures = c[name]["by_category"].get(category) if category else c[name]["tokens_per_second"]
        return figures["median"] if figures else float("nan")

    out = {ratio: tps(ours) / tps(hf) for ratio, (ours, hf) in HEADLINE.items()}
    speedup = tps("spec_model") / tps("ar")
    alpha = (c.get("spec_model", {}).get("stats") or {}).get("alpha")
    cost = result["costs"]
    if alpha is not None and "ar" in c:
        theory = walltime_improvement(min(alpha, 1.0), cost["c"], k)
        verify_ratio = cost["target_verify_ms_by_k"][k] / cost["target_step_ms"]
        refined = expected_tokens_per_pass(min(alpha, 1.0), k) / (k * cost["c"] + verify_ratio)
        decode = decode_rate(c["spec_model"]) / decode_rate(c["ar"])  # prefills excluded, as in the theory
        out.update(spec_model_vs_ar=speedup, alpha=alpha, c=cost["c"], theory_speedup=theory,
                   efficiency_vs_theory=speedup / theory, spec_model_vs_ar_decode_only=decode,
                   efficiency_vs_theory_decode_only=decode / theory, theory_speedup_with_verify_cost=refined,
                   efficiency_vs_theory_with_verify_cost=speedup / refined)
    out["spec_ngram_vs_ar"] = tps("spec_ngram") / tps("ar")
    for category in ("summarization", "retrieval"):
        rates = [tps(name, category) for name in ("spec_model", "spec_ngram")]
        best = max((r for r in rates if not math.isnan(r)), default=float("nan"))
        out[f"best_drafter_vs_ar_{category}"] = best / tps("ar", category)
    return out


# ---------------------------------------------------------------------------- output

TARGETS = {"speedup_vs_hf_assisted": 1.25, "speedup_vs_hf_prompt_lookup": 1.15, "ar_vs_hf_plain": 0.95,
           "efficiency_vs_theory": 0.9, "best_drafter_vs_ar_summarization": 2.0, "best_drafter_vs_ar_retrieval": 2.0}


def markdown(result: dict) -> str:
    s = result["settings"]
    head = (f"k={s['k']}, temperature={s['temperature']}, max_new_tokens={s['max_new_tokens']}, "
            f"repetitions={s['repetitions']}, prompts={len(s['prompts'])}")
    lines = [head, "",
             ("| contender | tok/s median | min | max | time in model forwards | target / draft forwards per token "
             "| mean accepted length | alpha | peak RSS (MB) |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for name, f in result["contenders"].items():
        t, st = f["tokens_per_second"], f.get("stats") or {}
        mal = st.get("mean_accepted_length")
        alpha = st.get("alpha")
        fpt = " / ".join(f"{v:.2f}" for v in f["forwards_per_token"].values())
        rss = result.get("memory", {}).get(name, {}).get("peak_rss_mb")
        lines.append(f"| {name} | {t['median']:.1f} | {t['min']:.1f} | {t['max']:.1f} | "
                     f"{100 * f['model_forward_share']:.0f}% | {fpt} | {'' if mal is None else f'{mal:.2f}'} | "
                     f"{'' if alpha is None else f'{alpha:.3f}'} | {'' if rss is None else f'{rss:.0f}'} |")
    lines += ["", "| ratio | value | target | met |", "|---|---|---|---|"]
    for key, value in result["ratios"].items():
        goal = TARGETS.get(key)
        met = "" if goal is None else ("yes" if value >= goal else "no")
        lines.append(f"| {key} | {value:.3f} | {'' if goal is None else f'>= {goal}'} | {met} |")
    check = result.get("greedy_check")
    if check:
        lines += ["", f"Greedy outputs identical across contenders: {check['identical']}"
                  + ("" if check["identical"] else f" (mismatches: {check['mismatches']})")]
    c = result["costs"]
    lines += ["", f"Costs at a {c['context_tokens']}-token context: target step {c['target_step_ms']:.1f} ms, "
              f"draft step {c['draft_step_ms']:.1f} ms (c = {c['c']:.3f}); target pass over k+1 tokens: "
              + ", ".join(f"k={kk}: {ms:.1f} ms" for kk, ms in c["target_verify_ms_by_k"].items())]
    return "\n".join(lines) + "\n"


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "processor": platform.processor() or platform.machine(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write(result: dict, out: Path, name: str, table: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(finite(result), indent=2) + "\n")
    (out / f"{name}.md").write_text(table)


def finite(x: object) -> object:
    """NaN (a ratio with a missing contender) becomes null, so bench.json stays strict JSON."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite(v) for v in x]
    return x


# ---------------------------------------------------------------------------- scaling


def run_scaling(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompt: torch.Tensor,
    *,
    k: int,
    lengths: list[int],
    prompt_lengths: list[int],
    filler: torch.Tensor,
    seed: int = 0,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Milliseconds per generated token vs max_new_tokens and vs prompt length (EOS ignored).

    Next to each loop's wall time per token: its time outside the model's forwards (the loop's own cost,
    which must not grow with the length) and the target's one-token step at the final context.
    """
    fns = make_contenders(target, draft, k=k, sampling=GREEDY, eos=None, max_ngram=3)
    names = ["ar", "hf_plain", "spec_ngram"]  # spec_model runs the same loop code as spec_ngram, slower
    clock = ForwardClock({"target": target})
    for name in names:
        fns[name](prompt, 4, seed)

    def row(ids: torch.Tensor, n: int) -> dict:
        r = {"prompt_tokens": ids.shape[-1], "new_tokens": n,
             "target_step_ms_at_end": forward_ms(target, torch.cat([ids, filler[:, :n]], dim=-1)[:, : ids.shape[-1] + n], 1, 5)}
        for name in names:
            run = timed(fns[name], ids, n, seed, clock)
            r[f"{name}_ms_per_token"] = 1000 * run.seconds / len(run.tokens)
            outside = run.seconds - sum(run.model_seconds.values())  # the loop's own time, load-robust
            r[f"{name}_overhead_ms_per_token"] = 1000 * outside / len(run.tokens)
            log(f"scaling L={ids.shape[-1]} n={n} {name} {r[f'{name}_ms_per_token']:.1f} ms/token")
        return r

    by_new = [row(prompt, n) for n in lengths]
    by_prompt = [row(torch.cat([filler[:, :L - prompt.shape[-1]], prompt], dim=-1), lengths[0])
                 for L in prompt_lengths if L >= prompt.shape[-1]]
    return {"k": k, "by_max_new_tokens": by_new, "by_prompt_length": by_prompt}


def scaling_markdown(result: dict) -> str:
    lines = []
    for key in ("by_max_new_tokens", "by_prompt_length"):
        rows = result[key]
        cols = list(rows[0])
        lines += [f"### {key}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |"
                  for r in rows]
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- memory


def memory_of(contender: str, args: argparse.Namespace) -> dict:
    """Peak RSS of a fresh process that loads only what `contender` needs and runs it once on the first prompt."""
    cmd = [sys.executable, "-m", "experiments.bench", "--memory-of", contender, "--model", args.model,
           "--draft", args.draft, "--prompts", str(args.prompts), "--categories", args.categories,
           "--k", str(args.k), "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_memory_of(contender: str, target: PreTrainedModel, draft: PreTrainedModel | None, prompt: Prompt,
                  args: argparse.Namespace, eos: int | None) -> dict:
    loaded = peak_rss_mb()
    Path("/proc/self/clear_refs").write_text("5")  # restart the high-water mark after loading
    after_load = peak_rss_mb()
    fn = make_contenders(target, draft, k=args.k, sampling=GREEDY, eos=eos, max_ngram=args.max_ngram)[contender]
    fn(prompt.ids, args.max_new_tokens, args.seed)
    return {"peak_rss_mb": peak_rss_mb(), "rss_after_loading_mb": after_load, "peak_while_loading_mb": loaded}


# ---------------------------------------------------------------------------- command line


def load_prompts(path: Path, tokenizer, categories: list[str], per_category: int) -> list[Prompt]:
    from specdec.models import encode_prompt

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    chosen = [r for c in categories for r in [r for r in rows if r["category"] == c][:per_category]]
    return [Prompt(r["id"], r["category"], encode_prompt(tokenizer, r["prompt"])) for r in chosen]


def load_draft(name: str, draft: str) -> PreTrainedModel:
    """Draft choices: nf4 (bf16 compute, fp32 unquantized parts), nf4-bf16 (also bf16 embeddings/head), bf16."""
    from specdec.models import load_model

    if draft == "nf4":
        return load_model(name, quantization="nf4", compute_dtype="bfloat16")
    if draft == "nf4-bf16":
        return load_model(name, dtype="bfloat16", quantization="nf4", compute_dtype="bfloat16")
    if draft == "bf16":
        return load_model(name, dtype="bfloat16")
    raise ValueError(f"unknown draft {draft!r}; choices: nf4, nf4-bf16, bf16")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=OFFLINE, help="target (hub id, folder or offline asset), fp32")
    ap.add_argument("--draft", default="nf4", help="draft built from the target: nf4 | nf4-bf16 | bf16")
    ap.add_argument("--prompts", type=Path, default=Path("data/prompts.jsonl"))
    ap.add_argument("--categories", default="summarization,retrieval,code,qa", help="comma-separated")
    ap.add_argument("--per-category", type=int, default=1, help="prompts per category")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round (gamma), the same for every contender")
    ap.add_argument("--max-ngram", type=int, default=3, help="longest suffix our n-gram drafter matches")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (outputs are checked equal)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 keeps torch's default")
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset to run")
    ap.add_argument("--scaling", action="store_true", help="run the scaling study instead of the comparison")
    ap.add_argument("--no-memory", action="store_true", help="skip the per-contender memory subprocesses")
    ap.add_argument("--memory-of", choices=CONTENDERS, help=argparse.SUPPRESS)  # internal: one memory run
    ap.add_argument("--out", type=Path, default=None, help="output folder (default bench_out/<timestamp>)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    from specdec.models import load_model, load_tokenizer

    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or Path("bench_out") / datetime.now().strftime("%Y%m%d-%H%M%S")
    tokenizer = load_tokenizer(args.model)
    target = load_model(args.model)
    needs_draft = args.memory_of in (None, "spec_model", "hf_assisted")
    draft = load_draft(args.model, args.draft) if needs_draft else None
    prompts = load_prompts(args.prompts, tokenizer, args.categories.split(","), args.per_category)
    if args.memory_of:
        print(json.dumps(run_memory_of(args.memory_of, target, draft, prompts[0], args, tokenizer.eos_token_id)))
        return {}
    sampling = Sampling(temperature=args.temperature) if args.temperature > 0 else GREEDY
    print(f"writing to {out}", flush=True)
    if args.scaling:
        filler = prompts[0].ids.repeat(1, 64)  # (1, >= 2048) real tokens to lengthen contexts
        result = run_scaling(target, draft, prompts[0].ids, k=args.k, lengths=[128, 256, 512, 1024],
                             prompt_lengths=[128, 512, 1024], filler=filler, seed=args.seed, log=print)
        result["machine"] = machine()
        result["command"] = "python -m experiments.bench " + " ".join(argv or sys.argv[1:])
        write(result, out, "scaling", scaling_markdown(result))
        return result
    result = run_bench(target, draft, prompts, k=args.k, sampling=sampling, max_new_tokens=args.max_new_tokens,
                       repetitions=args.repetitions, seed=args.seed, eos=tokenizer.eos_token_id,
                       max_ngram=args.max_ngram, contenders=tuple(args.contenders.split(",")),
                       log=lambda s: print(s, flush=True))
    result["settings"].update(model=args.model, draft=args.draft)
    if not args.no_memory:
        result["memory"] = {name: memory_of(name, args) for name in result["contenders"]}
    result["machine"] = machine()
    result["command"] = "python -m experiments.bench " + " ".join(argv or sys.argv[1:])
    table = markdown(result)
    write(result, out, "bench", table)
    print(table)
    return result


if __name__ == "__main__":
    main()
