"""Run a per-rank function on every rank; rank 0 gathers the results.

Three ways in (launch/modes.py), one code path after initialisation (launch/worker.py): in local
mode distval starts the workers with torchrun's elastic agent (launch/local.py); under torchrun,
Slurm or mpirun this process is one worker. Every rank function gets a `RankContext`
(distval/rank.py); its picklable return value is gathered to rank 0 over a Gloo control group,
and `run()` returns the list where the report is made: the calling process in local mode, rank 0
otherwise (None on other ranks). A rank that raises, dies or hangs becomes a `WorkerFailure`
naming the rank that caused it (health/diagnose.py), never an endless wait: collectives time out
after `timeout_s`, and the local launcher enforces an overall deadline.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from distval.launch.config import LaunchOptions
from distval.launch.job import JobResult, RankFn

if TYPE_CHECKING:
    from distval.launch.monitor import Watcher

# imported when first used, so that the command line reads LaunchOptions' flags without torch
_LAZY = {"check_world": "modes", "detect_mode": "modes", "first_slurm_host": "modes", "planned_world_size": "modes",
         "worker_env": "modes", "Watcher": "monitor"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"distval.launch.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run(rank_fn: RankFn, cfg: Any, opts: LaunchOptions, watchers: list[Watcher] | tuple = (),
        pauses: list | None = None) -> JobResult | None:
    """Run `rank_fn(ctx, cfg)` on every rank. `watchers` are fed by the monitor loop (the
    launching process locally, rank 0 under an outer launcher): live views such as progress.
    `pauses`: where the local watchdog appends the pauses the job survived (health/pauses.py)."""
    from distval import device as devices
    from distval.launch.modes import check_world, detect_mode, worker_env

    mode = detect_mode()
    if mode == "local":
        from distval.launch.local import run_local

        check_world(opts.nproc or devices.default_nproc(), opts.expect_world, {})
        return run_local(rank_fn, cfg, opts, watchers, pauses)
    from distval.envvars import scoped
    from distval.launch.worker import run_worker

    env = dict(os.environ)
    with scoped(worker_env(mode, env)):  # torch.distributed's variables from the outer launcher's
        check_world(int(os.environ["WORLD_SIZE"]), opts.expect_world, env)
        return run_worker(rank_fn, cfg, opts, mode, watchers)


__all__ = ["JobResult", "LaunchOptions", "RankFn", "Watcher", "check_world", "detect_mode", "first_slurm_host",
           "planned_world_size", "run", "worker_env"]
