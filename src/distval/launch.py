"""Run a per-rank function on every rank; rank 0 gathers the results.

Three ways in, one code path after initialisation:
  local     distval starts `nproc` workers itself with torchrun's own elastic agent
            (LocalElasticAgent via `elastic_launch`, c10d rendezvous on a free loopback port);
            the parent process gets rank 0's gathered results back and renders the report.
  torchrun  we are one worker of an outer launcher that set RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*.
  slurm/mpi we are one task of `srun` (SLURM_PROCID, SLURM_STEP_NUM_TASKS, ...) or mpirun
            (OMPI_COMM_WORLD_*, PMI_*): the variables are mapped onto torch's.

In every mode the per-rank function gets a `RankContext` (rank, world size, device, the
instrumented `Comm`), its picklable return value is gathered to rank 0 over a Gloo control group,
and `run()` returns the list there (None on other ranks). A worker that raises, dies or hangs
becomes a `WorkerFailure` naming the rank and its last status, never an endless wait: collectives
time out after `timeout_s`, and the local launcher enforces an overall deadline.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from distval import device as devices
from distval.comm.layer import Comm
from distval.results import CannotRun, atomic_write_text


@dataclass
class LaunchOptions:
    nproc: int | None = None  # local mode only; None = number of GPUs, else 2
    backend: str = "auto"
    expect_world: int | None = None
    timeout_s: float = 60.0  # each collective, and rendezvous
    deadline_s: float | None = None  # the whole local job; None = no limit beyond timeouts
    max_restarts: int = 0  # local mode: the elastic agent restarts all workers up to N times after a failure

    def __post_init__(self) -> None:
        if self.nproc is not None and self.nproc < 1:
            raise ValueError(f"--nproc must be at least 1 (got {self.nproc})")
        if self.expect_world is not None and self.expect_world < 1:
            raise ValueError(f"--expect-world must be at least 1 (got {self.expect_world})")
        if self.timeout_s <= 0:
            raise ValueError(f"--timeout must be positive (got {self.timeout_s:g})")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"--deadline must be positive (got {self.deadline_s:g})")
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts must be 0 or more (got {self.max_restarts})")
        self.backend = devices.check_backend(self.backend)


@dataclass
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any
    comm: Comm
    control: Any  # a separate Gloo group for bookkeeping (agreement, timing barriers, gathering)
    hostname: str
    run_dir: str | None = None
    last_status: str = "started"
    control_comm: Comm | None = None

    def status(self, text: str) -> None:
        """Say what this rank is about to do: named in the error if it dies or hangs here."""
        self.last_status = text
        if self.run_dir:
            _write_json(Path(self.run_dir) / f"status.{self.rank}.json", {"status": text, "time": time.time()})

    def exchange(self, value: int) -> list[int]:
        """Every rank's small integer (a tiny all-gather on the control group): how ranks agree
        on a decision that only some of them could make alone."""
        values = torch.zeros(self.world_size, dtype=torch.int64)
        self.control_comm.all_gather(values, torch.tensor([value], dtype=torch.int64))
        return values.tolist()


class PeerFailed(RuntimeError):
    """Raised on the ranks that were fine when another rank failed: not the cause."""


class WorkerFailure(CannotRun):
    def __init__(self, rank: int | None, message: str, last_status: str = "", details: dict | None = None):
        self.rank, self.message, self.last_status = rank, message, last_status
        self.details = details or {}
        who = f"rank {rank}" if rank is not None else "a worker"
        where = f" (last status: {last_status})" if last_status else ""
        super().__init__(f"{who} failed: {message}{where}")


# -- mode detection --------------------------------------------------------------------------


def detect_mode(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torchrun"
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env and int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        return "slurm"
    if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        return "mpi"
    return "local"


def planned_world_size(opts: LaunchOptions, env: dict[str, str] | None = None) -> int:
    """The world size the job will have, known before launching (to validate flags early)."""
    env = dict(os.environ if env is None else env)
    mode = detect_mode(env)
    if mode == "local":
        return opts.nproc or devices.default_nproc()
    return int(worker_env(mode, env).get("WORLD_SIZE") or env["WORLD_SIZE"])


def worker_env(mode: str, env: dict[str, str]) -> dict[str, str]:
    """torch's rank variables for a Slurm or MPI task (torchrun's are used as they are)."""
    if mode == "slurm":
        out = {
            "RANK": env["SLURM_PROCID"],
            "WORLD_SIZE": env["SLURM_STEP_NUM_TASKS"],
            "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
            "MASTER_ADDR": env.get("MASTER_ADDR") or first_slurm_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")),
            "MASTER_PORT": env.get("MASTER_PORT") or str(29500 + int(env.get("SLURM_JOB_ID", "0")) % 1000),
        }
    elif mode == "mpi":
        rank = env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK"))
        size = env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE"))
        if "MASTER_ADDR" not in env:
            raise CannotRun("launched by mpirun but MASTER_ADDR is not set; export MASTER_ADDR=<first host> (and MASTER_PORT) with mpirun -x")
        out = {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": env.get("OMPI_COMM_WORLD_LOCAL_RANK", env.get("MPI_LOCALRANKID", "0")),
               "MASTER_ADDR": env["MASTER_ADDR"], "MASTER_PORT": env.get("MASTER_PORT", "29500")}
    else:
        return {}
    return {k: str(v) for k, v in out.items()}


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: 'gpu[03-05,9],cpu1' -> 'gpu03'."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise CannotRun(f"cannot read the Slurm node list {nodelist!r}; set MASTER_ADDR")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def check_world(world_size: int, expect_world: int | None, env: dict[str, str]) -> None:
    """Fail fast on the "world of one": every process thinks it is alone (nccl-tests without
    MPI=1, srun without task variables...), which otherwise runs N copies of a 1-rank job."""
    if expect_world is not None and world_size != expect_world:
        alone = world_size == 1
        raise CannotRun(
            f"expected a world of {expect_world} ranks but this process sees WORLD_SIZE={world_size}"
            + (" (each process found itself alone)" if alone else "")
            + "; launch with `torchrun --nproc-per-node N`, `srun --ntasks N distval ...`, or `distval ... --nproc N`"
        )


# -- running -----------------------------------------------------------------------------------


RankFn = Callable[[RankContext, Any], Any]


@dataclass
class JobResult:
    """What rank 0 gathered: every rank's return value and facts about it, in rank order."""

    mode: str
    backend: str
    world_size: int
    results: list[Any]
    ranks: list[dict[str, Any]]

    @property
    def hosts(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for info in self.ranks:
            out.setdefault(info["host"], []).append(info["rank"])
        return out


def run(rank_fn: RankFn, cfg: Any, opts: LaunchOptions) -> JobResult | None:
    """Run `rank_fn(ctx, cfg)` on every rank; return the gathered results where the report is
    made: the calling process in local mode, rank 0 otherwise (None on other ranks). A failed
    rank raises WorkerFailure (in local mode: diagnosed across all ranks)."""
    mode = detect_mode()
    if mode == "local":
        check_world(opts.nproc or devices.default_nproc(), opts.expect_world, {})
        return _run_local(rank_fn, cfg, opts)
    env = dict(os.environ)
    os.environ.update(worker_env(mode, env))
    check_world(int(os.environ["WORLD_SIZE"]), opts.expect_world, env)
    return _worker(rank_fn, cfg, opts, None, mode)


def _worker(rank_fn: RankFn, cfg: Any, opts: LaunchOptions, run_dir: str | None, mode: str) -> JobResult | None:
    rank = int(os.environ["RANK"])
    ctx: RankContext | None = None
    try:
        timeout = datetime.timedelta(seconds=opts.timeout_s)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = devices.device_for(opts.backend, local_rank)
        if mode != "local":  # an advertised address no peer can reach: an ERROR naming it now, not a hang at init
            from distval.netcheck import preflight
            preflight(os.environ, timeout_s=min(opts.timeout_s, 5.0))
        _init_process_group(opts.backend, timeout)
        # Bookkeeping (agreeing, gathering results, timing barriers) always goes over its own
        # Gloo group, so it can never pair with, or be counted as, the traffic being measured.
        control = dist.new_group(backend="gloo", timeout=timeout)
        ctx = RankContext(rank, dist.get_world_size(), local_rank, opts.backend, device, Comm(), control,
                          socket.gethostname(), run_dir)
        ctx.control_comm = Comm(group=control, name="control", fault=None)
        if run_dir:
            Path(run_dir, f"state.{rank}.json").unlink(missing_ok=True)  # a previous attempt's, after a restart
            _dump_state_on_sigterm(ctx)
        ctx.status("running")
        result = rank_fn(ctx, cfg)
        ctx.status("gathering results")
        gathered: list[Any] | None = [None] * ctx.world_size if rank == 0 else None
        dist.gather_object((ranks_info(ctx), result), gathered, dst=0, group=control)
        if gathered is None:
            return None
        return JobResult(mode, opts.backend, ctx.world_size, [r for _, r in gathered], [i for i, _ in gathered])
    except Exception as e:
        error = f"{type(e).__name__}: {e}".strip()
        status = ctx.last_status if ctx else "initialising"
        if run_dir:
            _dump_state(run_dir, rank, ctx, error=error, traceback_text=traceback.format_exc(limit=8))
        raise WorkerFailure(rank, error, status) from e
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _init_process_group(backend: str, timeout: datetime.timedelta) -> None:
    """init_process_group, except after an elastic restart: the agent's store outlives the
    attempt, and the previous attempt's Gloo addresses in it would be read as this one's
    (connection refused). Keys of attempt N go under their own prefix."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    world_size = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"/distval/attempt_{attempt}", store),
                            rank=int(os.environ["RANK"]), world_size=world_size, timeout=timeout)


def _dump_state(run_dir: str, rank: int, ctx: RankContext | None, error: str | None = None,
                traceback_text: str = "") -> None:
    """What a rank was doing when it failed or was stopped: read by `_diagnose`. Progress counts
    the collectives issued on both the measured and the control group: ranks run the same program,
    so the one that issued fewer is the one the others are waiting for."""
    comms = [c for c in (ctx.comm, ctx.control_comm) if c is not None] if ctx else []
    last = ctx.comm.last() if ctx else None
    _write_json(Path(run_dir) / f"state.{rank}.json", {
        "rank": rank, "time": time.time(), "error": error, "status": ctx.last_status if ctx else "initialising",
        "issued": sum(c.issued for c in comms), "pending": [r.to_dict() for c in comms for r in c.pending()],
        "last_op": last.to_dict() if last else None, "traceback": traceback_text,
    })


def _dump_state_on_sigterm(ctx: RankContext) -> None:
    """The agent stops every worker with SIGTERM once one has failed (or at the deadline): leave
    a note of where this rank was first, so a hung rank can be told from the ones waiting on it."""
    def handler(signum: int, frame: Any) -> None:
        _dump_state(ctx.run_dir, ctx.rank, ctx)
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


def _local_entry(rank_fn: RankFn, cfg: Any, opts: LaunchOptions, run_dir: str) -> JobResult | None:
    return _worker(rank_fn, cfg, opts, run_dir, "local")


def _quiet_elastic_logs() -> None:
    for name in ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


class _DeadlineExpired(Exception):
    """The --deadline timer fired before torch's agent had installed its own signal handlers."""


_AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _run_local(rank_fn: RankFn, cfg: Any, opts: LaunchOptions) -> JobResult:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    nproc = opts.nproc or devices.default_nproc()
    _quiet_elastic_logs()
    run_dir = tempfile.mkdtemp(prefix="distval-run-")
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"distval-{os.getpid()}",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", rdzv_configs={"timeout": int(max(opts.timeout_s, 30))},
        max_restarts=opts.max_restarts, monitor_interval=0.05, start_method="spawn", local_addr="127.0.0.1",
        logs_specs=DefaultLogsSpecs(log_dir=os.path.join(run_dir, "logs"), redirects=Std.ALL),
    )
    # torch's agent installs handlers for these that it never restores; ours stand in until it
    # does (a deadline during rendezvous) and are put back afterwards.
    saved_handlers = {sig: signal.getsignal(sig) for sig in _AGENT_SIGNALS}
    timed_out = threading.Event()
    timer = None
    if opts.deadline_s or opts.max_restarts:
        def _raise_deadline(signum: int, frame: Any) -> None:
            raise _DeadlineExpired()

        signal.signal(signal.SIGTERM, _raise_deadline)
    if opts.deadline_s:
        def _expire() -> None:
            timed_out.set()
            os.kill(os.getpid(), signal.SIGTERM)  # the agent's handler stops every worker

        timer = threading.Timer(opts.deadline_s, _expire)
        timer.daemon = True
        timer.start()
    # A worker that knows a restart cannot help (bad checkpoint, crash loop) leaves a note; the
    # agent would restart anyway, so we stop it the way the deadline does.
    stop_watching = threading.Event()
    if opts.max_restarts:
        def _watch() -> None:
            while not stop_watching.wait(0.05):
                if Path(run_dir, _NO_RESTART).exists():
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

        threading.Thread(target=_watch, daemon=True).start()
    # As torchrun does: one intra-op thread per worker unless the user chose, so N workers do
    # not fight over the cores (spawned workers inherit the environment at start).
    saved_omp = os.environ.get("OMP_NUM_THREADS")
    if saved_omp is None and nproc > 1:
        os.environ["OMP_NUM_THREADS"] = "1"
    try:
        try:
            results = elastic_launch(config, _local_entry)(rank_fn, cfg, opts, run_dir)
        finally:
            stop_watching.set()
            if timer:
                timer.cancel()
            for sig, handler in saved_handlers.items():
                signal.signal(sig, handler)
        return results[0]
    except ChildFailedError as e:
        _raise_no_restart(run_dir, nproc)
        raise _diagnose(run_dir, nproc, {r: f.exitcode for r, f in e.failures.items()}) from None
    except (SignalException, _DeadlineExpired):
        _raise_no_restart(run_dir, nproc)
        if timed_out.is_set():
            raise _diagnose(run_dir, nproc, {}, deadline_s=opts.deadline_s) from None
        raise KeyboardInterrupt from None
    finally:
        if saved_omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        shutil.rmtree(run_dir, ignore_errors=True)


_NO_RESTART = "no_restart.json"  # written by distval.ckpt.checkpointer (NO_RESTART_FILE)


def _raise_no_restart(run_dir: str, nproc: int) -> None:
    """A worker's note that restarting cannot help: a usage error (exit 2, one line) or a failure
    naming the cause (exit 3)."""
    note = _read_json(Path(run_dir) / _NO_RESTART)
    if note is None:
        return
    if note.get("exit_code") == 2:
        raise ValueError(note["message"])
    failure = _diagnose(run_dir, nproc, {})
    raise WorkerFailure(None, note["message"], "", failure.details)


_SECONDARY = ("timed out", "timeout", "connection closed", "pair closure", "connection reset", "broken pipe",
              "peerfailed")
_CLOSED = ("connection closed", "connection reset", "broken pipe", "pair closure")


def _secondary(error: str) -> bool:
    """True for the errors a rank gets because a peer failed (timeouts, closed connections,
    PeerFailed), as opposed to an error of its own."""
    return any(s in error.lower() for s in _SECONDARY)


def _diagnose(run_dir: str, nproc: int, exitcodes: dict[int, int], deadline_s: float | None = None) -> WorkerFailure:
    """Name the rank that caused a failed local run, from every rank's state file (written on
    error or when the agent stopped it) and status file. In order: a rank with an error of its
    own (the earliest); a rank that left no state at all (killed by a signal: its peers saw their
    connections close, or the agent saw the signal); a rank that issued fewer collectives than the
    others (it stopped while they waited for it in the next one)."""
    states = {r: _read_json(Path(run_dir) / f"state.{r}.json") for r in range(nproc)}
    status = {r: (_read_json(Path(run_dir) / f"status.{r}.json") or {}).get("status", "not started") for r in range(nproc)}
    details = {"ranks": {r: {"error": (states[r] or {}).get("error"), "status": status[r],
                             "issued": (states[r] or {}).get("issued"), "exitcode": exitcodes.get(r),
                             "pending": [p["op"] for p in (states[r] or {}).get("pending", [])],
                             "log_tail": _log_tail(run_dir, r)} for r in range(nproc)}}
    errors = {r: st["error"] for r, st in states.items() if st and st.get("error")}
    own = sorted((states[r]["time"], r) for r, e in errors.items() if not _secondary(e))
    if own:
        r = own[0][1]
        return WorkerFailure(r, errors[r], states[r]["status"], details)
    signalled = {r: -code for r, code in exitcodes.items() if code is not None and code < 0}
    vanished = [r for r in range(nproc) if states[r] is None]
    if vanished and (signalled or any(any(c in e.lower() for c in _CLOSED) for e in errors.values())):
        r = next((r for r in vanished if r in signalled), vanished[0])
        how = f"killed by {_signal_name(signalled[r])}" if r in signalled else "died without a word (its peers' connections to it closed)"
        return WorkerFailure(r, how, status[r], details)
    issued = {r: st["issued"] for r, st in states.items() if st}
    if issued and len(set(issued.values())) > 1:
        r = min(issued, key=lambda k: (issued[k], k))
        waiting = sorted(k for k in issued if issued[k] > issued[r])
        what = f"stopped after {issued[r]} collective(s) while ranks {waiting} waited in the next one"
        if deadline_s is not None:
            what += f" (job stopped at its deadline of {deadline_s:g}s)"
        return WorkerFailure(r, what, status[r], details)
    if deadline_s is not None:
        return WorkerFailure(None, f"the job did not finish within its deadline of {deadline_s:g}s", "; ".join(
            f"rank {r}: {s}" for r, s in status.items()), details)
    if errors:
        r = min(errors, key=lambda k: states[k]["time"])
        return WorkerFailure(r, errors[r], states[r]["status"], details)
    r = next(iter(exitcodes), None)
    return WorkerFailure(r, f"exited with code {exitcodes.get(r)}", status.get(r, ""), details)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _write_json(path: Path, obj: Any) -> None:
    # not fsynced: these notes are read by the parent on the same host while it is still running
    atomic_write_text(path, json.dumps(obj, default=str), fsync=False)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _log_tail(run_dir: str, rank: int, lines: int = 5) -> list[str]:
    # the last attempt's log (the agent numbers attempts 0, 1, ... when it restarts workers)
    for path in sorted(Path(run_dir, "logs").rglob(f"attempt_*/{rank}/stderr.log"),
                       key=lambda p: int(p.parent.parent.name.split("_")[1]), reverse=True):
        try:
            return [line for line in path.read_text(errors="replace").splitlines() if line.strip()][-lines:]
        except OSError:
            return []  # the log vanished with its worker: nothing to show
    return []


def ranks_info(ctx: RankContext) -> dict[str, Any]:
    return {"rank": ctx.rank, "local_rank": ctx.local_rank, "host": ctx.hostname, "pid": os.getpid(),
            "device": devices.device_name(ctx.device)}

