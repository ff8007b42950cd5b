"""One worker, in every launch mode: initialise the process groups and the rank channel, run the
per-rank function, gather the results to rank 0 over the Gloo control group.

A failure (an exception, or SIGTERM from the agent) is published on the channel as this rank's
`state` before the worker goes. Under torchrun/Slurm/mpirun rank 0 then reads every rank's state
from the job's store and names the rank that caused it (health/diagnose.py), so the report blames
the culprit, not the rank that merely timed out waiting for it; in local mode the launching
process does that (launch/local.py).
"""

from __future__ import annotations

import datetime
import functools
import os
import signal
import socket
import time
import traceback
from typing import Any

import torch.distributed as dist

from distval import device as devices
from distval import exit_without_collecting
from distval.comm.layer import Comm
from distval.health.diagnose import WorkerFailure, diagnose
from distval.health.faults import Faults
from distval.health.heartbeat import Heartbeat, enable_flight_recorder, last_collectives, running, write_dump
from distval.health.metrics import exporter_for
from distval.launch import channel as channels
from distval.launch import watcher
from distval.launch.config import LaunchOptions
from distval.launch.job import JobResult, RankFn
from distval.launch.monitor import MonitorLoop, Watcher
from distval.protocol import Kind
from distval.rank import RankContext, state_payload

PEER_STATES_WAIT_S = 3.0  # rank 0, after a failure under an outer launcher: how long to wait for the others' states
CHANNEL_TIMEOUT_S = 10.0  # a store whose host died must not hold a failing rank for the whole --timeout


def run_worker(rank_fn: RankFn, cfg: Any, opts: LaunchOptions, mode: str, watchers: list[Watcher] | tuple = ()
               ) -> JobResult | None:
    rank = int(os.environ["RANK"])
    exit_without_collecting()
    channel = channels.for_worker(rank)
    ctx: RankContext | None = None
    monitor: MonitorLoop | None = None
    heartbeat: Heartbeat | None = None
    try:
        timeout = datetime.timedelta(seconds=opts.timeout_s)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = devices.device_for(opts.backend, local_rank)
        if mode != "local":  # an advertised address no peer can reach: an ERROR naming it now, not a hang at init
            from distval.launch.netcheck import preflight
            preflight(os.environ, timeout_s=min(opts.timeout_s, 5.0))
        if opts.hang is not None:
            enable_flight_recorder()  # the heartbeat's collective facts, before the first process group
        _init_process_group(opts.backend, timeout)
        if mode != "local" and not os.environ.get(channels.ENV):  # under `distval launch`: its store already
            channel.attach(channels.job_store(min(opts.timeout_s, CHANNEL_TIMEOUT_S)))
            if opts.hang is not None:  # under torchrun/Slurm: a watchdog per node, outside the ranks
                _start_node_watcher(opts.hang)
        # Bookkeeping (agreeing, gathering results, timing barriers) always goes over its own
        # Gloo group, so it can never pair with, or be counted as, the traffic being measured.
        control = dist.new_group(backend="gloo", timeout=timeout)
        ctx = RankContext(rank, dist.get_world_size(), local_rank, opts.backend, device, Comm(), control,
                          socket.gethostname(), channel, control_comm=Comm(group=control, name="control"),
                          last_collectives=functools.partial(_last_collectives, rank))
        ctx.signals.install(signal.SIGTERM)
        ctx.faults = faults = Faults.from_env(rank)
        if faults:  # the measured group only: bookkeeping is never faulted
            ctx.comm.on_issue.append(lambda rec: faults.before_op(rec, ctx.comm.group, ctx.device))
            ctx.comm.on_finish.append(lambda rec, outputs: faults.after_op(rec.op, outputs))
        if opts.hang is not None:  # the watchdog's facts (`--hang-after off`: neither)
            status = ctx  # what the rank last said it is doing
            beats = lambda: (status.last_status, status.status_fields)  # noqa: E731
            if running() is not None:  # under `distval launch -m distval ...`: the shim's heartbeat, our status
                running().status = beats  # type: ignore[union-attr]
            else:
                heartbeat = Heartbeat(channel, beats).start()
        if mode != "local" and rank == 0:  # under torchrun/Slurm the live views, and metrics, are rank 0's
            exporter = exporter_for(opts.metrics_port, ctx.world_size, list(watchers))
            if watchers or exporter:
                monitor = MonitorLoop(channel.reader(), ctx.world_size, [*watchers, *([exporter] if exporter else [])])
                monitor.start()
        ctx.status("running")
        result = rank_fn(ctx, cfg)
        ctx.status("gathering results")
        gathered: list[Any] | None = [None] * ctx.world_size if rank == 0 else None
        dist.gather_object((ranks_info(ctx), result), gathered, dst=0, group=control)
        _stop_node_watcher()  # every rank finished this job: nothing left on this node to watch
        if gathered is None:
            return None
        return JobResult(mode, opts.backend, ctx.world_size, [r for _, r in gathered], [i for i, _ in gathered])
    except Exception as e:
        error = f"{type(e).__name__}: {e}".strip()
        tb = traceback.format_exc(limit=8)
        if ctx is None:  # failed before the process group was up
            channel.publish(Kind.STATE, state_payload(rank, "initialising", [], error, tb), flush=True)
            raise WorkerFailure(rank, error, "initialising") from e
        ctx.signals.on(signal.SIGTERM, lambda signum: True)  # the agent stopping us must not cut the report short
        ctx.publish_state(error=error, traceback_text=tb)
        reader = channel.reader()
        if mode != "local" and rank == 0 and reader is not None:
            raise _diagnose_peers(ctx.world_size, reader) from e
        raise WorkerFailure(rank, error, ctx.last_status) from e
    finally:
        if heartbeat is not None:
            heartbeat.close()
        if monitor is not None:
            monitor.close()
        channel.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _last_collectives(rank: int) -> dict[str, dict[str, str]]:
    """What a failing or stopped rank leaves: its last collectives' fingerprints in its state, and
    its whole Flight Recorder dump where the launcher asked for one."""
    write_dump(rank)
    return last_collectives()


_WATCHER: list[Any] = []  # the node watcher this process started for the job it runs


def _start_node_watcher(policy: Any) -> None:
    """Local rank 0 starts its node's watchdog process (launch/watcher.py) for this job."""
    spec = watcher.plan(os.environ, policy)
    if spec is not None and not _WATCHER:
        _WATCHER.append(watcher.start(spec))


def _stop_node_watcher() -> None:
    """At the job's normal end. (A rank that fails leaves it to watch the node's other ranks; it
    exits once none runs.)"""
    while _WATCHER:
        _WATCHER.pop().terminate()


def _diagnose_peers(world_size: int, reader: channels.ChannelReader) -> WorkerFailure:
    """Rank 0 under an outer launcher: every rank's state from the job's store (each failed rank
    publishes one; a killed rank none), then the culprit."""
    deadline = time.monotonic() + PEER_STATES_WAIT_S
    states = reader.all(world_size, Kind.STATE)
    while any(s is None for s in states.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
        states = reader.all(world_size, Kind.STATE)
    return diagnose(states, reader.all(world_size, Kind.STATUS))


_JOBS_STARTED = [0]  # jobs this process has joined (`distval run` under torchrun joins several in turn)


def _init_process_group(backend: str, timeout: datetime.timedelta) -> None:
    """init_process_group, except where the agent's store outlives a process group: after an
    elastic restart, and for the second and later jobs of one process (the ladder's stages). The
    earlier group's Gloo addresses in it would be read as this one's (connection refused), so
    the keys of each (attempt, job) go under their own prefix; every rank joins the same jobs in
    the same order, so the ranks agree on it."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    job, _JOBS_STARTED[0] = _JOBS_STARTED[0], _JOBS_STARTED[0] + 1
    if (attempt == 0 and job == 0) or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    world_size = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"/distval/attempt_{attempt}/job_{job}", store),
                            rank=int(os.environ["RANK"]), world_size=world_size, timeout=timeout)


def ranks_info(ctx: RankContext) -> dict[str, Any]:
    return {"rank": ctx.rank, "local_rank": ctx.local_rank, "host": ctx.hostname, "pid": os.getpid(),
            "device": devices.device_name(ctx.device)}
