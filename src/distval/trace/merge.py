"""One trace of the whole job for Perfetto (ui.perfetto.dev) or chrome://tracing: every rank's
events, each rank's processes renamed `rank <r> …`, its clock moved onto rank `ref`'s.

Clocks: a collective ends at the same moment on every rank (it completes when the last rank's
data is in), so the median difference between a rank's and the reference rank's ends of the
matched collectives is that rank's clock offset. Ranks with no matched collective keep their
clock (the same host's ranks share one). The events are streamed from each file to the output
(gzip when the name ends in .gz), through a temporary name: never held whole, never half-written.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
from pathlib import Path
from typing import Any

from distval.trace.analyze import Matched
from distval.trace.events import RankTrace
from distval.trace.kineto import open_trace


def clock_offsets(ranks: list[RankTrace], matched: list[Matched]) -> dict[int, float]:
    """rank -> microseconds to subtract from its times to put them on the first rank's clock."""
    ref = min(rt.rank for rt in ranks)
    out = {}
    for rt in ranks:
        ends = [m.calls[rt.rank].ts + m.calls[rt.rank].dur - (m.calls[ref].ts + m.calls[ref].dur)
                for m in matched if rt.rank in m.calls and ref in m.calls]
        out[rt.rank] = statistics.median(ends) if ends else 0.0
    return out


def write_merged(ranks: list[RankTrace], matched: list[Matched], path: Path) -> dict[int, float]:
    """Write the merged trace; returns the clock offsets applied (us)."""
    offsets = clock_offsets(ranks, matched)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    opener = gzip.open if path.name.endswith(".gz") else open
    pids: dict[tuple[int, Any], int] = {}
    names: dict[tuple[int, Any], str] = {}
    try:
        with opener(tmp, "wt", encoding="utf-8") as out:
            out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
            first = True
            for rt in ranks:
                for ev in _events(rt, offsets[rt.rank], pids, names):
                    out.write(("" if first else ",\n") + json.dumps(ev, separators=(",", ":")))
                    first = False
            for (rank, pid), new in pids.items():
                label = f"rank {rank} {names.get((rank, pid)) or pid}".rstrip()
                name = {"ph": "M", "name": "process_name", "pid": new, "tid": 0, "args": {"name": label}}
                order = {"ph": "M", "name": "process_sort_index", "pid": new, "tid": 0, "args": {"sort_index": new}}
                out.write(",\n" + json.dumps(name) + ",\n" + json.dumps(order))
            out.write("\n]}\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return offsets


def _events(rt: RankTrace, offset: float, pids: dict[tuple[int, Any], int], names: dict[tuple[int, Any], str]):
    """The rank's events with its processes renumbered (one pid per rank and original process)
    and its times on the reference clock; its process names are kept for ours (`names`)."""
    _, events = open_trace(rt.path)
    for ev in events:
        if ev.get("ph") == "M" and ev.get("name") in ("process_name", "process_sort_index", "process_labels"):
            if ev.get("name") == "process_name":
                names[(rt.rank, ev.get("pid"))] = str((ev.get("args") or {}).get("name", ""))
            continue
        ev = dict(ev)
        key = (rt.rank, ev.get("pid"))
        ev["pid"] = pids.setdefault(key, len(pids) + 1)
        if isinstance(ev.get("ts"), (int, float)):
            ev["ts"] = ev["ts"] - offset
        if "id" in ev and isinstance(ev["id"], int):  # flow ids are per file: keep the ranks' apart
            ev["id"] = ev["id"] + (rt.rank << 40)
        yield ev
