"""The bench's checks: its own config keys (bench.*) before anything loads, and the greedy output check after."""

from __future__ import annotations

from omegaconf import DictConfig

from specdec.sampling import Sampling

from ..run.settings import ConfigError, check_choice, check_int
from .ratios import check_identical
from .schedule import Run

DEFAULT = "default"  # the default run's own configuration: always a contender


def output_check(runs: dict[str, dict[str, list[Run]]], sampling: Sampling, reference: str) -> dict:
    """Greedy: every contender's first output per prompt against the reference's; sampling: skipped, said why."""
    names = list(runs)
    if not sampling.greedy:
        return {"identical": None,
                "skipped": f"temperature {sampling.temperature} > 0: outputs are samples (each loop draws its own random "
                "numbers), so equal outputs are not expected; exactness at T > 0 is what the chi-square tests check"}
    outputs = {name: {pid: rs[0].tokens for pid, rs in runs[name].items()} for name in names}
    return check_identical(outputs, reference=reference if reference in names else names[0])


def check_bench(b: DictConfig) -> None:
    """The bench group's own keys, before anything loads (a ConfigError names the key and what it takes)."""
    names = [DEFAULT, *b.contenders]
    check_int(b.repetitions, "bench.repetitions", 1)
    check_int(b.pass_widths, "bench.pass_widths", 1)
    check_choice(b.reference, tuple(names), "bench.reference")
    study = b.get("batching")
    if study:
        for name in study.contenders:
            check_choice(name, tuple(names), "bench.batching.contenders")
        if not len(study.sizes):
            raise ConfigError("bench.batching.sizes is empty: give batch sizes >= 1, e.g. [1, 2, 4, 8]")
        for size in study.sizes:
            check_int(size, "bench.batching.sizes", 1)
        for key in ("baseline", "speculative"):
            check_choice(study[key], tuple(study.contenders), f"bench.batching.{key}")
    if b.load:
        check_int(b.load.processes, "bench.load.processes", 1)
        for name in b.load.contenders:
            check_choice(name, tuple(names), "bench.load.contenders")
