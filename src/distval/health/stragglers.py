"""Stragglers by their compute: per step each rank's compute time over the median of its peers'; a
rank is a straggler when the median of that ratio over the last `window` steps reaches
`slow_ratio` (a one-off hiccup moves a median by nothing) and its excess compute costs the job at
least `min_loss` of the step time (a 20% slower compute that is 2% of a communication-bound step is
noise, not a straggler), and has done so for `window` steps and `PERSIST_S` seconds in a row (on a
shared host one rank can be descheduled for streaks of ten steps, or of a second of 5 ms steps;
those are not stragglers); the first `WARMUP_STEPS` are not judged. Reported: the rank, its
slowdown (x), since which step, the share of each step the others wait for it, and the throughput
lost (tokens/s now against the step with the straggler at the median). One of the detectors of
health/monitor.py; a rank slowed from outside its process is health/lost.py's."""

from __future__ import annotations

import collections
from typing import Callable

from distval.health.config import HealthConfig
from distval.health.findings import WARMUP_STEPS, Finding, fast_median, onset

PERSIST_S = 8.0  # a straggler's window must have met the rule this long (and `window` steps) in a row
HISTORY_STEPS = 4000  # steps of ratios kept to find a straggler's onset in (8 s of 2 ms steps, with room)
ONSET_POINTS = 150  # the onset is searched over at most this many blocks of those steps
STRAGGLER_HINT = ("the straggler's host: thermal throttling, another process on its cores (top, taskset), a CPU quota "
                  "(its cgroup's cpu.max or cpu.cfs_quota_us), a slower device or link, its data loader; its compute "
                  "time per step, or the time it could not run, is in details")


class Stragglers:
    """Each step's figures per rank are taken once, as the step arrives (its compute over its
    peers' median, its excess compute, the peers' wait; the slowest's step time), into windows of
    their own, so the rule costs a few sorts of `window` numbers per step (~20 µs at 2 ranks), not
    a pass over the window's rows."""

    def __init__(self, cfg: HealthConfig, by_host: Callable[[int, float], bool] | None = None):
        self.cfg = cfg
        self.by_host = by_host  # (rank, slowdown) -> its slowness is the host's scheduling (health/lost.py)
        self.seen = 0  # steps fed, the warm-up's included
        self.step_s: collections.deque[float] = collections.deque(maxlen=cfg.window)  # the slowest's
        self.ratio: list[collections.deque[float]] = []  # per rank, over the window
        self.excess: list[collections.deque[float]] = []
        self.waiting: list[collections.deque[float]] = []
        self.history: collections.deque[tuple[int, list[float]]] = collections.deque(
            maxlen=HISTORY_STEPS)  # (step, every rank's ratio): the onset's
        self.current: dict[int, Finding] = {}  # rank -> its finding while it is a straggler
        self.streak: dict[int, list[float]] = {}  # rank -> [steps in a row its window met the rule, their seconds]
        self.findings: list[Finding] = []

    def update(self, step: int, ranks: list[dict[str, float]], tokens: float | None) -> Finding | None:
        """`tokens`: the job's tokens per step (None for a script: rates in steps/s)."""
        self.seen += 1
        if len(ranks) < 2 or self.seen <= WARMUP_STEPS:  # the first steps (allocation, warm caches) are not judged
            return None
        if len(self.ratio) != len(ranks):
            self.ratio, self.excess, self.waiting = ([collections.deque(maxlen=self.cfg.window) for _ in ranks]
                                                     for _ in range(3))
        figures = [_figures(ranks, r) for r in range(len(ranks))]
        for r, (ratio, excess, waiting) in enumerate(figures):
            self.ratio[r].append(ratio)
            self.excess[r].append(excess)
            self.waiting[r].append(waiting)
        self.step_s.append(max(x["step_s"] for x in ranks))
        self.history.append((step, [f[0] for f in figures]))
        if len(self.step_s) < self.cfg.window // 2:
            return None
        step_s = fast_median(self.step_s)
        new = None
        for r in range(len(ranks)):
            slowdown, excess = fast_median(self.ratio[r]), fast_median(self.excess[r])
            if slowdown < self.cfg.slow_ratio or excess < self.cfg.min_loss * step_s:
                self.streak.pop(r, None)
                if r in self.current:
                    self.current.pop(r).details["until_step"] = step
                continue
            streak = self.streak.setdefault(r, [0, 0.0])
            streak[0], streak[1] = streak[0] + 1, streak[1] + self.step_s[-1]
            if (streak[0] < self.cfg.window or streak[1] < PERSIST_S) and r not in self.current:
                continue  # not yet lasting: a streak of a busy host's scheduling is not a straggler
            if r not in self.current and self.by_host is not None and self.by_host(r, slowdown):
                continue  # served less CPU than its peers by a host the job itself oversubscribes
            since = self.current[r].step if r in self.current else self._onset(r, slowdown)
            waiting = fast_median(self.waiting[r])
            work, unit = (tokens, "tokens/s") if tokens is not None else (1.0, "steps/s")  # a script: no tokens
            now, fixed = work / step_s, work / max(step_s - max(excess, 0.0), 1e-9)
            rate = "tokens_per_s" if tokens is not None else "steps_per_s"
            details = {"slowdown": round(slowdown, 3), "since_step": since, "others_waiting_share": round(waiting, 3),
                       rate: round(now, 2), f"{rate}_at_median": round(fixed, 2),
                       "throughput_lost": round(1 - now / fixed, 3), "window": len(self.step_s),
                       "held_s": round(streak[1], 1)}
            text = (f"rank {r} is a straggler: {slowdown:.2f}x the compute time of its peers since step {since}; "
                    f"the others wait {waiting:.0%} of each step for it; {_rate(now)} {unit} instead of "
                    f"{_rate(fixed)} ({1 - now / fixed:.0%} lost)")
            if r in self.current:  # still one: the figures follow the window, since stays
                found = self.current[r]
                found.summary = text.replace(f"since step {since}", f"since step {found.step}")
                found.details = {**found.details, **details, "since_step": found.step}
                continue
            found = Finding("straggler", "WARN", since, [r], text, {**details, "detected_step": step})
            self.current[r] = found
            self.findings.append(found)
            new = new or found
        return new

    def scores(self) -> dict[int, float]:
        """Each rank's compute over its peers' median, as the window's median (what the rule compares
        with `slow_ratio`)."""
        return {r: fast_median(ratios) for r, ratios in enumerate(self.ratio) if ratios}

    def _onset(self, r: int, slowdown: float) -> int:
        """The step rank r's slowness began: `findings.onset` of its compute ratio over the history
        (back past the streak's start: a streak lasts `window` steps and `PERSIST_S`), taken over
        the medians of blocks of steps (`ONSET_POINTS` at most: exact to a block), a healthy rank's
        ratio being 1.0."""
        block = -(-len(self.history) // ONSET_POINTS)
        history = list(self.history)
        ratios = [fast_median(all_ranks[r] for _, all_ranks in history[i:i + block])
                  for i in range(0, len(history), block)]
        return history[onset(ratios, self.cfg.slow_ratio, slowdown, healthy=1.0) * block][0]


def _figures(rows: list[dict[str, float]], r: int) -> tuple[float, float, float]:
    """Rank r in one step: its compute over its peers' median, its compute beyond that median (s),
    and the mean share of the step its peers waited in collectives."""
    peers = [x for k, x in enumerate(rows) if k != r]
    median = fast_median(x["compute_s"] for x in peers)
    return (rows[r]["compute_s"] / max(median, 1e-9), rows[r]["compute_s"] - median,
            sum(x["blocked_s"] / max(x["step_s"], 1e-9) for x in peers) / len(peers))


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.2f}"
