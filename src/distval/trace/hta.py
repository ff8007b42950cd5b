"""Holistic Trace Analysis's two headline figures, with HTA 0.5.0's definitions and column names,
so a user can check us against HTA on the same files (docs/trace.md has the definitions and
where in HTA's code each comes from):

- times in whole microseconds: HTA rounds a nanosecond-resolution trace's starts up and ends down;
- which GPU events count: every event with a stream (kernels, memcpy, memset) whose launch (the
  CPU event with the same correlation id) started before the last ProfilerStep began; with fewer
  than two distinct ProfilerSteps in the whole set, all of them;
- kernel type by name: communication `^nccl.*Kernel`; memory `^Memcpy|^Memset|^dma`; compute
  whatever does not match `^nccl.*Kernel|.*Memcpy|^Memset|.*Sync`;
- temporal breakdown: kernel_time = last end - first start of those events; idle = kernel_time
  minus the length of their union; compute = the length of the compute kernels' union;
  non_compute = the rest; percentages of kernel_time, rounded to 2 places;
- overlap: the length of (compute union ∩ communication union) over the communication union's.

On a trace without GPU kernels HTA fails (IndexError, NaN); these rows then say so (None).
"""

from __future__ import annotations

import functools
import math
import re

from distval.results import Table
from distval.trace import intervals as iv
from distval.trace.events import RankTrace

_COMM = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
TEMPORAL = ("rank", "idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)", "idle_time_pctg",
            "compute_time_pctg", "non_compute_time_pctg")


@functools.lru_cache(maxsize=65536)
def kernel_type(name: str) -> str:
    if _COMM.match(name):
        return "comm"
    if _MEMORY.match(name):
        return "memory"
    return "other" if _NOT_COMPUTE.match(name) else "compute"


def _kernels(rt: RankTrace, filter_steps: bool) -> list[tuple[float, float, str]]:
    """(start, end, type) of the GPU events HTA 0.5.0 keeps for this rank."""
    events = [(k, (math.ceil(s), math.floor(e), kernel_type(name)))  # HTA rounds ns-resolution times inward
              for k, (s, e, stream, _, name) in enumerate(rt.kernels) if stream != -1]
    if filter_steps and rt.profiler_steps:
        last_start = max(start for _, start, _ in rt.profiler_steps)
        launched = {c for ts, c in zip(rt.launch_ts, rt.launch_corr) if ts < last_start}
        events = [(k, x) for k, x in events if rt.kernel_corr[k] >= 0 and rt.kernel_corr[k] in launched]
    return [x for _, x in events]


def tables(ranks: list[RankTrace]) -> list[Table]:
    if not any(rt.on_gpu for rt in ranks):
        return []
    distinct_steps = {n for rt in ranks for n, _, _ in rt.profiler_steps}
    temporal = Table("hta_temporal", list(TEMPORAL), title="HTA temporal breakdown (HTA 0.5.0's definitions)",
                     units={c: "us" for c in TEMPORAL if c.endswith("(us)")})
    overlap = Table("hta_overlap", ["rank", "comp_comm_overlap_pctg"],
                    title="HTA communication/computation overlap (HTA 0.5.0's definition)")
    for rt in ranks:
        kernels = _kernels(rt, len(distinct_steps) >= 2)
        if not kernels:
            continue
        every = iv.union((s, e) for s, e, _ in kernels)
        compute = iv.union((s, e) for s, e, t in kernels if t == "compute")
        comm = iv.union((s, e) for s, e, t in kernels if t == "comm")
        span = every[-1][1] - every[0][0]
        idle, busy = span - iv.length(every), iv.length(compute)
        temporal.add(**dict(zip(TEMPORAL, (rt.rank, idle, busy, span - busy - idle, span, *(
            round(100 * x / span, 2) if span else None for x in (idle, busy, span - busy - idle))))))
        comm_len, both = iv.length(comm), iv.length(iv.intersect(compute, comm))
        overlap.add(rank=rt.rank, comp_comm_overlap_pctg=round(100 * both / comm_len, 2) if comm_len else None)
    return [temporal, overlap]
