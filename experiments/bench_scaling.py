"""The benchmark's scaling study: milliseconds per token vs max_new_tokens and vs prompt length.

python -m experiments.bench --scaling
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec import GREEDY
from specdec.timing import forward_ms

from .contenders import Setting, bind
from .records import markdown_table
from .schedule import ForwardClock

SCALING_CONTENDERS = (
    "ar",
    "hf_plain",
    "spec_ngram",
)  # spec_model runs the same loop code as spec_ngram, slower


def run_scaling(
    setting: Setting,
    prompt: torch.Tensor,
    *,
    lengths: list[int],
    prompt_lengths: list[int],
    filler: torch.Tensor,
    seed: int = 0,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Milliseconds per generated token vs max_new_tokens and vs prompt length (greedy, EOS ignored).

    Next to each loop's wall time per token: its time outside the model's forwards (the loop's own cost,
    which must not grow with the length) and the target's one-token step at the final context.
    """
    setting = Setting(
        setting.target,
        None,
        k=setting.k,
        sampling=GREEDY,
        eos=None,
        max_ngram=setting.max_ngram,
        min_ngram=setting.min_ngram,
    )
    fns = {name: bind(name, setting) for name in SCALING_CONTENDERS}
    target = setting.target
    clock = ForwardClock({"target": target})
    for fn in fns.values():
        fn(prompt, 4, seed)

    def row(ids: torch.Tensor, n: int) -> dict:
        context = torch.cat([ids, filler[:, :n]], dim=-1)[:, : ids.shape[-1] + n]  # (1, L + n)
        r = {
            "prompt_tokens": ids.shape[-1],
            "new_tokens": n,
            "target_step_ms_at_end": forward_ms(target, context, 1, 5),
        }
        for name, fn in fns.items():
            run = clock.measure(fn, ids, n, seed)
            r[f"{name}_ms_per_token"] = 1000 * run.seconds / len(run.tokens)
            outside = run.seconds - sum(run.model_seconds.values())  # the loop's own time, load-robust
            r[f"{name}_overhead_ms_per_token"] = 1000 * outside / len(run.tokens)
            log(f"scaling L={ids.shape[-1]} n={n} {name} {r[f'{name}_ms_per_token']:.1f} ms/token")
        return r

    by_new = [row(prompt, n) for n in lengths]
    by_prompt = [
        row(torch.cat([filler[:, : L - prompt.shape[-1]], prompt], dim=-1), lengths[0])
        for L in prompt_lengths
        if L >= prompt.shape[-1]
    ]
    clock.remove()
    return {"k": setting.k, "by_max_new_tokens": by_new, "by_prompt_length": by_prompt}


def scaling_table(result: dict) -> str:
    lines = []
    for key in ("by_max_new_tokens", "by_prompt_length"):
        rows = result[key]
        columns = list(rows[0])
        lines += [
            f"### {key}",
            "",
            markdown_table(columns, [[r[c] for c in columns] for r in rows], fmt="{:.1f}"),
            "",
        ]
    return "\n".join(lines)
