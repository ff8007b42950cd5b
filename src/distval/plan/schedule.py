"""A step as tasks on two streams, compute and communication, and its duration.

Each stream runs its tasks one at a time in list order; a task starts when its stream is free
and every task it depends on has ended (CUDA streams with events, or NCCL's one communication
stream). That is enough to express what overlaps in data-parallel training: DDP's bucket
all-reduce starts when backward has produced the bucket and runs while backward continues;
ZeRO-3 gathers the next unit's parameters while this unit computes (one unit of prefetch).

    serial(tasks)    = Σ durations                   (no overlap: the upper bound)
    run(tasks)       = end of the last task          (overlap as the dependencies allow, each of a
                                                      compute task and a collective that overlap
                                                      slowed by the measured interference)
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


def run(tasks: tuple[Task, ...], interference: float = 0.0) -> tuple[float, float] | None:
    """(makespan, the compute stream's busy seconds) of one phase. While a compute task and a
    collective run at once each goes at 1/(1 + interference) of its own speed: 0 is perfect
    overlap, 1 as slow as running them one after the other. On a CPU host the backend's threads
    and the kernel's packet work take cores from the compute (`comm bench`'s overlap probe measures
    it); on a GPU, NCCL's kernels take SMs. None when a duration is unknown."""
    if any(t.duration_s is None for t in tasks):
        return None
    slow = 1.0 + max(0.0, interference)
    end: list[float | None] = [None] * len(tasks)
    waiting = {s: [i for i, t in enumerate(tasks) if t.stream == s] for s in (COMPUTE, COMM)}
    running: dict[str, list] = {}  # stream -> [task index, work left in seconds at full speed]
    now = busy = 0.0
    while any(waiting.values()) or running:
        for stream, queue in waiting.items():
            if stream not in running and queue:
                t = tasks[queue[0]]
                assert all(d < queue[0] for d in t.deps), f"task {t.label} depends on a later task"
                if all(end[d] is not None for d in t.deps):
                    running[stream] = [queue.pop(0), t.duration_s]
        # the lowest unfinished task's dependencies have all ended: something always runs
        speed = 1.0 / slow if len(running) == 2 else 1.0
        dt = min(left for _, left in running.values()) / speed
        now += dt
        busy += dt if COMPUTE in running else 0.0
        for stream, task in list(running.items()):
            task[1] -= dt * speed
            if task[1] <= 1e-12:
                end[task[0]] = now
                del running[stream]
    return now, busy


def step_time(phases: list[Phase], overlap: bool, interference: float = 0.0) -> tuple[float, float] | None:
    """(step seconds, the compute stream's busy seconds): with overlap each phase's schedule (its
    compute stretched where collectives overlap it), without it Σ comm + Σ compute."""
    if not overlap:
        comm, compute = total(phases, COMM), total(phases, COMPUTE)
        return None if comm is None or compute is None else (comm + compute, compute)
    runs = [run(p.tasks, interference) for p in phases]
    if any(r is None for r in runs):
        return None
    return sum(p.repeat * r[0] for p, r in zip(phases, runs)), sum(p.repeat * r[1] for p, r in zip(phases, runs))
