"""The benchmark's scaling study: milliseconds per token vs max_new_tokens and vs prompt length.

python -m experiments.bench bench=scaling
"""

from __future__ import annotations

from omegaconf import DictConfig

from specdec.runtime.study import scaling_study

from ..records import markdown_table


def run_scaling(contenders: dict, prompt, scaling: DictConfig, *, seed: int = 0, log=print) -> dict:
    """specdec.runtime.study.scaling_study of the contenders (end tokens ignored) after prompt (1, L)."""
    runs = {name: (lambda ids, n, s, c=c: c.run(ids, n, s, stop_at_eos=False)) for name, c in contenders.items()}
    target = next(iter(contenders.values())).setup.pair.target
    return scaling_study(runs, target, prompt, list(scaling.lengths), list(scaling.prompt_lengths), seed, log)


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
