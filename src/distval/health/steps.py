"""Stragglers in a user's own script (`distval launch`): each rank's optimizer steps, and when it
arrived at each step's last collective, seen from outside the training loop.

Rank side (the shim, launch/shim.py): a global optimizer step hook (`StepClock`) notes, at each
`step()` of the first optimizer that steps, the time and the last collective each process group
has enqueued (the Flight Recorder's counters, about 40 µs). A daemon thread of the same object
reads the recorder's entries every `interval_s` (a few ms, off the training thread), looks up
when this rank created each new step's last collective on its busiest group, and publishes the
newest steps on the rank channel under kind `steps`:
{host, rows: [[step, step_s, pg, seq, created_ns], ...]} (the last KEEP rows, so a reader that
missed a publication loses nothing).

Launcher side (`StragglerWatch`, a launch Watcher): a step whose row names the same (pg, seq) on
every rank is aligned across ranks; a rank's lateness is its creation time minus the earliest
rank's. The rank that arrives last waits for nobody; every other rank waits (latest − its own)
for it, so its blocked time is that and its compute time is the step time minus it. These rows
feed the rule `distval train` uses (health/monitor.py `Stragglers`: persistently slower than the
peers' median over a window, robust to one-off hiccups). Creation times are compared on one
clock, so only while every rank is on one host; across hosts the check says so (SKIP).
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from typing import Any, Callable

from distval.health.heartbeat import group_progress, recorded
from distval.health.monitor import STRAGGLER_HINT, Finding, HealthConfig, Stragglers
from distval.results import Check, Status

KIND = "steps"
KEEP = 64  # rows each publication carries


def follow_first_optimizer(callback: Callable[[], None]) -> Any:
    """Call `callback` after each `step()` of the first optimizer that steps (a global post-hook
    of torch.optim: a script's step, whatever its loop looks like); returns the hook's handle."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    first: list[int] = []

    def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not first:
            first.append(id(optimizer))
        if id(optimizer) == first[0]:
            callback()

    return register_optimizer_step_post_hook(stepped)


class StepClock:
    """This rank's steps and their last collectives, published off the training thread."""

    def __init__(self, channel: Any, interval_s: float = 0.5):
        self.channel, self.interval_s = channel, interval_s
        self.pending: collections.deque[tuple[int, float, dict[str, list[int]]]] = collections.deque()
        self.rows: collections.deque[list[Any]] = collections.deque(maxlen=KEEP)
        self.step, self.last_t = 0, time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="distval-steps", daemon=True)
        self._handle: Any = None
        self.errors = 0  # publications that failed (a destroyed process group, a store gone)

    def start(self) -> StepClock:
        self._handle = follow_first_optimizer(self.stepped)
        self._thread.start()
        return self

    def stepped(self) -> None:
        """The hook: this step's wall time and each group's last enqueued collective."""
        now = time.perf_counter()
        self.pending.append((self.step, now - self.last_t, group_progress()))
        self.step, self.last_t = self.step + 1, now

    def publish(self) -> None:
        """Resolve the noted steps to their last collective's creation time; publish the newest."""
        if not self.pending:
            return
        by_key = {(e["process_group"][0], e["collective_seq_id"]): e["time_created_ns"] for e in recorded()}
        while self.pending:
            step, step_s, groups = self.pending.popleft()
            if not groups:
                continue  # no process group (yet), or no recorder
            pg, (seq, _) = max(groups.items(), key=lambda kv: kv[1][0])  # the busiest group
            if (pg, seq) in by_key:
                self.rows.append([step, step_s, pg, seq, by_key[(pg, seq)]])
        self.channel.publish(KIND, {"host": socket.gethostname(), "rows": list(self.rows)})

    def close(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.remove()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
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
    return [{"step_s": step_s, "blocked_s": latest - t, "compute_s": max(step_s - (latest - t), 0.0)}
            for t in created]


class StragglerWatch:
    """The launcher's straggler rule over every rank's published steps; a finding is printed as
    it is made and becomes the `launch stragglers` check at the end."""

    def __init__(self, world_size: int, cfg: HealthConfig | None = None,
                 on_finding: Callable[[Finding], None] | None = None):
        self.world_size = world_size
        self.rule = Stragglers(cfg or HealthConfig())
        self.on_finding = on_finding or (lambda f: None)
        self.rows: list[dict[int, list[Any]]] = [{} for _ in range(world_size)]
        self.hosts: set[str] = set()
        self.next_step = 0
        self.steps_seen = 0

    def tick(self, reader: Any) -> None:
        for rank, payload in reader.all(self.world_size, KIND).items():
            if payload:
                self.hosts.add(payload["host"])
                for row in payload["rows"]:
                    self.rows[rank][row[0]] = row
        self.feed()

    def feed(self) -> None:
        """Every step all ranks have reported, in order (one host only: one clock)."""
        while len(self.hosts) == 1:
            if not all(self.next_step in mine for mine in self.rows):
                if all(mine and max(mine) > self.next_step for mine in self.rows):
                    self.next_step += 1  # a rank never resolved this step (its recorder had moved on): skip it
                    continue
                break
            ranks = aligned_rows(self.rows, self.next_step)
            if ranks is not None:
                self.steps_seen += 1
                found = self.rule.update(self.next_step, ranks, None)
                if found is not None:
                    self.on_finding(found)
            for mine in self.rows:
                mine.pop(self.next_step - KEEP, None)  # only what a late step could still need
            self.next_step += 1

    def close(self) -> None:
        """Nothing to release: the monitor loop owns the reader."""

    def check(self, outside: list[Finding] = ()) -> Check:
        """The `launch stragglers` check: this rule's findings and those of ranks slowed from
        outside (`outside`: health/lost.py's, which need no aligned steps)."""
        findings = [*self.rule.findings, *outside]
        if not findings and len(self.hosts) > 1:
            return Check("launch stragglers", Status.SKIP, f"ranks on {len(self.hosts)} hosts: arrival times on "
                         "different clocks are not compared", details={"hosts": sorted(self.hosts)})
        if not findings and self.steps_seen < self.rule.cfg.window:
            return Check("launch stragglers", Status.SKIP, f"{self.steps_seen} optimizer step(s) with a collective "
                         f"seen; the straggler rule needs {self.rule.cfg.window}",
                         details={"steps": self.steps_seen})
        if not findings:
            return Check("launch stragglers", Status.OK, f"no straggler over {self.steps_seen} optimizer steps: no "
                         f"rank's compute stayed {self.rule.cfg.slow_ratio:g}x its peers' over {self.rule.cfg.window}, "
                         "none lost time to causes outside its process", details={"steps": self.steps_seen})
        f = min(findings, key=lambda f: f.step)
        return Check("launch stragglers", Status.WARN, f.summary, details=f.details, where={"rank": f.ranks[0],
                     "step": f.step}, hint=STRAGGLER_HINT)
