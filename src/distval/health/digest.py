"""The health plane at 1,000+ ranks: each node digests its own ranks, one leader reads the digests.

Flat, every watchdog reads every rank's heartbeat from the one store each tick: at 4,096 ranks
that is 1.1 MB a read and, with a watchdog per node, more requests than a store serves
(docs/health.md). Here the ranks publish to their node's own store; each node's watcher
(`NodeAgent`) reads its ranks there in two batched requests per kind, reads their process
states from /proc (only the node can: a stopped rank on another host looks like a silent one),
and publishes one digest to the central store when it changed; the leader's `Watchdog` (the same
class and rules as flat, health/hang.py) reads every digest in one batched request through
`DigestReader`, and each node learns the leader's verdict with one `check` per tick.

A digest is lossless for the verdicts: it groups the node's ranks by equal heartbeat (less what
differs per rank and no rule reads: pid, host, CPU time, publish time, which ride beside), so the
8 ranks of a node in step cost one entry, and `expand` gives the leader every rank's heartbeat
back. `decide` on the expanded heartbeats is `decide` on the ranks' own (tests/test_digest.py, per
verdict kind), with the stopped and dead ranks of every node known besides. The fingerprints
themselves (read only when the windows' digests differ: a mismatch) the leader reads from the
nodes' stores, whose addresses the digests carry.

Keys on the central store: `distval/node/<node>` (a digest), `distval/verdict/0` (the leader's).
"""

from __future__ import annotations

import json
import socket
from typing import Any, Callable, Iterable

from distval.health.hang import Hang
from distval.health.procs import process_state
from distval.protocol import Kind

NOT_RUNNING = ("T", "t", "Z", "gone")  # process states a digest reports: stopped, traced, zombie, gone
_PER_RANK = ("pid", "host", "cpu_s", "time")  # differ between ranks in step; no verdict reads them


def node_digest(node: int, ranks: list[int], beats: dict[int, dict[str, Any] | None],
                statuses: dict[int, dict[str, Any] | None], states: dict[int, str], host: str | None = None,
                store: str | None = None) -> dict[str, Any]:
    """One node's digest of its ranks: their heartbeats and statuses grouped by equal value, their
    pids, the ranks not running (`states`: /proc states, only those in NOT_RUNNING are kept),
    the node's host and the address of its store (for the fingerprints)."""
    return {"node": node, "host": host or socket.gethostname(), "store": store, "ranks": list(ranks),
            "pids": [(beats.get(r) or {}).get("pid") for r in ranks],
            "beats": _grouped({r: _shared(b) for r in ranks if (b := beats.get(r))}),
            "statuses": _grouped({r: _shared(s) for r in ranks if (s := statuses.get(r))}),
            "states": {str(r): s for r, s in sorted(states.items()) if s in NOT_RUNNING}}


def _shared(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k not in _PER_RANK}


def _grouped(values: dict[int, Any]) -> list[list[Any]]:
    """[[value, [ranks]], ...]: ranks with equal values share one entry."""
    out: dict[str, list[Any]] = {}
    for r, v in values.items():
        out.setdefault(json.dumps(v, sort_keys=True), [v, []])[1].append(r)
    return list(out.values())


def expand(digests: Iterable[dict[str, Any] | None], world_size: int
           ) -> tuple[dict[int, dict[str, Any] | None], dict[int, dict[str, Any] | None]]:
    """Every rank's heartbeat and status as the digests give them (None: not published, or its
    node has no digest). A rank its node found not running carries `state` (health/hang.py reads
    it for ranks on other hosts), even if it never published a heartbeat."""
    beats: dict[int, dict[str, Any] | None] = dict.fromkeys(range(world_size))
    statuses: dict[int, dict[str, Any] | None] = dict.fromkeys(range(world_size))
    for d in digests:
        if not d:
            continue
        pids = dict(zip(d["ranks"], d["pids"]))
        for beat, ranks in d["beats"]:
            for r in ranks:
                beats[r] = {**beat, "pid": pids.get(r), "host": d["host"]}
        for status, ranks in d["statuses"]:
            for r in ranks:
                statuses[r] = dict(status)
        for r, state in d["states"].items():
            r = int(r)
            beats[r] = {**(beats[r] or {"groups": {}, "status": None, "pid": pids.get(r), "host": d["host"]}),
                        "state": state}
    return beats, statuses


def states_here(beats: dict[int, dict[str, Any] | None]) -> dict[int, str]:
    """The /proc state of each rank whose process runs on this host (a node's own ranks)."""
    here = socket.gethostname()
    return {r: process_state(b["pid"]) for r, b in beats.items() if b and b.get("host") == here and b.get("pid")}


class NodeAgent:
    """A node's watcher. Each `tick`: its ranks' heartbeats and statuses from the node's store
    (`local`, a ChannelReader: two batched requests per kind), their process states, and the
    digest published to the central store (`publish(kind, payload)`, a RankChannel's for rank
    `node`) when it changed; returns the leader's verdict once there is one (`central`, a
    ChannelReader: one `check` per tick until then)."""

    def __init__(self, node: int, ranks: list[int], local: Any, central: Any,
                 publish: Callable[[str, dict[str, Any]], None], store: str | None = None,
                 states: Callable[[dict[int, dict[str, Any] | None]], dict[int, str]] = states_here,
                 host: str | None = None):
        self.node, self.ranks, self.local, self.central, self.publish = node, list(ranks), local, central, publish
        self.store, self.states, self.host = store, states, host
        self.last: dict[str, Any] | None = None

    def tick(self) -> dict[str, Any] | None:
        beats = self.local.of(self.ranks, Kind.HEARTBEAT)
        statuses = self.local.of(self.ranks, Kind.STATUS)
        digest = node_digest(self.node, self.ranks, beats, statuses, self.states(beats), self.host, self.store)
        if digest != self.last:
            self.publish(Kind.NODE, digest)
            self.last = digest
        return self.central.latest(0, Kind.VERDICT)


class DigestReader:
    """The leader's reader: what a flat watchdog reads of every rank (`all(world_size, kind)`),
    from the `nodes` digests on the central store (`central`, a ChannelReader) in one batched
    read, so `Watchdog` runs unchanged on it. Fingerprints come from the nodes' stores (read only
    when the windows' digests differ; `connect(address)`: a ChannelReader of a node's store);
    other kinds from the central store."""

    def __init__(self, central: Any, nodes: int, connect: Callable[[str], Any]):
        self.central, self.nodes, self._connect = central, nodes, connect
        self._node_readers: dict[str, Any] = {}

    def digests(self) -> list[dict[str, Any] | None]:
        return list(self.central.all(self.nodes, Kind.NODE).values())

    def all(self, world_size: int, kind: str) -> dict[int, dict[str, Any] | None]:
        if kind in (Kind.HEARTBEAT, Kind.STATUS):
            beats, statuses = expand(self.digests(), world_size)
            return beats if kind == Kind.HEARTBEAT else statuses
        if kind == Kind.FINGERPRINTS:
            found: dict[int, dict[str, Any] | None] = dict.fromkeys(range(world_size))
            for d in self.digests():
                if d and d.get("store"):
                    reader = self._node_readers.setdefault(d["store"], self._connect(d["store"]))
                    found.update(reader.of(d["ranks"], kind))
            return found
        return self.central.all(world_size, kind)


def verdict(hang: Hang) -> dict[str, Any]:
    """What the leader publishes (kind `verdict`) for every node to act on."""
    return {"kind": hang.kind, "culprits": hang.culprits, "verdict": hang.verdict, "hung": hang.hung}
