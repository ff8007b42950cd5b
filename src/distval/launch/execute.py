"""Run a per-rank job and turn what comes back, results or a failure, into a Report (`execute`:
every distval command that starts ranks); `run_script`: a user's own script under the watchdog
(`distval launch`), with its pre-flight (`check_script`)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

from distval import launch, meta
from distval.envvars import scoped
from distval.health.diagnose import WorkerFailure
from distval.health.pauses import Pause, check_rows
from distval.launch import JobResult, LaunchOptions, RankFn, Watcher
from distval.results import CannotRun, Check, Report, Status

_PAUSE_HINT = ("expected for an evaluation or a save on one rank; the others' wait is time lost on every rank: "
               "evaluate on every rank (each its share of the batches) or less often, save with "
               "torch.distributed.checkpoint (every rank writes its part). Not expected: details.pauses says where")
_FAILURE_HINT = ("see each rank's last status, progress and log lines in details; rerun with a larger --timeout if "
                 "the job is just slow, or check that rank's host (memory, network) if it died")


def execute(command: str, rank_fn: RankFn, cfg: Any, opts: LaunchOptions,
            build: Callable[[JobResult], Report], watchers: list[Watcher] | tuple = ()) -> Report | None:
    """Return the report where it is made (None on ranks other than 0 under torchrun/Slurm). A
    rank that crashed or hung, or an environment that cannot run the job, becomes an ERROR check
    (exit code 3) instead of a traceback; under an outer launcher a failed rank other than 0
    reports in one line (CannotRun) and leaves the report to rank 0, which names the rank that
    caused the failure from what every rank published on the rank channel."""
    mode = launch.detect_mode()
    pauses: list[Pause] = []
    try:
        job = launch.run(rank_fn, cfg, opts, watchers, pauses)
    except CannotRun as e:
        if mode != "local" and isinstance(e, WorkerFailure) and os.environ.get("RANK", "0") != "0":
            raise
        report = Report(command, meta=meta.collect(None, cfg, launch=mode, backend=opts.backend,
                                                   world_size=known_world_size(opts)))
        report.add(failure_check(command, e))
        return report
    if job is None:
        return None
    report = build(job)
    if pauses:
        report.add(pause_check(command, pauses))
    return report


def say_finding(found: Any) -> None:
    """A health finding made in the launching process, as one line on stderr at once (the
    monitor's findings made on rank 0 come the same way through train/progress.py)."""
    print(f"distval: health {found.status}: {found.summary}", file=sys.stderr, flush=True)


def failure_check(command: str, e: CannotRun) -> Check:
    """The one ERROR of a job that failed, hung or could not start (a FAIL where the job was
    stopped for a collective mismatch)."""
    failure = isinstance(e, WorkerFailure)
    return Check(f"{command} ranks" if failure else f"{command} launch", e.status if failure else Status.ERROR, str(e),
                 details=e.details if failure else {}, hint=(e.hint or _FAILURE_HINT) if failure else "",
                 where={"rank": e.rank, "status": e.last_status} if failure else {})


def pause_check(command: str, pauses: list[Pause]) -> Check:
    """A WARN for the pauses a job survived: ranks that ran outside any collective while the
    others waited for longer than the hang threshold (health/pauses.py)."""
    summary, details = check_rows(pauses)
    longest = max(pauses, key=lambda p: p.length_s)
    return Check(f"{command} pauses", Status.WARN, summary, details=details,
                 where={"rank": longest.culprits[0], "at": longest.place()}, hint=_PAUSE_HINT)


def check_script(script: str, module: bool, rdzv_backend: str = "c10d") -> None:
    """What `distval launch` needs before any worker starts (ValueError: one line, exit 2): a script
    file or an importable module, local workers of its own (not under torchrun), c10d."""
    if module:
        import importlib.util

        try:
            found = importlib.util.find_spec(script)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise ValueError(f"-m {script}: no such module here; give a module python -m could run")
    elif not os.path.isfile(script):
        raise ValueError(f"{script}: no such script; give the path of the Python file torchrun would run")
    if launch.detect_mode() != "local":
        raise ValueError("distval launch starts the workers itself: run it instead of torchrun, not under it")
    if rdzv_backend != "c10d":
        raise ValueError(f"--rdzv-backend {rdzv_backend}: distval launch meets by c10d rendezvous only; use c10d")


def run_script(script: str, args: list[str], opts: LaunchOptions, module: bool = False,
               trace: Any = None, health: Any = None) -> Report:
    """`distval launch`: a user's script on local workers under the watchdog (launch/local.py) and
    the health monitor (`health`, a HealthConfig: health/script.py, fed by each rank's probe);
    `trace` (a TraceConfig): its optimizer steps recorded, then analysed (trace/report.py)."""
    from distval.health.config import HealthConfig
    from distval.health.lost import LostTime
    from distval.health.probe import ENV as PROBE_ENV
    from distval.health.script import ScriptDetectors
    from distval.launch.local import run_script as run_local_script
    from distval.trace.capture import ENV as TRACE_ENV

    health = health or HealthConfig()
    started = time.monotonic()
    info = {"script": script, "module": module, "args": args, "launch": "local",
            "world_size": known_world_size(opts)}
    report = Report("launch", meta=meta.collect(None, None, **info))
    traced = trace is not None and trace.enabled
    env = {PROBE_ENV: f"{health.nan_every}:{health.replicas_every}"}  # the shim of every worker reads them (inherited
    if traced:  # through torchrun's agent)
        env[TRACE_ENV] = f"{trace.skip}:{trace.active}:{trace.dir}"
    lost = LostTime(info["world_size"] or 1, health, step=lambda reader: monitor.next_step, on_finding=say_finding)
    monitor = ScriptDetectors(info["world_size"] or 1, health, on_finding=say_finding, by_host=lost.by_host)
    pauses: list[Pause] = []
    try:
        with scoped(env):
            ranks = run_local_script(script, args, opts, watchers=[monitor, lost], module=module, pauses=pauses)
    except CannotRun as e:
        report.add(failure_check("launch", e))
        return report
    report.add(Check("launch script", Status.OK, f"{script} ended on all {ranks} ranks in "
                     f"{time.monotonic() - started:.1f} s, no hang"))
    monitor.report(report, lost.findings, lost.host_note())
    if pauses:
        report.add(pause_check("launch", pauses))
    if traced:
        from distval.trace.report import add_summary

        add_summary(report, trace.dir)
    return report


def known_world_size(opts: LaunchOptions) -> int | None:
    """The world size `opts` asks for, None where it cannot be known before the launch."""
    try:
        return launch.planned_world_size(opts)
    except (KeyError, ValueError, CannotRun):
        return None
