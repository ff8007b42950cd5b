"""Run a per-rank job and turn what comes back, results or a failure, into a Report."""

from __future__ import annotations

from typing import Any, Callable

from distval import launch, meta
from distval.launch import JobResult, LaunchOptions, RankFn, WorkerFailure
from distval.results import CannotRun, Check, Report, Status

_FAILURE_HINT = ("see the rank's last status and log lines in details; rerun with --timeout larger if the job is "
                 "just slow, or check that rank's host (memory, network) if it died")


def execute(command: str, rank_fn: RankFn, cfg: Any, opts: LaunchOptions,
            build: Callable[[JobResult], Report]) -> Report | None:
    """Return the report where it is made (None on ranks other than 0 under torchrun/Slurm). A
    rank that crashed or hung, or an environment that cannot run the job, becomes an ERROR check
    (exit code 3) instead of a traceback."""
    try:
        job = launch.run(rank_fn, cfg, opts)
    except WorkerFailure as e:
        report = Report(command, meta=meta.collect(None, cfg, launch=launch.detect_mode()))
        report.add(Check(f"{command} ranks", Status.ERROR, str(e), details=e.details, hint=_FAILURE_HINT,
                         where={"rank": e.rank, "status": e.last_status}))
        return report
    except CannotRun as e:
        report = Report(command, meta=meta.collect(None, cfg, launch=launch.detect_mode()))
        report.add(Check(f"{command} launch", Status.ERROR, str(e)))
        return report
    if job is None:
        return None
    return build(job)
