"""The health monitor of a launched script (`distval launch`), in the launcher: `distval train`'s
detectors (health/monitor.py) fed from what every rank's step clock and probe published on the
rank channel (health/steps.py, health/probe.py), with no collective added to the script.

  stragglers, memory   each optimizer step aligned across ranks (steps.py `aligned_rows`): the
                       step time, each rank's compute and wait, its current and peak memory, fed
                       to `Detectors.update` as `distval train`'s gathered rows are
  numerics             the first non-finite gradient or parameter any rank's probe saw (every
                       `nan_every` steps): the earliest step, every rank that saw it there, the
                       parameter's module path
  replicas             every `every` steps each rank's exact checksums, compared among the ranks
                       that must hold the same values: every rank for DDP, the ranks of equal
                       shard coordinates for FSDP2 (none when the model is sharded over every
                       rank: said, not compared); a model without a DDP wrapper counts as
                       replicated only if its first check agreed on every rank
Findings are printed live (`on_finding`) and become the report's health checks and tables
(health/report.py), worded as `distval train`'s.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Callable

from distval.health.config import HealthConfig
from distval.health.findings import Finding
from distval.health.monitor import Detectors, compare_replicas, nonfinite_in_script
from distval.health.report import add_health
from distval.health.steps import aligned_rows
from distval.protocol import Kind
from distval.results import Report

READ_EVERY_S = 0.5  # as often as the ranks publish their steps
NAN_WAIT_S = 3.0  # the longest a non-finite finding waits for every rank's checks to be read back


class ScriptDetectors:
    """A monitor-loop watcher (launch/monitor.py) over every rank's steps and probe notes."""

    def __init__(self, world_size: int, cfg: HealthConfig | None = None,
                 on_finding: Callable[[Finding], None] | None = None, read_every_s: float = READ_EVERY_S,
                 by_host: Callable[[int, float], bool] | None = None):
        """`by_host`: the lost-time rule's word on a would-be straggler (health/lost.py `by_host`)."""
        self.world_size, self.read_every_s = world_size, read_every_s
        self.cfg = cfg or HealthConfig()
        self.health = Detectors(self.cfg, by_host)
        self.on_finding = on_finding or (lambda f: None)
        self.rows: list[dict[int, list[Any]]] = [{} for _ in range(world_size)]
        self.hosts: set[str] = set()
        self.next_step = 0
        self.steps_seen = 0
        self.probes: dict[int, dict[str, Any]] = {}
        self.names: dict[int, list[str]] = {}
        self.nonfinite: Finding | None = None
        self._nan_seen = 0.0  # when a rank's probe first reported a non-finite value
        self._read_at, self._reader = -read_every_s, None
        self.compared: set[tuple[int, tuple[int, ...]]] = set()  # (step, ranks) already compared
        self.unreplicated: list[int] = []  # ranks of a plain model whose first check disagreed: not replicas
        self.singles = False  # a sharded model with a rank alone in its shard group

    def tick(self, reader: Any) -> None:
        """Every `read_every_s` (as often as the ranks publish): the launcher shares the ranks' host."""
        now = time.monotonic()
        if now - self._read_at < self.read_every_s:
            return
        self._read_at, self._reader = now, reader
        self._read(reader)

    def _read(self, reader: Any) -> None:
        for rank, payload in reader.all(self.world_size, Kind.STEPS).items():
            if payload:
                self.hosts.add(payload["host"])
                for row in payload["rows"]:
                    if row[0] >= self.next_step:  # (a step fed already is never needed again)
                        self.rows[rank][row[0]] = row
        self.feed()
        for rank, payload in reader.all(self.world_size, Kind.PROBE).items():
            if payload:
                self.probes[rank] = payload
                if payload["replicas"] and rank not in self.names:
                    self.names[rank] = (reader.latest(rank, Kind.PROBE_NAMES) or {}).get("names", [])
        self._nonfinite()
        self._replicas()

    def feed(self) -> None:
        """Every step all ranks have reported, in order (one host only: one clock)."""
        newest = min((max(mine) if mine else -1) for mine in self.rows)  # the step every rank has passed
        while len(self.hosts) == 1:
            every = all(self.next_step in mine for mine in self.rows)
            if not every and newest <= self.next_step:
                break  # not every rank has reported it yet
            # (a step some rank never resolved once every rank is past it: its recorder had moved on)
            ranks = aligned_rows(self.rows, self.next_step) if every else None
            if ranks is not None:
                self.steps_seen += 1
                for found in self.health.update(self.next_step, ranks, None, None, None):
                    self.on_finding(found)
            for mine in self.rows:
                mine.pop(self.next_step, None)  # fed: never needed again
            self.next_step += 1

    def _nonfinite(self, final: bool = False) -> None:
        """The earliest non-finite step and every rank that saw it there, said once every rank's
        checks are read back that far (a NaN spreads to every rank at the next all-reduce: the rank
        that published first is not always where it began), or after NAN_WAIT_S, or at the end."""
        seen = {r: p["nonfinite"] for r, p in self.probes.items() if p.get("nonfinite")}
        if not seen:
            return
        step = min(x["step"] for x in seen.values())
        ranks = sorted(r for r, x in seen.items() if x["step"] == step)
        first = seen[ranks[0]]
        found = nonfinite_in_script(step, ranks, first["what"], first["value"], first["param"])
        if self.nonfinite is not None:
            if (step, ranks) != (self.nonfinite.step, self.nonfinite.ranks):  # a late rank saw it first
                self.nonfinite.__dict__.update(found.__dict__)
            return
        self._nan_seen = self._nan_seen or time.monotonic()
        everyone = all(self.probes.get(r, {}).get("checked", -1) >= step for r in range(self.world_size))
        if everyone or final or time.monotonic() - self._nan_seen >= NAN_WAIT_S:
            self.nonfinite = found
            self.health.numerics.findings.append(found)
            self.on_finding(found)

    def _replicas(self) -> None:
        groups: dict[tuple, list[int]] = collections.defaultdict(list)
        for r, p in sorted(self.probes.items()):
            if p["replicas"] and r in self.names:
                groups[(p["layout"], p["names_key"], tuple(p["shard"]))].append(r)
        for (layout, _, _), ranks in groups.items():
            if len(ranks) < 2:
                self.singles = self.singles or layout == "sharded"
                continue
            by_rank = {r: {c["step"]: c["sums"] for c in self.probes[r]["replicas"]} for r in ranks}
            for step in sorted(set.intersection(*(set(steps) for steps in by_rank.values()))):
                if (step, tuple(ranks)) in self.compared or set(ranks) <= set(self.unreplicated):
                    continue
                first = not any(rs == tuple(ranks) for _, rs in self.compared)
                self.compared.add((step, tuple(ranks)))
                self.health.replica_checks += 1
                found = compare_replicas(step, self.names[ranks[0]], [by_rank[r][step] for r in ranks], ranks)
                if found and layout == "plain" and first:
                    self.unreplicated = sorted({*self.unreplicated, *ranks})  # never equal: not replicas
                elif found and not self.health.replicas:
                    self.health.replicas.append(found)
                    self.on_finding(found)

    def metrics(self) -> dict[str, Any]:
        """The live figures (health/metrics.py): the monitor's, and the last step every rank finished."""
        return {**self.health.metrics(), **({"step": self.next_step - 1} if self.next_step else {})}

    def close(self) -> None:
        """The last publications read (the monitor loop's final tick may fall inside the interval),
        and a non-finite value still waiting for the others said."""
        if self._reader is not None:
            self._read(self._reader)
        self._nonfinite(final=True)

    def report(self, report: Report, outside: list[Finding] = (), host: str | None = None) -> None:
        """The health checks and tables (health/report.py); `outside`: the lost-time rule's
        findings (health/lost.py), which need no aligned steps; `host`: its host note."""
        findings = [f.to_dict() for f in sorted([*self.health.findings(), *outside], key=lambda f: f.step)]
        skips = {}
        if len(self.hosts) > 1:
            skips["stragglers"] = skips["memory"] = (f"ranks on {len(self.hosts)} hosts: arrival times on different "
                                                     "clocks are not compared")
        elif self.steps_seen < self.cfg.window:
            skips["stragglers"] = (f"{self.steps_seen} optimizer step(s) with a collective seen; the straggler rule "
                                   f"needs {self.cfg.window}")
        if not self.steps_seen:
            skips["memory"] = "no optimizer step with a collective seen"
        every = max((p["nan_every"] for p in self.probes.values()), default=0)
        if not every:
            skips["numerics"] = "off (--check-nan-every 0)" if self.probes else "no optimizer step seen"
        checked = min((p.get("checked", -1) for p in self.probes.values()), default=-1)  # read back on every rank
        numerics = f"every gradient and parameter finite at every check, every {every} optimizer step(s) up to step " \
                   f"{checked}"
        add_health(report, findings, self.health.rank_rows(), self.cfg, self._replicas_text(), numerics=numerics,
                   skips=skips, host=host)

    def _replicas_text(self) -> str:
        every = max((p["replicas_every"] for p in self.probes.values()), default=0)
        layouts = {p["layout"] for p in self.probes.values()}
        if not every:
            return "SKIP: off (--check-replicas-every 0)" if self.probes else "SKIP: no optimizer step seen"
        if self.unreplicated:
            return (f"SKIP: the parameters of ranks {self.unreplicated} differed at their first check and no "
                    "DistributedDataParallel wraps the model: not replicas, not compared")
        if not self.health.replica_checks and self.singles:
            return "SKIP: the model is sharded (FSDP) over every rank: no replicas to compare"
        if not self.health.replica_checks:
            return f"SKIP: no check ran: a check every {every} optimizer steps (--check-replicas-every)"
        groups = len({ranks for _, ranks in self.compared})
        within = f" within each of {groups} replica groups" if groups > 1 or "sharded" in layouts else ""
        return (f"every rank's parameters bitwise equal{within} at {self.health.replica_checks} check(s), every "
                f"{every} optimizer steps")
