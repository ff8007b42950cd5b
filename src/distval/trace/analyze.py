"""The analysis of a set of per-rank traces (docs/trace.md):

- the same collective on every rank is matched (the k-th call of an op and size on one rank with
  the k-th on each other); the shortest of its durations is the transfer, the rest of each
  rank's duration is waiting for the last rank to arrive: no clock alignment is needed;
- each profiler step of each rank is cut into categories that partition its wall-clock time
  (so they sum to the step time exactly): compute, optimizer, communication overlapped with
  compute, exposed communication, waiting for peers, memcpy/memset, data loading, idle;
- per collective (op, size): calls, time, transfer time, algbw and busbw with nccl-tests'
  factors; which rank arrives last, how often and how long the others wait for it;
- MFU per step when the trace carries the model's FLOPs (distval's own traces do).
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from distval.comm.names import OP_SPECS
from distval.trace import intervals as iv
from distval.trace.events import Collective, RankTrace, kernel_class

CATEGORIES = ("compute", "optimizer", "comm_overlapped", "comm_exposed", "waiting_for_peers", "memcpy", "data",
              "idle")


@dataclass
class Step:
    rank: int
    step: int
    start: float
    span: float  # us
    parts: dict[str, float] = field(default_factory=dict)  # category -> us
    mfu: float | None = None


def bus_factor(op: str, world: int) -> float:
    spec = OP_SPECS.get(op)
    return spec.bus_factor(world) if spec and world > 1 else 1.0


@dataclass
class Matched:
    """One collective matched across ranks."""

    op: str
    bytes: int
    calls: dict[int, Collective]  # rank -> its call

    @property
    def transfer(self) -> float:
        return min(c.dur for c in self.calls.values())

    @property
    def last(self) -> int:
        """The rank that arrived last: it waited least."""
        return min(self.calls, key=lambda r: (self.calls[r].dur, r))

    @property
    def lateness(self) -> float:
        """How long the first rank to arrive waited for the last (us)."""
        return max(c.dur for c in self.calls.values()) - self.transfer


def match(ranks: list[RankTrace]) -> tuple[list[Matched], list[str]]:
    """Match each collective across ranks by (op, size, occurrence) and set every call's `wait`.
    Returns the matched collectives and what could not be matched (as warnings). Sends and
    receives are not matched (their waiting stays in their transfer)."""
    if len(ranks) < 2:
        return [], []
    by_rank: dict[int, dict[tuple[str, int], list[Collective]]] = {}
    for rt in ranks:
        keyed: dict[tuple[str, int], list[Collective]] = defaultdict(list)
        for c in rt.collectives:
            spec = OP_SPECS.get(c.op)
            if not (spec and spec.point_to_point):  # a send and its receive are not one call on every rank
                keyed[(c.op, c.bytes)].append(c)
        by_rank[rt.rank] = keyed
    keys = set().union(*(k.keys() for k in by_rank.values()))
    out: list[Matched] = []
    warnings = []
    for key in sorted(keys):
        lists = {r: k.get(key, []) for r, k in by_rank.items()}
        n = min(len(v) for v in lists.values())
        if n != max(len(v) for v in lists.values()):
            counts = ", ".join(f"rank {r}: {len(v)}" for r, v in sorted(lists.items()))
            warnings.append(f"{key[0]} of {key[1]} bytes: not the same number of calls on every rank ({counts}); "
                            f"the first {n} are matched")
        for i in range(n):
            m = Matched(key[0], key[1], {r: v[i] for r, v in lists.items()})
            t = m.transfer
            for c in m.calls.values():
                c.wait = c.dur - t
            out.append(m)
    out.sort(key=lambda m: min(c.ts for c in m.calls.values()))
    return out, warnings


def _optimizer_kernels(rt: RankTrace) -> set[int]:
    """Indices of the GPU kernels launched inside an optimizer phase (by the launch's
    correlation id)."""
    windows = iv.union(rt.phases.get("optimizer", []))
    if not windows or not rt.launch_ts:
        return set()
    starts = [s for s, _ in windows]
    inside = set()
    for ts, corr in zip(rt.launch_ts, rt.launch_corr):
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts < windows[i][1]:
            inside.add(corr)
    return {k for k, corr in enumerate(rt.kernel_corr) if corr in inside}


def breakdown(rt: RankTrace) -> list[Step]:
    """Each profiler step of this rank cut into CATEGORIES (us); they sum to the step's span."""
    if rt.on_gpu:
        opt = _optimizer_kernels(rt)
        work = iv.union((s, e) for k, (s, e, _, cls, _) in enumerate(rt.kernels) if cls == "compute" and k not in opt)
        work_opt = iv.union((s, e) for k, (s, e, _, cls, _) in enumerate(rt.kernels) if cls == "compute" and k in opt)
        work = iv.subtract(work, work_opt)  # a kernel of each on two streams at once: the optimizer's
        memory = iv.union((s, e) for s, e, _, cls, _ in rt.kernels if cls == "memory")
        data_work: iv.Spans = []
    else:
        flat = rt.cpu_ops.get(rt.main_thread, [])
        busy = iv.union(zip(flat[0::2], flat[1::2]))
        opt_w, data_w = iv.union(rt.phases.get("optimizer", [])), iv.union(rt.phases.get("data", []))
        work_opt = iv.intersect(busy, opt_w)
        data_work = iv.subtract(iv.intersect(busy, data_w), work_opt)
        work = iv.subtract(iv.subtract(busy, work_opt), data_work)
        memory = []
    comm = iv.union((c.ts, c.ts + c.dur) for c in rt.collectives)
    waiting = iv.union((c.ts, c.ts + c.wait) for c in rt.collectives if c.wait > 0)
    transfer = iv.union((c.ts + c.wait, c.ts + c.dur) for c in rt.collectives)
    data_w = iv.union(rt.phases.get("data", []))
    busy_all = iv.union(work + work_opt + data_work)
    flops = rt.meta.get("flops_per_step")
    peak = rt.meta.get("peak_flops")
    steps = []
    marked = rt.steps or ([(-1, rt.first, rt.last)] if rt.last > rt.first else [])  # no ProfilerStep: one step
    for number, start, end in marked:
        def within(spans: iv.Spans) -> iv.Spans:
            return iv.clip(spans, start, end)

        w_busy, w_comm = within(busy_all), within(comm)
        parts = {
            "compute": iv.length(iv.subtract(within(work), w_comm)),
            "optimizer": iv.length(iv.subtract(within(work_opt), w_comm)),
            "comm_overlapped": iv.length(iv.intersect(w_comm, w_busy)),
            "comm_exposed": iv.length(iv.subtract(within(transfer), w_busy)),
            "waiting_for_peers": iv.length(iv.subtract(iv.subtract(within(waiting), w_busy), within(transfer))),
            "memcpy": iv.length(iv.subtract(iv.subtract(within(memory), w_busy), w_comm)),
        }
        if data_work:  # CPU: the main thread's data loading work
            parts["data"] = iv.length(iv.subtract(within(data_work), w_comm))
        else:  # GPU: the device idle while the host loads data
            parts["data"] = iv.length(iv.subtract(within(data_w), iv.union(w_busy + w_comm + within(memory))))
        parts["idle"] = max((end - start) - sum(parts.values()), 0.0)
        mfu = flops / ((end - start) * 1e-6) / peak if flops and peak and end > start else None
        steps.append(Step(rt.rank, number, start, end - start, parts, mfu))
    return steps


def op_rows(ranks: list[RankTrace], steps: list[Step], top: int = 200) -> list[dict[str, Any]]:
    """The kernels (GPU) or CPU ops (inclusive time: a nested op counts in its parent too) that
    take the most time, per rank and step on average over the ranks."""
    kind = "kernel" if any(rt.on_gpu for rt in ranks) else "cpu_op"
    per_rank_steps = {rt.rank: max(sum(1 for s in steps if s.rank == rt.rank), 1) for rt in ranks}
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for rt in ranks:
        for (k, name), (calls, us) in rt.ops.items():
            if k == kind:
                totals[name][0] += calls / per_rank_steps[rt.rank] / len(ranks)
                totals[name][1] += us / per_rank_steps[rt.rank] / len(ranks)
    best = sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"kind": kind, "name": name, "class": kernel_class(name) if kind == "kernel" else None,
             "calls_per_step": round(calls, 2), "ms_per_step": round(us / 1e3, 4)} for name, (calls, us) in best]


def collective_rows(ranks: list[RankTrace], matched: list[Matched]) -> list[dict[str, Any]]:
    """Per (op, size): calls per rank, time per call, transfer per call, algbw/busbw of the
    transfer, and the share of the time spent waiting for the last rank."""
    world = max((rt.world_size or len(ranks)) for rt in ranks) if ranks else 1
    groups: dict[tuple[str, int], list[Collective]] = defaultdict(list)
    for rt in ranks:
        for c in rt.collectives:
            groups[(c.op, c.bytes)].append(c)
    rows = []
    for (op, size), calls in sorted(groups.items(), key=lambda kv: -sum(c.dur for c in kv[1])):
        total = sum(c.dur for c in calls)
        wait = sum(c.wait for c in calls)
        per_call = (total - wait) / len(calls)  # the transfer, us
        algbw = size / (per_call * 1e-6) / 1e9 if per_call > 0 and size else None
        rows.append({"op": op, "bytes": size, "calls": round(len(calls) / len(ranks), 1),
                     "time_us": round(total / len(calls), 1), "transfer_us": round(per_call, 1),
                     "wait_share": round(wait / total, 3) if total else 0.0,
                     "algbw_GBps": round(algbw, 3) if algbw is not None else None,
                     "busbw_GBps": round(algbw * bus_factor(op, world), 3) if algbw is not None else None})
    return rows


def in_steps(matched: list[Matched], steps: list[Step]) -> list[Matched]:
    """The collectives that ran inside the analysed steps (on the rank that arrived last): the
    harness's own bookkeeping between steps (distval's barrier, its metrics) is left out."""
    windows: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for s in steps:
        windows[s.rank].append((s.start, s.start + s.span))
    for w in windows.values():
        w.sort()

    def inside(rank: int, ts: float) -> bool:
        w = windows.get(rank, [])
        i = bisect.bisect_right(w, (ts, float("inf"))) - 1
        return i >= 0 and ts < w[i][1]

    return [m for m in matched if inside(m.last, m.calls[m.last].ts)]


def late_rows(ranks: list[RankTrace], matched: list[Matched], steps: list[Step]) -> list[dict[str, Any]]:
    """Per rank: how often it arrived last at a collective inside the steps and how long the
    others waited for it, against the step time."""
    matched = in_steps(matched, steps)
    if not matched:
        return []
    last = defaultdict(int)
    caused = defaultdict(float)
    for m in matched:
        last[m.last] += 1
        caused[m.last] += m.lateness
    span = defaultdict(float)
    for s in steps:
        span[s.rank] += s.span
    total_span = statistics.median(span.values()) if span else 0.0
    return [{"rank": rt.rank, "arrived_last": last[rt.rank], "share": round(last[rt.rank] / len(matched), 3),
             "others_waited_ms": round(caused[rt.rank] / 1e3, 3),
             "of_step_time": round(caused[rt.rank] / total_span, 3) if total_span else None}
            for rt in sorted(ranks, key=lambda r: r.rank)]
