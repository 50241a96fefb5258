"""The benchmark's scaling study: milliseconds per token vs max_new_tokens and vs prompt length.

python -m experiments.bench bench=scaling
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import DictConfig

from specdec.markdown import markdown_table
from specdec.runtime.probes import forward_ms
from specdec.runtime.study import ForwardClock

from .schedule import clocked


def run_scaling(
    contenders: dict, prompt: torch.Tensor, scaling: DictConfig, *, seed: int = 0,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Milliseconds per generated token vs max_new_tokens and vs prompt length (end tokens ignored), for the
    contenders (experiments.bench.Contender) after prompt (1, L); scaling: lengths, prompt_lengths.

    Next to each loop's wall time per token: its time outside the model's forwards (the loop's own cost,
    which must not grow with the length) and the target's one-token step at the final context. The prompt is
    lengthened by repeating itself in front of it.
    """
    target = next(iter(contenders.values())).setup.pair.target
    clock = ForwardClock({"target": target})
    runs = {name: (lambda ids, n, s, c=c: c.run(ids, n, s, stop_at_eos=False)) for name, c in contenders.items()}
    for run in runs.values():
        run(prompt, 4, seed)
    filler = prompt.repeat(1, 1 + max([*scaling.lengths, *scaling.prompt_lengths]) // prompt.shape[-1])

    def row(ids: torch.Tensor, n: int) -> dict:
        context = torch.cat([ids, filler[:, :n]], dim=-1)[:, : ids.shape[-1] + n]  # (1, L + n)
        r = {
            "prompt_tokens": ids.shape[-1],
            "new_tokens": n,
            "target_step_ms_at_end": forward_ms(target, context, 1, 5),
        }
        for name, run in runs.items():
            measured = clocked(clock, run, ids, n, seed)
            r[f"{name}_ms_per_token"] = 1000 * measured.seconds / len(measured.tokens)
            outside = measured.seconds - sum(measured.model_seconds.values())  # the loop's own time, load-robust
            r[f"{name}_overhead_ms_per_token"] = 1000 * outside / len(measured.tokens)
            log(f"scaling L={ids.shape[-1]} n={n} {name} {r[f'{name}_ms_per_token']:.1f} ms/token")
        return r

    lengths = list(scaling.lengths)
    by_new = [row(prompt, n) for n in lengths]
    by_prompt = [
        row(torch.cat([filler[:, : L - prompt.shape[-1]], prompt], dim=-1), lengths[0])
        for L in scaling.prompt_lengths
        if L >= prompt.shape[-1]
    ]
    clock.remove()
    return {"by_max_new_tokens": by_new, "by_prompt_length": by_prompt}


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
