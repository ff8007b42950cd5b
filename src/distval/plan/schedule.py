"""A step as tasks on two streams, compute and communication, and its duration.

Each stream runs its tasks one at a time in list order; a task starts when its stream is free
and every task it depends on has ended (CUDA streams with events, or NCCL's one communication
stream). That is enough to express what overlaps in data-parallel training: DDP's bucket
all-reduce starts when backward has produced the bucket and runs while backward continues;
ZeRO-3 gathers the next unit's parameters while this unit computes (one unit of prefetch).

    serial(tasks)    = Σ durations                   (no overlap: the upper bound)
    makespan(tasks)  = end of the last task          (overlap as the dependencies allow)
    max(Σ compute, Σ comm)                           (perfect overlap: the lower bound)

A step is a list of phases (repeat, tasks): micro-batches that are scheduled alike. Phases run one
after another, so communication still in flight at the end of a micro-batch is not overlapped with
the next micro-batch's forward (slightly pessimistic for ZeRO-2 with accumulation).
"""

from __future__ import annotations

from dataclasses import dataclass

COMPUTE, COMM = "compute", "comm"


@dataclass(frozen=True)
class Task:
    label: str
    stream: str  # COMPUTE or COMM
    duration_s: float | None  # None: unknown (no link, or no sequence length)
    deps: tuple[int, ...] = ()
    op: str | None = None  # comm: the collective
    size_bytes: float = 0.0  # comm: nccl-tests' S of one call
    sent_bytes: float = 0.0  # comm: bytes this rank sends (bus factor × S)
    algorithm: str = ""
    source: str = ""


@dataclass(frozen=True)
class Phase:
    repeat: int
    tasks: tuple[Task, ...]


def total(phases: list[Phase], stream: str) -> float | None:
    values = [(p.repeat, t.duration_s) for p in phases for t in p.tasks if t.stream == stream]
    if any(d is None for _, d in values):
        return None
    return sum(r * d for r, d in values)


def makespan(tasks: tuple[Task, ...]) -> float | None:
    if any(t.duration_s is None for t in tasks):
        return None
    free = {COMPUTE: 0.0, COMM: 0.0}
    end: list[float] = []
    for i, t in enumerate(tasks):
        assert all(d < i for d in t.deps), f"task {t.label} depends on a later task"
        start = max([free[t.stream]] + [end[d] for d in t.deps])
        end.append(start + t.duration_s)
        free[t.stream] = end[-1]
    return max(end, default=0.0)


def step_time(phases: list[Phase], overlap: bool) -> float | None:
    if not overlap:
        comm, compute = total(phases, COMM), total(phases, COMPUTE)
        return None if comm is None or compute is None else comm + compute
    spans = [makespan(p.tasks) for p in phases]
    if any(s is None for s in spans):
        return None
    return sum(p.repeat * s for p, s in zip(phases, spans))
