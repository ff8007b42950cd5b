"""Stragglers slowed from outside their process: the wall time a rank was not allowed to run, as
the kernel accounts it.

A rank slowed from outside (a CPU quota, another process on its core, a stopped or throttled
process) loses wall time wherever it happens to be, in its collectives as much as in its compute.
A stop inside a collective is everybody's wait, its own clock included, so its step timings
stretch with its peers' and the compute ratio of health/monitor.py cannot tell it from them
(measured: docs/stragglers-sweep.md). The kernel can: per rank on this host, a thread of the
launching process (the monitor's, health/hang.py's home) samples

  stopped  the share of samples in which the rank's process was stopped (state T: SIGSTOP, a job
           control stop; not t, a debugger's or py-spy's trace stop), ~10 times a second, ~40
           once a rank was seen stopped, jittered so a periodic stop cannot alias with them
  throttled the growth of its CPU cgroup's throttled time (cpu.stat: throttled_time in v1,
           throttled_usec in v2) over the wall time: its quota spent, every thread of it held,
           whether the training thread was runnable or waiting on a thread that was
  queued   the growth of its threads' run-queue delay (/proc/<pid>/task/*/schedstat, field 2: the
           time each was runnable and not running), summed, over the wall time: waiting for a CPU
           another process holds (a throttled thread is queued too: the larger of the two counts).
           All threads, not the training thread alone: a collective's progress is its backend's
           threads' work (Gloo's I/O threads, NCCL's proxy), which a busy core delays while the
           training thread blocks in the collective, not runnable. Thread-seconds per second, so
           it can pass 1 where several threads wait at once

and sums them per second (a bucket). Once a bucket it also reads the host's busy CPU time
(/proc/stat) and the job's own (every process of the job on this host: the ranks, their parents
and children, this process and its children): the rest, the **foreign** CPU, is what other
processes took. A rank queues for a CPU behind its peers and the launcher whenever the job's
runnable threads outnumber the cores; that is the host's oversubscription by the job itself,
which every rank suffers in turn, not a straggler.

The rule (`Slowed`): each bucket, a rank's excess is the share of the wall time it lost beyond
what its peers lost: stopped and throttled beyond their medians; queued beyond what their queue
ratio would make of its runnable time, and at most what the foreign CPU could have taken from it
(so a queue the job's own processes cause blames no rank). Evidence must last: nothing is judged
before the job's first step; a rank whose median excess over the last `WINDOW` buckets reaches
1 − 1/slow_ratio (the lost time that alone makes it slow_ratio× slower than its peers: 13% at the
default 1.15) in `PERSIST` buckets in a row, over which the job made `MIN_STEPS` steps or more,
is a straggler, a finding in the shape of the compute rule's (kind `straggler`, the same report
check and table); it stays one while the median stays over half the threshold. A host that
makes every rank wait is said once, in the stragglers check (`host_note`). Only ranks on the
launching process's host are sampled (the others' /proc is not here), so a one-rank-per-node job
is not judged.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from typing import Any, Callable

from distval.health.config import HealthConfig
from distval.health.findings import Finding
from distval.health.procs import cpu_ticks, host_busy_ticks, job_family, read_state, scheduled_s, throttled_s
from distval.health.slowed import BUCKET_S, STARTUP_S, Slowed
from distval.protocol import Kind

SAMPLE_S = (0.05, 0.15)  # the state sampler's sleep between samples, uniform in this range (~10 a second) ...
SAMPLE_STOPPED_S = (0.01, 0.04)  # ... and ~40 a second for `STOPPED_FOR_S` after any rank was seen stopped
STOPPED_FOR_S = 30.0


class _Rank:
    """One sampled process: its open stat file, the samples and stops of the current bucket."""

    def __init__(self, pid: int):
        self.pid = pid
        self.fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        self.samples = self.stopped = 0
        self.sched0, self.throttled0, self.t0 = scheduled_s(pid), throttled_s(pid), time.monotonic()

    def sample(self) -> bool:
        """One look at its state; whether it was stopped."""
        state = read_state(self.fd)
        if state:
            self.samples += 1
            self.stopped += state == "T"
        return state == "T"

    def take(self) -> dict[str, float] | None:
        """This bucket's shares of the wall time (stopped; throttled: its cgroup's quota spent;
        queued; runnable: on a CPU or queued), and a new bucket begun; None when the process left
        nothing to say."""
        sched, throttled, now = scheduled_s(self.pid), throttled_s(self.pid), time.monotonic()
        shares = None
        if self.samples and sched is not None and self.sched0 is not None and now > self.t0:
            wall = now - self.t0
            stopped = self.stopped / self.samples
            ran, queued = (max(b - a, 0.0) / wall for a, b in zip(self.sched0, sched))
            shares = {"stopped": stopped, "throttled": min(max(throttled - self.throttled0, 0.0) / wall, 1.0),
                      "queued": queued, "runnable": ran + queued}
        self.samples = self.stopped = 0
        self.sched0, self.throttled0, self.t0 = sched, throttled, now
        return shares

    def close(self) -> None:
        os.close(self.fd)


class HostCpu:
    """The CPU other processes took on this host, per bucket: the host's busy time (/proc/stat)
    less the job's (`job_family`, found again every `RESCAN` buckets), in CPUs; None where /proc/stat is not
    readable."""

    RESCAN = 10

    def __init__(self) -> None:
        self.tick_s = 1 / os.sysconf("SC_CLK_TCK")
        self.job: set[int] = set()
        self.cpu: dict[int, int] = {}  # pid -> its utime + stime at the last bucket, in ticks
        self.busy0, self.t0, self.scans = host_busy_ticks(), time.monotonic(), 0

    def take(self, pids: set[int]) -> float | None:
        if self.scans % self.RESCAN == 0 or not pids <= self.job:
            self.job = job_family(pids)
        self.scans += 1
        busy, now = host_busy_ticks(), time.monotonic()
        cpu = {pid: t for pid in self.job if (t := cpu_ticks(pid)) is not None}
        job = sum(t - self.cpu.get(pid, 0) for pid, t in cpu.items())  # a new process: all of its time is new
        foreign = None
        if busy is not None and self.busy0 is not None and now > self.t0:
            foreign = max((busy - self.busy0 - job) * self.tick_s, 0.0) / (now - self.t0)
        self.cpu, self.busy0, self.t0 = cpu, busy, now
        return foreign


class LostTime:
    """A launch Watcher (launch/monitor.py): samples the ranks on this host, feeds `Slowed` once a
    bucket, calls `on_finding` with each new finding. `step`: the job's current step from the
    reader (None when unknown). The pids come from the ranks' heartbeats (a restarted rank's new
    pid included)."""

    def __init__(self, world_size: int, cfg: HealthConfig | None = None,
                 step: Callable[[Any], int | None] = lambda reader: None,
                 on_finding: Callable[[Finding], None] | None = None):
        self.world_size, self.step = world_size, step
        self.rule = Slowed(cfg or HealthConfig())
        self.on_finding = on_finding or (lambda f: None)
        self.here = socket.gethostname()
        self.ranks: dict[int, _Rank] = {}
        self.host_cpu: HostCpu | None = None
        self.first_bucket: float | None = None
        self.lock = threading.Lock()
        self.next_bucket = time.monotonic() + BUCKET_S
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="distval-lost-time", daemon=True)

    @property
    def findings(self) -> list[Finding]:
        return self.rule.findings

    def by_host(self, r: int, slowdown: float) -> bool:
        """`Slowed.by_host`: the compute rule asks before it names a straggler."""
        return self.rule.by_host(r, slowdown)

    def host_note(self) -> str | None:
        """What the host did to every rank, if it matters (`Slowed.host_note`)."""
        return self.rule.host_note(len(os.sched_getaffinity(0)))

    def tick(self, reader: Any) -> None:
        if self._thread.ident is None and not self._stop.is_set():
            self._thread.start()  # at the monitor's first tick: a job that never started leaves no thread
        now = time.monotonic()
        if now < self.next_bucket:
            return
        self.next_bucket = max(self.next_bucket + BUCKET_S, now)
        self._follow(reader.all(self.world_size, Kind.HEARTBEAT))
        with self.lock:
            shares = {r: s for r, proc in self.ranks.items() if (s := proc.take()) is not None}
            pids = {proc.pid for proc in self.ranks.values()}
        if not pids:
            return
        self.host_cpu = self.host_cpu or HostCpu()
        self.first_bucket = self.first_bucket or now
        step, foreign = self.step(reader), self.host_cpu.take(pids)
        if step is None and not self.rule.buckets and now - self.first_bucket < STARTUP_S:
            return  # no step yet: start-up (imports, rendezvous, the first compile) is not judged
        found = self.rule.update(step, shares, foreign)
        if found is not None:
            self.on_finding(found)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1)
        with self.lock:
            for proc in self.ranks.values():
                proc.close()
            self.ranks.clear()

    def _follow(self, beats: dict[int, dict[str, Any] | None]) -> None:
        """Sample every rank whose heartbeat says it runs on this host, by its current pid."""
        with self.lock:
            for r, beat in beats.items():
                pid = (beat or {}).get("pid") if (beat or {}).get("host") == self.here else None
                if r in self.ranks and self.ranks[r].pid != pid:
                    self.ranks.pop(r).close()
                if pid and r not in self.ranks:
                    try:
                        self.ranks[r] = _Rank(pid)
                    except OSError:
                        pass  # gone already: its next heartbeat (a restart) brings the new pid

    def _sample(self) -> None:
        """The process states, ~10 times a second while no rank is stopped (jittered: a periodic
        stop cannot alias with the samples), ~40 times once one was, for `STOPPED_FOR_S`: over the
        9 s window that is ~360 samples a rank, a 17% stop share measured within ±2%."""
        stopped_at = -STOPPED_FOR_S
        while not self._stop.wait(random.uniform(*(SAMPLE_STOPPED_S if time.monotonic() - stopped_at < STOPPED_FOR_S
                                                   else SAMPLE_S))):
            with self.lock:
                if any([proc.sample() for proc in self.ranks.values()]):
                    stopped_at = time.monotonic()
