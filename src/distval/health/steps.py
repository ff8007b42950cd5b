"""Stragglers in a user's own script (`distval launch`): each rank's optimizer steps, and when it
arrived at each step's last collective, seen from outside the training loop.

Rank side (the shim, launch/shim.py): a global optimizer step hook (`StepClock`) notes, at each
`step()` of the first optimizer that steps, the time and the last collective each process group
has enqueued (the Flight Recorder's counters, about 40 µs). A daemon thread of the same object
reads the recorder's entries every `interval_s` (0.5 s, off the training thread), looks up
when this rank created each new step's last collective on its busiest group, and publishes the
newest steps on the rank channel under kind `steps`:
{host, rows: [[step, step_s, pg, seq, created_ns, mem_current, mem_peak], ...]} (every row of the
last KEEP_S seconds, and at least the last KEEP: a reader that polls less often than that, or
missed a publication, loses nothing, however short the steps). With a probe (health/probe.py) the
hook also takes the memory counters and the probe's numerics and replica checks, and the thread
publishes the probe's notes.

Launcher side (health/script.py `ScriptDetectors`, a launch Watcher, with `aligned_rows`): a step
whose row names the same (pg, seq) on every rank is aligned across ranks; a rank's lateness is its
creation time minus the earliest rank's. The rank that arrives last waits for nobody; every other
rank waits (latest − its own) for it, so its blocked time is that and its compute time is the step
time minus it. These rows feed the monitor `distval train` uses (health/monitor.py: stragglers
persistently slower than the peers' median over a window, robust to one-off hiccups; memory
imbalance and growth). Creation times are compared on one clock, so only while every rank is on one
host; across hosts the check says so (SKIP).
"""

from __future__ import annotations

import collections
import itertools
import socket
import threading
import time
from typing import Any, Callable

from distval.health.heartbeat import group_progress, recorded
from distval.protocol import Kind

KEEP = 64  # rows each publication carries at least
KEEP_S = 1.0  # and every row noted this recently (two of the launcher's reads, 0.5 s apart: health/script.py)
MAX_ROWS = 4096  # at most (1 s of 0.25 ms steps)


def follow_first_optimizer(callback: Callable[[Any], None]) -> Any:
    """Call `callback(optimizer)` after each `step()` of the first optimizer that steps (a global
    post-hook of torch.optim: a script's step, whatever its loop looks like); returns the hook's
    handle."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    first: list[int] = []

    def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not first:
            first.append(id(optimizer))
        if id(optimizer) == first[0]:
            callback(optimizer)

    return register_optimizer_step_post_hook(stepped)


class StepClock:
    """This rank's steps and their last collectives, published off the training thread, with what
    the `probe` (health/probe.py: numerics, replicas, memory) noted at each step."""

    def __init__(self, channel: Any, interval_s: float = 0.5, probe: Any = None):
        self.channel, self.interval_s, self.probe = channel, interval_s, probe
        self._probed = 0  # the probe's version last published
        self.pending: collections.deque[tuple[int, float, dict[str, list[int]], tuple[int, int]]] = \
            collections.deque()
        self.rows: collections.deque[tuple[float, list[Any]]] = collections.deque(maxlen=MAX_ROWS)  # (noted, row)
        self.step, self.last_t = 0, time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="distval-steps", daemon=True)
        self._handle: Any = None
        self.errors = 0  # publications that failed (a destroyed process group, a store gone)

    def start(self) -> StepClock:
        self._handle = follow_first_optimizer(self.stepped)
        self._thread.start()
        return self

    def stepped(self, optimizer: Any = None) -> None:
        """The hook: this step's wall time, each group's last enqueued collective and, with a
        probe, the memory held now and at peak and the probe's checks."""
        now = time.perf_counter()
        memory = self.probe.stepped(self.step, optimizer) if self.probe is not None else (0, 0)
        self.pending.append((self.step, now - self.last_t, group_progress(), memory))
        self.step, self.last_t = self.step + 1, now

    def publish(self) -> None:
        """Resolve the noted steps to their last collective's creation time; publish the newest,
        and what the probe noted since the last time."""
        if self.probe is not None:
            self._publish_probe()
        if not self.pending:
            return
        by_key = {(e["process_group"][0], e["collective_seq_id"]): e["time_created_ns"] for e in recorded()}
        now = time.perf_counter()
        while self.pending:
            step, step_s, groups, memory = self.pending.popleft()
            if not groups:
                continue  # no process group (yet), or no recorder
            pg, (seq, _) = max(groups.items(), key=lambda kv: kv[1][0])  # the busiest group
            if (pg, seq) in by_key:
                self.rows.append((now, [step, step_s, pg, seq, by_key[(pg, seq)], *memory]))
        recent = sum(1 for noted, _ in self.rows if noted >= now - KEEP_S)
        rows = [row for _, row in itertools.islice(self.rows, max(0, len(self.rows) - max(recent, KEEP)), None)]
        self.channel.publish(Kind.STEPS, {"host": socket.gethostname(), "rows": rows})

    def _publish_probe(self) -> None:
        version, payload = self.probe.payload()
        if version == self._probed:
            return
        if not self._probed:  # the names, once: the checksums come in their order
            self.channel.publish(Kind.PROBE_NAMES, self.probe.names_payload())
        self._probed = version
        self.channel.publish(Kind.PROBE, payload)

    def close(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.remove()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        if self.probe is not None:
            self.probe.close()  # the checks still on their way from the device
        try:
            self.publish()
        except Exception:  # noqa: BLE001 (the script's end must never fail on its last publication)
            self.errors += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.publish()
            except Exception:  # noqa: BLE001 (never take the rank down; counted, as the heartbeat's)
                self.errors += 1


def aligned_rows(rows_by_rank: list[dict[int, list[Any]]], step: int) -> list[dict[str, float]] | None:
    """One step on every rank as the straggler rule's rows (step_s, compute_s, blocked_s), or
    None when a rank lacks it or the ranks' last collectives differ."""
    rows = [mine.get(step) for mine in rows_by_rank]
    if any(r is None for r in rows) or len({(r[2], r[3]) for r in rows}) != 1:
        return None
    created = [r[4] / 1e9 for r in rows]
    latest = max(created)
    step_s = max(r[1] for r in rows)
    return [{"step_s": step_s, "blocked_s": latest - t, "compute_s": max(step_s - (latest - t), 0.0),
             "mem_current": r[5] if len(r) > 5 else 0.0, "mem_peak": r[6] if len(r) > 6 else 0.0}
            for t, r in zip(created, rows)]
