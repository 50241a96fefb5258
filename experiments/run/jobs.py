"""One job of `python -m experiments.run`, a single run or one job of a sweep (`-m`) on any Hydra launcher.

    python -m experiments.run -m k=1,2,4 hydra/launcher=joblib          # parallel local processes
    python -m experiments.run -m k=1,2,4 hydra/launcher=submitit_local  # submitit jobs on this machine
    python -m experiments.run -m k=1,2,4 hydra/launcher=submitit_slurm hydra.launcher.partition=gpu ...

What this module adds around experiments.run.app.run_experiment:
- threads: under a parallel launcher a job gets its share of the cores (cores // jobs running at once), so
  parallel jobs do not oversubscribe them (`threads=auto` or a larger count is lowered to that share);
- W&B: a sweep's runs share a group (the sweep folder's name) and a job type (the launcher), unless set;
- markers in the job's run folder: done.json, written last when the job finished, failed.json with the error
  when it raised; `skip_finished=true` (the default) skips a job whose folder holds a done.json for the same
  overrides, so a re-launched sweep (the same hydra.sweep.dir) runs only what did not finish;
- environment.json records the launcher next to the host, CPU flags or GPU, and thread count (records.machine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import hydra
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from specdec.runtime.machine import cores
from specdec.runtime.offline import prepare_in_background

from ..sweeps import expected_jobs, finished, mark_done, record_failure, start_afresh
from .pair import Pairs
from .schema import AUTO
from .settings import CONF_DIR

PARALLEL = ("joblib", "submitit_local")  # launchers that run a sweep's jobs side by side on this machine
KINDS = {"BasicLauncher": "basic", "JoblibLauncher": "joblib", "LocalLauncher": "submitit_local",
         "SlurmLauncher": "submitit_slurm"}  # launcher class -> kind, whatever config chose it (conf/hydra/launcher/)


def launcher_kind(settings: DictConfig) -> str:
    """basic, joblib, submitit_local or submitit_slurm: what runs the jobs, from the launcher config's _target_."""
    name = str(settings.get("_target_") or "BasicLauncher").rsplit(".", 1)[-1]
    return KINDS.get(name, name)


def jobs_at_once(launcher: str, settings: DictConfig, jobs: int) -> int:
    """How many of the sweep's jobs run side by side on this machine under this launcher."""
    if launcher == "joblib":
        n = settings.get("n_jobs") or -1
        return min(jobs, cores() if n < 0 else n)
    if launcher == "submitit_local":
        return jobs  # submitit's local executor starts every job of the array at once
    return 1


def threads_per_job(threads: int | str | None, launcher: str, settings: DictConfig, jobs: int) -> int | str | None:
    """The job's torch threads: its share of the cores under a parallel launcher (the configured count when it is
    lower), a Slurm job's cpus_per_task when given; otherwise the configured value unchanged."""
    if launcher == "submitit_slurm" and settings.get("cpus_per_task") and threads in (AUTO, None):
        return int(settings.cpus_per_task)
    if launcher not in PARALLEL:
        return threads
    share = max(1, (settings.get("cpus_per_task") or cores() // jobs_at_once(launcher, settings, jobs)))
    return share if threads in (AUTO, None) or int(threads) > share else threads


def prepare(cfg: DictConfig) -> dict:
    """Set the job's threads and W&B grouping from its launcher; what environment.json records about it."""
    hc = HydraConfig.get()
    launcher = launcher_kind(hc.launcher)
    sweep = hc.mode == RunMode.MULTIRUN
    jobs = len(expected_jobs(Path(hc.sweep.dir)) or [None]) if sweep else 1  # 1 where multirun.yaml is unreadable
    cfg.threads = threads_per_job(cfg.threads, launcher, hc.launcher, jobs)
    if sweep and cfg.logger.kind == "wandb":
        cfg.logger.group = cfg.logger.group or Path(hc.sweep.dir).name
        cfg.logger.job_type = cfg.logger.get("job_type") or launcher
    return {"launcher": launcher, "launcher_config": hc.runtime.choices.get("hydra/launcher"),
            "sweep": str(hc.sweep.dir) if sweep else None, "job_num": hc.job.num if sweep else None,
            "jobs_in_sweep": jobs, "threads_setting": cfg.threads, "pid": os.getpid(),
            "wandb_group": cfg.logger.get("group"), "wandb_job_type": cfg.logger.get("job_type")}  # fmt: skip


def run_job(cfg: DictConfig, pairs: Pairs) -> None:
    """One job: skipped if it already finished, else run; done.json last, or failed.json and the error re-raised
    (Hydra then reports it after the sweep's other jobs ran)."""
    from .app import run_experiment

    hc = HydraConfig.get()
    run_dir, overrides = Path(hc.runtime.output_dir), list(hc.overrides.task)
    if cfg.skip_finished and hc.mode == RunMode.MULTIRUN and finished(run_dir, overrides):
        print(f"skipped (finished earlier, skip_finished=true): {run_dir}", flush=True)
        return
    single = hc.mode == RunMode.RUN  # then=[...]: its models fetched and converted while this run computes
    later = prepare_in_background(then_models(cfg) if single else [])
    marked(run_dir, overrides, lambda: run_experiment(cfg, run_dir, overrides, pairs, prepare(cfg)))
    if single:
        print(folder_line(Path(os.path.relpath(run_dir)), cfg.logger), flush=True)
        for name in cfg.then:
            run_then(name, pairs)
    later and later.wait()


def then_models(cfg: DictConfig) -> list[str]:
    """The target and draft models that the experiments of cfg.then (conf/experiment/) load and this run does not."""
    def models(node: DictConfig) -> list[str]:
        return [name for name in (node.target.name, node.get("draft_name")) if name]

    own, thens = models(cfg.model), [compose("config", overrides=[f"experiment={name}"]).model for name in cfg.then]
    return [name for node in thens for name in models(node) if name not in own]


def marked(run_dir: Path, overrides: list[str], run: Callable[[], object]) -> None:
    """run() in a fresh run folder: done.json last, or failed.json with the error, re-raised."""
    start_afresh(run_dir)
    started = time.perf_counter()
    try:
        run()
    except Exception as e:
        record_failure(run_dir, overrides, e, time.perf_counter() - started)
        raise
    mark_done(run_dir, overrides, time.perf_counter() - started)


def run_then(name: str, pairs: Pairs) -> None:
    """`then=[name]`: the experiment conf/experiment/<name>.yaml after this run, in this process, composed as
    `python -m experiments.run experiment=<name> threads=null` composes it (threads as the run before chose them), into
    its own run folder (hydra.run.dir), config in .hydra/, log in run.log. The pair cache frees this run's models when
    the next loads another target."""
    from .app import run_experiment

    overrides = [f"experiment={name}", "threads=null"]  # a known name: validate checked `then` before the first run
    cfg = compose("config", overrides=overrides, return_hydra_config=True)
    run_dir = Path(os.path.relpath(cfg.hydra.run.dir))
    with open_dict(cfg):
        del cfg["hydra"]
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), run_dir / ".hydra" / "overrides.yaml")
    launch = {"launcher": "then (after a run, in its process)", "pid": os.getpid()}
    with log_file(run_dir / "run.log"):
        marked(run_dir, overrides, lambda: run_experiment(cfg, run_dir, overrides, pairs, launch))
    print(folder_line(run_dir, cfg.logger), flush=True)


@contextlib.contextmanager
def log_file(path: Path) -> Iterator[None]:
    """The root logger writes to path instead of the run's own log file while the block runs."""
    root = logging.getLogger()
    files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    handler = logging.FileHandler(path)
    handler.setFormatter(files[0].formatter if files else logging.Formatter("[%(asctime)s][%(name)s] %(message)s"))
    for h in files:
        root.removeHandler(h)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        for h in files:
            root.addHandler(h)


def folder_line(run_dir: Path, logger: DictConfig) -> str:
    """Where a single run wrote its files, and how to upload its offline W&B run."""
    line = f"Run folder: {run_dir}/ (summary.md, calibration.md, figures/)"
    if logger.kind == "wandb" and logger.get("mode") == "offline":
        runs = Path(logger.get("dir") or run_dir) / "wandb"
        line += f"; offline W&B run: {runs}/ (upload: wandb sync {runs}/offline-run-*)"
    return line


def main() -> None:
    """The Hydra app: one run per job; the jobs of a sweep in one process (the basic launcher) share a pair cache.
    A config error exits with 2 and its message in a single run; in a sweep it fails that job only."""
    pairs = Pairs()

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def job(cfg: DictConfig) -> None:
        try:
            run_job(cfg, pairs)
        except ValueError as e:  # a ConfigError, or an input the library refuses (its message names the fix)
            if HydraConfig.get().mode == RunMode.MULTIRUN:
                raise
            print(f"config error: {e}", file=sys.stderr)
            sys.exit(2)

    job()
