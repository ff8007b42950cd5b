"""The local launcher: distval starts `nproc` workers itself with torchrun's own elastic agent
(LocalElasticAgent via `elastic_launch`, c10d rendezvous on a free loopback port, restarts up to
`--max-restarts`), serves the rank channel's store, and runs the one monitor loop (deadline, a
worker's "do not restart" note, the hang watchdog, live views).

A failed job is diagnosed from what every rank published on the channel and how each process
exited (health/diagnose.py); the per-rank logs the agent redirects are only read for their last
lines. A launched script's output runs on this terminal, so its verdict follows as one line on
stderr (`distval: rank 1 died during start-up: ...`). Restarts (`--max-restarts`) are the agent's:
every worker is restarted after a failure, except where a worker's note says a restart cannot help
(a script's error of its own before its first optimizer step: launch/shim.py; distval's bad
checkpoint or crash loop), which stops the job at once.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable

from distval import device as devices
from distval.envvars import FR_DUMPS, scoped
from distval.health.diagnose import LOG_READ, TEARDOWN_EXITS, WorkerFailure, diagnose, in_startup
from distval.health.hang import HINTS, Hang, summary
from distval.health.heartbeat import flight_recorder_env
from distval.health.metrics import exporter_for
from distval.health.pauses import Pause
from distval.health.watchdog import Watchdog, stop_ranks
from distval.launch import channel as channels
from distval.launch import forkserver
from distval.launch.config import LaunchOptions
from distval.launch.job import JobResult, RankFn
from distval.launch.modes import planned_world_size
from distval.launch.monitor import MonitorLoop, Watcher
from distval.protocol import Kind
from distval.results import Status


def _quiet_elastic_logs() -> None:
    """torch's agent logs every worker start and stop; distval reports what matters itself. Its
    modules set their own levels, so every logger under these names is quietened."""
    import torch.distributed.elastic.agent.server.api  # noqa: F401 (creates its logger, level WARNING)

    prefixes = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
    for name in [*prefixes, *logging.root.manager.loggerDict]:
        if name.startswith(prefixes):
            logging.getLogger(name).setLevel(logging.CRITICAL)


class _Stopped(Exception):
    """Our SIGTERM arrived before torch's agent had installed its own signal handlers."""


_AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _local_entry(rank_fn: RankFn, cfg: Any, opts: LaunchOptions, from_server: bool = False,
                 environ: None = None) -> JobResult | None:
    """A worker of distval's own. `environ` was forkserver.Environ: unpickling it put the launching
    process's environment in place already."""
    if from_server:
        forkserver.in_worker()
    from distval.launch.worker import run_worker

    return run_worker(rank_fn, cfg, opts, "local")


def _script_entry(argv: list[str], cwd: str, from_server: bool = False, environ: None = None) -> None:
    """A launched script's worker started from the fork server: launch/shim.py's main, as
    `python -m distval.launch.shim ARGV` runs it in a new interpreter (shim.from_server). Only from
    the server: elsewhere a script's worker is that program (`_entry`)."""
    from distval.launch import shim

    shim.from_server(argv, cwd)


SAME_S = 1.0  # deaths seen this close to the first are in no known order (_ExitPeek.first_killed)


class _ExitPeek:
    """The order in which this process's multiprocessing workers die, as it happens (each one's
    sentinel, watched every `every_s`, without reading its exit code: torch's agent reads it).
    torch's agent reports only the first failure it finds among function workers: a rank killed by
    a signal, whose peers then fail on its closed connections, is otherwise named without its
    signal (or taken for one that ended well) whenever the agent finds a peer first. Program
    workers need no watch (torch's agent reports every one that has failed when it looks). A
    death wakes the thread at once. Every worker is also recorded as it starts (multiprocessing's
    set of children, swapped for one that records, until `close`): on a loaded host a job's
    workers can start, die and be joined by the agent between two looks (`every_s`), and are then
    seen together at `close`."""

    def __init__(self, every_s: float = 0.25):
        # in the order seen, each look's time (monotonic) and the workers it found dead
        self.deaths: list[tuple[float, list[multiprocessing.Process]]] = []
        self._watched: set[multiprocessing.Process] = set()  # every worker started (the agent's join forgets them)
        self._children = multiprocessing.process._children  # type: ignore[attr-defined]
        self._recording = _Recording(self._children, self._watched)
        multiprocessing.process._children = self._recording  # type: ignore[attr-defined]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), name="distval-exits", daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        while not self._stop.is_set():
            # multiprocessing's own set of this process's children: public listings poll them,
            # which would race the agent for a fork server's exit codes
            dead = self._seen()
            alive = [p for p in list(multiprocessing.process._children) if p not in dead]  # type: ignore[attr-defined]
            self._watched.update(alive)
            if not alive:
                self._stop.wait(every_s)
                continue
            ready = set(wait([p.sentinel for p in alive], every_s))
            if seen := [p for p in alive if p.sentinel in ready]:
                self.deaths.append((time.monotonic(), seen))

    def first_killed(self, said: dict[int, dict[str, Any] | None]) -> dict[int, int]:
        """{rank: -signal} when the first of this node's ranks to die was killed by a signal other
        than the teardown's SIGTERM, else {}. `said`: what each rank last published with its pid
        and host (its status or heartbeat). Asked once torch's agent has read every exit code.
        Deaths seen within `SAME_S` of the first are in no known order (a peer that failed on the
        killed rank's closed connection ends within milliseconds of it, and on a loaded host the
        fork server that reports each exit may report the peer's first): a signal among them came
        first."""
        here = socket.gethostname()
        ranks = {b["pid"]: r for r, b in said.items() if b and b.get("pid") and b.get("host") == here}
        looks = [(at, [p for p in seen if p.pid in ranks]) for at, seen in self.deaths]
        start = next((at for at, mine in looks if mine), None)
        first = [p for at, mine in looks if start is not None and start <= at <= start + SAME_S for p in mine]
        killed = [p for p in first if p.exitcode is not None and p.exitcode < 0 and p.exitcode != -signal.SIGTERM]
        return {ranks[killed[0].pid]: killed[0].exitcode} if killed else {}

    def close(self) -> None:
        """Once torch's agent is done with its workers. On a loaded host the agent's thread can
        find deaths, and end the job, before this one has had a turn to see them: those left are
        seen together, last (their exit codes are safe to read now)."""
        self._stop.set()
        self._thread.join()
        if multiprocessing.process._children is self._recording:  # type: ignore[attr-defined]
            self._children.clear()
            self._children.update(self._recording)
            multiprocessing.process._children = self._children  # type: ignore[attr-defined]
        if late := [p for p in self._watched - self._seen() if _ended(p)]:
            self.deaths.append((time.monotonic(), late))

    def _seen(self) -> set[multiprocessing.Process]:
        return {p for _, seen in self.deaths for p in seen}


class _Recording(set):
    """multiprocessing's set of a process's children (`process._children`: a worker is added as it
    starts, discarded as it is joined) that also records each one added into `into`."""

    def __init__(self, items: set, into: set):
        super().__init__(items)
        self._into = into

    def add(self, p: Any) -> None:
        super().add(p)
        self._into.add(p)


def _ended(p: multiprocessing.Process) -> bool:
    try:
        return p.exitcode is not None
    except ValueError:  # closed by its owner: its exit code is gone with it
        return False


class _StartupLoop:
    """A launched script's rank that dies of the same exit code or signal before its first
    optimizer step in two attempts running (os._exit, a crash in native code at import, the OOM
    killer at load): torch's agent would restart every worker into the same death up to
    --max-restarts times, so the job fails at the second (`found`: rank, exit code). An exception
    is caught earlier, in the rank itself (launch/shim.py's note: not restarted at all); this is
    for the deaths a rank cannot report. Judged from the agent's own report of each failed attempt
    (_AttemptFailed), before it restarts: every failed worker's exit code by global rank, read
    while their statuses are still that attempt's (`reader`: a channel reader of its own)."""

    def __init__(self, reader: channels.ChannelReader, world: int):
        self.reader, self.world = reader, world
        self.found: tuple[int, int] | None = None
        self._before: set[tuple[int, int]] = set()  # the attempt before's start-up deaths: (rank, exit code)

    def failed(self, failures: dict[int, tuple[int, int]]) -> bool:
        """`failures`: {rank: (pid, exit code or -signal)} of one failed attempt; True: not to be restarted."""
        statuses, beats = self.reader.all(self.world, Kind.STATUS), self.reader.all(self.world, Kind.HEARTBEAT)
        deaths = set()
        for rank, (pid, code) in failures.items():
            if code == 0 or code in TEARDOWN_EXITS:  # not a death of its own
                continue
            said = statuses.get(rank) if (statuses.get(rank) or {}).get("pid") == pid else None
            beat = beats.get(rank) if (beats.get(rank) or {}).get("pid") == pid else None
            # no status of this process: it died before the shim could say anything
            if said is None or in_startup(rank, {}, {rank: said}, {rank: beat}):
                deaths.add((rank, code))
        again, self._before = sorted(deaths & self._before), deaths  # one that got going: a restart may resume
        if again:
            self.found = again[0]
        return bool(again)


class _AttemptFailed:
    """torch's agent's report of each failed attempt, handed to `judge` before the agent restarts
    the workers; a True answer leaves it no restart, so the job fails with that attempt's failures.
    LocalElasticAgent._monitor_workers wrapped once per process; the agent running on this thread
    is the one judged (the agent runs in the thread that launches it). A torch whose agent names
    these otherwise is not judged: its restarts run as torch's agent counts them."""

    _judges: dict[int, Callable[[dict[int, tuple[int, int]]], bool]] = {}

    def __init__(self, judge: Callable[[dict[int, tuple[int, int]]], bool]):
        self.judge = judge

    def __enter__(self) -> None:
        from torch.distributed.elastic.agent.server.api import WorkerState
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

        monitor = getattr(LocalElasticAgent, "_monitor_workers", None)
        if monitor is not None and not getattr(monitor, "judged", False):
            def judged(agent: Any, group: Any) -> Any:
                result = monitor(agent, group)
                judge = _AttemptFailed._judges.get(threading.get_ident())
                if judge and result.state == WorkerState.FAILED and getattr(agent, "_remaining_restarts", 0) > 0:
                    if judge({r: (f.pid, f.exitcode) for r, f in result.failures.items()}):
                        agent._remaining_restarts = 0
                return result

            judged.judged = True  # type: ignore[attr-defined]
            LocalElasticAgent._monitor_workers = judged  # type: ignore[method-assign]
        self._judges[threading.get_ident()] = self.judge

    def __exit__(self, *exc: Any) -> None:
        self._judges.pop(threading.get_ident(), None)


def _start_method() -> str:
    """How the agent starts a job's workers: from the fork server (launch/forkserver.py) where that
    is safe, so that a worker starts with torch and distval already imported, else as torchrun
    does (`spawn` for distval's own, a script's as a new interpreter). Safe: Linux, no GPU (kept
    as torchrun starts them there), and every worker at one intra-op thread (OMP_NUM_THREADS=1, as
    the launcher sets it for more than one worker): the server's OpenMP read its thread count
    before this job chose one."""
    import torch

    safe = (sys.platform.startswith("linux") and os.environ.get("OMP_NUM_THREADS") == "1"
            and torch.cuda.device_count() == 0)
    return "forkserver" if safe else "spawn"


def _entry(entrypoint: Any, args: tuple) -> tuple[Any, tuple, str]:
    """(entrypoint, args, start method) for torch's agent, in the job's environment: distval's own
    workers and a script's from the fork server where it is safe (`_start_method`); else distval's
    spawned, a script's as the program `python -m distval.launch.shim SCRIPT ARGS`."""
    method = _start_method()
    if method == "forkserver":
        forkserver.start()
        return entrypoint, (*args, True, forkserver.Environ()), method
    if entrypoint is _script_entry:
        return sys.executable, ("-m", "distval.launch.shim", *args[0]), method
    return entrypoint, args, method


def run_local(rank_fn: RankFn, cfg: Any, opts: LaunchOptions, watchers: list[Watcher] | tuple = (),
              pauses: list[Pause] | None = None) -> JobResult:
    """`rank_fn(ctx, cfg)` on `opts.nproc` local workers; rank 0's gathered results."""
    devices.check_local_workers(opts.nproc or devices.default_nproc(), opts.backend)
    results = run_agent(_local_entry, (rank_fn, cfg, opts), opts, watchers, show_output=False, pauses=pauses)
    return results[0]


def run_script(script: str, args: list[str], opts: LaunchOptions, watchers: list[Watcher] | tuple = (),
               module: bool = False, pauses: list[Pause] | None = None) -> int:
    """A user's own script on `opts.nproc` local workers, as torchrun runs it (its output on this
    terminal), with the heartbeat and the hang watchdog attached (launch/shim.py). Returns the
    number of ranks; a failure or hang raises WorkerFailure naming the culprit."""
    target = ("-m", script) if module else (script,)
    devices.check_local_workers(opts.nproc or devices.default_nproc(), "any")  # the script picks its backend
    run_agent(_script_entry, ([*target, *args], os.getcwd()), opts, watchers, show_output=True, pauses=pauses)
    return planned_world_size(opts)


def run_agent(entrypoint: Any, args: tuple, opts: LaunchOptions, watchers: list[Watcher] | tuple,
              show_output: bool, pauses: list[Pause] | None = None) -> dict[int, Any]:
    """torchrun's elastic agent in this process: `entrypoint(*args)` on every worker (`_local_entry`
    or `_script_entry`, each started as `_entry` says), the rank channel's store, the monitor loop
    (deadline, no-restart notes, the hang watchdog, `watchers`); a failed or hung job becomes a
    WorkerFailure naming its cause. The pauses the watchdog saw the job survive (ranks outside any
    collective while the others waited: health/pauses.py) are appended to `pauses`."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    nproc = opts.nproc or devices.default_nproc()
    world = nproc * opts.nnodes
    _quiet_elastic_logs()
    # listening before any rank starts, and before anything is made that a busy port would leave behind
    exporter = exporter_for(opts.metrics_port, world, list(watchers))
    run_dir = tempfile.mkdtemp(prefix="distval-run-")
    if opts.nnodes > 1:  # the channel lives in the rendezvous endpoint's store, which every node reaches
        store, address = None, opts.rdzv_endpoint or ""
        reader = channels.ChannelReader(address)
    else:
        store, address = channels.serve()
        reader = channels.ChannelReader(store)
    logs = DefaultLogsSpecs(log_dir=os.path.join(run_dir, "logs"), redirects=Std.NONE if show_output else Std.ALL,
                            tee=Std.ALL if show_output else Std.NONE)
    config = LaunchConfig(
        min_nodes=opts.nnodes, max_nodes=opts.nnodes, nproc_per_node=nproc, run_id=opts.run_id,
        rdzv_backend="c10d", rdzv_endpoint=opts.rdzv_endpoint or "127.0.0.1:0",
        rdzv_configs={"timeout": int(max(opts.timeout_s, 30))}, max_restarts=opts.max_restarts, monitor_interval=0.1,
        start_method="spawn", local_addr=None if opts.nnodes > 1 else "127.0.0.1", logs_specs=logs,
        log_line_prefix_template="[rank${rank}]: ",  # a worker's lines name its global rank (torch: its role)
    )
    # The monitor stops the job the way a user's Ctrl-C would: SIGTERM to this process, whose
    # handler (torch's agent's, or ours until the agent has installed its own) stops every worker.
    # torch's agent never restores the handlers it installs: they are put back afterwards.
    saved_handlers = {sig: signal.getsignal(sig) for sig in _AGENT_SIGNALS}
    stop = lambda *_: os.kill(os.getpid(), signal.SIGTERM)  # noqa: E731
    watchdog = Watchdog(world, opts.hang, lambda hang: _abort(hang, stop)) if opts.hang else None
    exits = _ExitPeek()
    # a script's workers, restarted: each failed attempt judged before the agent restarts it
    loop = _StartupLoop(channels.ChannelReader(address), world) if opts.max_restarts and show_output else None
    monitor = MonitorLoop(reader, world, [*watchers, *([watchdog] if watchdog else []),
                                          *([exporter] if exporter else [])])
    if opts.deadline_s:
        monitor.stop_at(opts.deadline_s, stop)
    if opts.max_restarts:  # a worker that knows a restart cannot help (bad checkpoint, crash loop)
        monitor.on_no_restart(stop)
    if opts.deadline_s or opts.max_restarts or watchdog:
        def _raise_stopped(signum: int, frame: Any) -> None:
            raise _Stopped()

        signal.signal(signal.SIGTERM, _raise_stopped)
    # As torchrun does: one intra-op thread per worker unless the user chose, so N workers do
    # not fight over the cores (workers inherit the environment at start).
    env = {channels.ENV: address, **(flight_recorder_env() if watchdog else {})}  # the recorder: the heartbeats'
    if "OMP_NUM_THREADS" not in os.environ and nproc > 1:
        env["OMP_NUM_THREADS"] = "1"
    dumps = (os.path.join(run_dir, "frdumps"), opts.fr_dumps) if watchdog and opts.fr_dumps else None
    if dumps:  # a rank stopped by a verdict (or failing) writes its recorder's dump there
        os.makedirs(dumps[0], exist_ok=True)
        env[FR_DUMPS.name] = dumps[0]
    with scoped(env):  # the workers inherit it at their start; put back as it was after the job
        entrypoint, args, config.start_method = _entry(entrypoint, args)

        def launch() -> dict[int, Any]:
            with _AttemptFailed(loop.failed if loop else lambda failures: False):
                return elastic_launch(config, entrypoint)(*args)

        def after() -> None:  # the watchers stopped, torch's agent's signal handlers put back
            exits.close()
            monitor.close()
            if watchdog and pauses is not None:
                pauses.extend(watchdog.pauses)
            for sig, handler in saved_handlers.items():
                signal.signal(sig, handler)

        monitor.start()
        try:
            ended = _run(launch, after)
            return _Watched(reader, run_dir, world, show_output, monitor, watchdog, dumps, loop, exits,
                            opts.deadline_s).verdict(ended)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)


def _run(launch: Callable[[], dict[int, Any]], after: Callable[[], None]) -> _Ended:
    """How the job ended: `launch()` runs torch's agent, `after()` follows it whatever happened. A
    stop (SIGTERM: the deadline, a verdict, the user) may arrive while `after` runs, from a watcher
    that acted as the job ended: the job was stopped all the same."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        try:
            return _Ended(results=launch())
        except ChildFailedError as e:  # the agent's: one failure, the first it found
            return _Ended(exitcodes={r: f.exitcode for r, f in e.failures.items()})
        finally:
            after()
    except (SignalException, _Stopped):
        return _Ended(stopped=True)


@dataclass
class _Ended:
    """How torch's agent ended a job: with every worker's result, with the exit codes of a failed
    attempt (by global rank), or stopped by SIGTERM (the deadline, a no-restart note, the
    watchdog's verdict, or the user)."""
    results: dict[int, Any] | None = None
    exitcodes: dict[int, int] | None = None
    stopped: bool = False


@dataclass
class _Watched:
    """What the launch watched the job with; `verdict` turns how it ended into its results or the
    failure that names its cause, reading only what the watchers saw and the ranks published."""
    reader: channels.ChannelReader
    run_dir: str
    world: int
    show_output: bool
    monitor: MonitorLoop
    watchdog: Watchdog | None
    dumps: tuple[str, str] | None  # (where the ranks wrote their Flight Recorder dumps, where the user keeps them)
    loop: _StartupLoop | None
    exits: _ExitPeek
    deadline_s: float | None

    def verdict(self, ended: _Ended) -> dict[int, Any]:
        """In this order: the watchdog's hang or mismatch (found also as a job ended well: in its
        last collectives), the results, a worker's note that a restart cannot help, the deadline
        or the user's stop, the same start-up death twice, the failure the ranks' states name."""
        _raise_hang(self.watchdog, self.dumps)
        if ended.results is not None:
            return ended.results
        _raise_no_restart(self.monitor, self.reader, self.run_dir, self.world, self.show_output)
        if ended.stopped and self.monitor.deadline_expired:
            raise _said(_diagnose(self.reader, self.run_dir, self.world, {}, deadline_s=self.deadline_s),
                        self.show_output)
        if ended.stopped:
            raise KeyboardInterrupt
        if self.loop is not None and self.loop.found is not None:
            failure = _diagnose(self.reader, self.run_dir, self.world, dict([self.loop.found]))
            raise _said(_repeated(failure), self.show_output)
        exitcodes = dict(ended.exitcodes or {})
        beats = self.reader.all(self.world, Kind.HEARTBEAT)
        ranks = {**self.reader.all(self.world, Kind.STATUS), **{r: b for r, b in beats.items() if b}}
        exitcodes.update({r: c for r, c in self.exits.first_killed(ranks).items() if r not in exitcodes})
        raise _said(_diagnose(self.reader, self.run_dir, self.world, exitcodes), self.show_output)


def _abort(hang: Hang, stop: Callable[[], None]) -> None:
    """The watchdog's verdict: say it now, stop the agent (no restart into the same hang), and
    end every rank."""
    print(f"distval: {summary(hang)}", file=sys.stderr, flush=True)
    stop()
    stop_ranks(hang)


def _raise_hang(watchdog: Watchdog | None, dumps: tuple[str, str] | None) -> None:
    """The watchdog's verdict as the job's failure; `dumps`: (where the ranks wrote their Flight
    Recorder dumps, where the user keeps them)."""
    hang = watchdog.hang if watchdog else None
    if hang is not None:
        rank = hang.culprits[0] if hang.culprits else None
        status = next((row["status"] for row in hang.ranks if row["rank"] == rank), "") if rank is not None else ""
        text, details = summary(hang), hang.details()
        if dumps and (kept := _keep_dumps(*dumps)):
            text += f"; every rank's Flight Recorder dump is in {kept} (`distval diagnose {kept}`)"
            details["fr_dumps"] = kept
        raise WorkerFailure(rank, text, status or "", details, HINTS[hang.kind],
                            Status.ERROR if hang.hung else Status.FAIL)


def _keep_dumps(written: str, kept: str) -> str | None:
    """The ranks' dumps copied from the run's folder to the user's; None where no rank wrote one."""
    files = sorted(f for f in os.listdir(written) if not f.startswith(".")) if os.path.isdir(written) else []
    if not files:
        return None
    try:
        os.makedirs(kept, exist_ok=True)
        for name in files:
            shutil.copyfile(os.path.join(written, name), os.path.join(kept, name))
    except OSError as e:
        print(f"distval: could not keep the ranks' Flight Recorder dumps in {kept}: {e}", file=sys.stderr, flush=True)
        return None
    return kept


def _raise_no_restart(monitor: MonitorLoop, reader: channels.ChannelReader, run_dir: str, nproc: int,
                      show_output: bool) -> None:
    """A worker's note that restarting cannot help: a usage error (exit 2, one line), a finding
    about the training itself (exit 1: `--on-nan stop`) or a failure naming the cause (exit 3); a
    script's rank that died during start-up is named as the diagnosis names it (with every rank
    that died the same way)."""
    note = monitor.note or reader.no_restart_note(nproc)
    if note is None:
        return
    if note.get("exit_code") == 2:
        raise ValueError(note["no_restart"])
    found = _diagnose(reader, run_dir, nproc, {})
    if not (note.get("startup") and "startup" in found.details):
        found = WorkerFailure(note.get("rank"), note["no_restart"], "", found.details,
                              status=Status.FAIL if note.get("exit_code") == 1 else Status.ERROR)
    raise _said(found, show_output)


def _repeated(failure: WorkerFailure) -> WorkerFailure:
    """The same start-up death in two attempts running (_StartupLoop): the verdict says why no
    restart followed."""
    return WorkerFailure(failure.rank, failure.message, failure.last_status, failure.details, failure.hint,
                         failure.status, f"{failure}; the same in the attempt before: not restarted again")


def _said(failure: WorkerFailure, show_output: bool) -> WorkerFailure:
    """A launched script's verdict as one line after its output on this terminal (before the
    report; a hang's verdict was said as it was found). distval's own jobs: in the report only."""
    if show_output:
        print(f"distval: {failure}", file=sys.stderr, flush=True)
    return failure


def _diagnose(reader: channels.ChannelReader, run_dir: str, world: int, exitcodes: dict[int, int],
              deadline_s: float | None = None) -> WorkerFailure:
    """`exitcodes`: of this node's workers, by global rank (the agent's). The log tails are kept
    by local rank: read on one node only."""
    tails = {r: _log_tail(run_dir, r, LOG_READ) for r in range(world)} if world == len(_local_logs(run_dir)) else {}
    return diagnose(reader.all(world, Kind.STATE), reader.all(world, Kind.STATUS), exitcodes, tails, deadline_s,
                    reader.all(world, Kind.HEARTBEAT))


def _local_logs(run_dir: str) -> set[str]:
    """The local ranks this node's agent kept logs of."""
    return {p.parent.name for p in Path(run_dir, "logs").rglob("attempt_*/*/stderr.log")}


def _log_tail(run_dir: str, rank: int, lines: int) -> list[str]:
    # the last attempt's log (the agent numbers attempts 0, 1, ... when it restarts workers)
    for path in sorted(Path(run_dir, "logs").rglob(f"attempt_*/{rank}/stderr.log"),
                       key=lambda p: int(p.parent.parent.name.split("_")[1]), reverse=True):
        try:
            return [line for line in path.read_text(errors="replace").splitlines() if line.strip()][-lines:]
        except OSError:
            return []  # the log vanished with its worker: nothing to show
    return []
