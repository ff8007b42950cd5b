"""The lost-time rule (`Slowed`): which rank lost wall time beyond its peers, bucket by bucket,
from the shares health/lost.py's sampler measures (stopped, throttled, queued; the host's foreign
CPU). Pure: fed buckets, it returns findings; health/lost.py's docstring states the rule whole."""

from __future__ import annotations

import collections
import statistics

from distval.health.config import HealthConfig
from distval.health.findings import Finding, onset

BUCKET_S = 1.0  # the unit of the rule: lost shares per second
WINDOW = 9  # buckets the median excess is taken over (9 s): a burst under 6 s never holds it for PERSIST
PERSIST = 6  # buckets in a row the rule must hold before a rank is named (6 s) ...
MIN_STEPS = 20  # ... over which the job made at least this many steps (where steps are known)
STARTUP_S = 30.0  # where the job's steps are unknown, judging begins this long after the first bucket
HOST_QUEUE = 0.2  # every rank queued this share of its runnable time: the host is oversubscribed (said once)
FOREIGN_CPUS = 0.25  # other processes' CPU below this: a rank's longer compute is the job's own oversubscription
HOST_HISTORY = 3600  # buckets the host note is the median of (the last hour)


class Slowed:
    """The rule over the buckets: `update` with each bucket's shares by rank, the job's step and
    the foreign CPU of the bucket (cores other processes used; None: unknown, no bound).

    A rank's excess in a bucket: its stopped share less its peers' median, plus the larger of its
    throttled share less its peers' median and its queued share less what its peers' queue ratio
    (queued over runnable time) would have made of its runnable time, the latter at most what
    the foreign CPU could have held from its runnable threads. A host that every rank contends
    for gives every runnable rank about the same ratio (the scheduler is fair), so a rank that
    alone runs (an evaluation on rank 0 while the others wait) is not blamed for the queue a busy
    host gives it; a rank on a core another process holds, or under a CPU quota, queues far longer
    than its peers for the same work. A peer not runnable for `MIN_RUNNABLE` of a bucket has no
    ratio of its own there: each peer's is the median of its last `window` known ratios
    (`HISTORY` buckets back at most)."""

    MIN_RUNNABLE = 0.05
    HISTORY = 60

    def __init__(self, cfg: HealthConfig, window: int = WINDOW, persist: int = PERSIST, min_steps: int = MIN_STEPS):
        self.threshold = 1 - 1 / cfg.slow_ratio
        self.window, self.persist, self.min_steps = window, persist, min_steps
        self.buckets: collections.deque[tuple[int | None, dict[int, dict[str, float]]]] = collections.deque(
            maxlen=window)
        self.excess: dict[int, collections.deque[tuple[int | None, float]]] = collections.defaultdict(
            lambda: collections.deque(maxlen=6 * window))  # enough before a finding to find its onset
        self.ratios: dict[int, collections.deque[float | None]] = collections.defaultdict(
            lambda: collections.deque(maxlen=self.HISTORY))
        self.streak: dict[int, list] = {}  # rank -> [buckets in a row over the threshold, the step it began]
        self.current: dict[int, Finding] = {}
        self.findings: list[Finding] = []
        self.host: collections.deque[tuple[float, float | None]] = collections.deque(
            maxlen=HOST_HISTORY)  # per judged bucket: the ranks' median queue ratio, the foreign CPUs

    def update(self, step: int | None, shares: dict[int, dict[str, float]],
               foreign: float | None = None) -> Finding | None:
        if len(shares) < 2 or step == 0:  # one rank has no peers; before the first step is start-up
            return None
        for r, mine in shares.items():
            self.ratios[r].append(mine["queued"] / mine["runnable"] if mine["runnable"] >= self.MIN_RUNNABLE
                                  else None)
        bases = {r: self._peers_ratio(r, shares) for r in shares}
        known = [q for r in shares if (q := self.ratios[r][-1]) is not None]
        self.host.append((statistics.median(known) if known else 0.0, foreign))
        for r, mine in shares.items():
            mine["peers_ratio"], mine["foreign"] = bases[r], foreign
            stopped, throttled = (mine[key] - statistics.median(v[key] for k, v in shares.items() if k != r)
                                  for key in ("stopped", "throttled"))
            queued = mine["queued"] - (bases[r] if bases[r] is not None else mine["queued"] / max(
                mine["runnable"], 1e-9)) * mine["runnable"]
            if foreign is not None:  # the job's own processes queue each other: only others' CPU is "outside"
                queued = min(queued, foreign * max(mine["runnable"], 1.0))
            self.excess[r].append((step, stopped + max(throttled, queued)))  # a throttled thread is queued too
        self.buckets.append((step, shares))
        if len(self.buckets) < self.window // 2:
            return None
        new = None
        for r in shares:
            score = statistics.median(x for _, x in list(self.excess[r])[-self.window:])
            if score < (self.threshold / 2 if r in self.current else self.threshold):
                self.streak.pop(r, None)
                if r in self.current:
                    self.current.pop(r).details["until_step"] = step
                continue
            streak = self.streak.setdefault(r, [0, step])
            streak[0] += 1
            lasted = streak[0] >= self.persist and (step is None or streak[1] is None
                                                    or step - streak[1] >= self.min_steps)
            if not lasted and r not in self.current:
                continue
            found = self._finding(r, step, score)
            if r not in self.current:
                self.current[r] = found
                self.findings.append(found)
                new = new or found
        return new

    def by_host(self, r: int, slowdown: float) -> bool:
        """Whether a compute `slowdown` of rank r (its compute over its peers', the compute rule's)
        is the host's scheduling of the job's own processes: over the last window r waited for a
        CPU enough more of its runnable time than its peers to make half of it or more, while other
        processes took under `FOREIGN_CPUS` (their CPU makes it a straggler slowed from outside,
        this rule's own finding). Compute is wall time: a rank the scheduler serves less computes
        longer, and on a host whose cores the job oversubscribes one rank is served less in turn."""
        mine = [q for q in list(self.ratios[r])[-self.window:] if q is not None]
        peers = self._peers_ratio(r, {k: {} for k in self.ratios})
        foreign = [f for _, f in list(self.host)[-self.window:] if f is not None]
        if len(mine) < self.window // 2 or peers is None or (foreign and statistics.median(foreign) >= FOREIGN_CPUS):
            return False
        ratio = statistics.median(mine)
        explained = (1 - peers) / (1 - min(ratio, 0.95)) if ratio > peers else 1.0
        return explained - 1 >= (slowdown - 1) / 2

    def host_note(self, cores: int) -> str | None:
        """One line when every rank waited for a CPU (`HOST_QUEUE` of its runnable time or more, as
        the median over the judged buckets): the host, not a rank; None otherwise."""
        if len(self.host) < self.window:
            return None
        queue = statistics.median(q for q, _ in self.host)
        if queue < HOST_QUEUE:
            return None
        foreign = [f for _, f in self.host if f is not None]
        others = statistics.median(foreign) if foreign else None
        cause = (f"other processes used {others:.1f} of its {cores} CPUs" if others is not None and others >= 0.25
                 else f"the job's ranks and their threads want more than its {cores} CPUs")
        return (f"the host is oversubscribed: every rank waited for a CPU {queue:.0%} of its runnable time (median "
                f"over {len(self.host) * BUCKET_S:.0f} s); {cause}. Not one rank: no straggler")

    def _peers_ratio(self, r: int, shares: dict[int, dict[str, float]]) -> float | None:
        """The median over the peers of each one's queue ratio (the median of its last `window`
        known ones; None: no peer ran enough to have one)."""
        per_peer = []
        for k in shares:
            known = [q for q in self.ratios[k] if q is not None][-self.window:] if k != r else []
            if known:
                per_peer.append(statistics.median(known))
        return statistics.median(per_peer) if per_peer else None

    def _finding(self, r: int, step: int | None, excess: float) -> Finding:
        mine = [s[r] for _, s in self.buckets if r in s]
        stopped, throttled, queued, runnable = (statistics.median(v[key] for v in mine)
                                                for key in ("stopped", "throttled", "queued", "runnable"))
        peers = [v["peers_ratio"] for v in mine if v["peers_ratio"] is not None]
        foreign = [v["foreign"] for v in mine if v["foreign"] is not None]
        ratio, peers_ratio = queued / max(runnable, 1e-9), statistics.median(peers) if peers else 0.0
        others = statistics.median(foreign) if foreign else None
        held = sum(stopped_or_throttled - statistics.median(statistics.median(v[key] for k, v in b.items() if k != r)
                                                            for _, b in self.buckets if r in b)
                   for key, stopped_or_throttled in (("stopped", stopped), ("throttled", throttled)))
        # Held a share of the time, it runs 1/(1 - share) slower; queued a larger share of its
        # runnable time than its peers, its work takes (1 - theirs)/(1 - its) longer. The larger
        # of the two (a throttled thread is queued too: not both).
        slowdown = max(1 / (1 - min(max(held, 0.0), 0.9)), (1 - peers_ratio) / (1 - min(ratio, 0.95))
                       if ratio > peers_ratio else 1.0)
        since = self.current[r].step if r in self.current else self._onset(r, excess)
        causes = [f"{label} {share:.0%} of the time" for label, share in (("stopped", stopped), (
            "throttled by its cgroup's CPU quota", throttled)) if share >= 0.01]
        if queued >= 0.01 and ratio - peers_ratio >= 0.05:  # a queue its peers have too is not a cause
            causes.append(f"its threads waiting for a CPU {queued:.2f} s a second, {ratio:.0%} of their runnable time "
                          f"against its peers' {peers_ratio:.0%}"
                          + (f", while other processes used {others:.1f} CPUs" if others is not None else ""))
        text = (f"rank {r} is a straggler slowed from outside its process since step {since}: "
                f"{'; '.join(causes) or 'it lost time in bursts'}; {slowdown:.2f}x slower than its peers, who wait "
                f"for it")
        details = {"slowdown": round(slowdown, 3), "since_step": since, "lost_share": round(stopped + queued, 3),
                   "excess_share": round(excess, 3), "stopped_share": round(stopped, 3),
                   "throttled_share": round(throttled, 3),
                   "queued_share": round(queued, 3), "queue_ratio": round(ratio, 3),
                   "peers_queue_ratio": round(peers_ratio, 3),
                   "foreign_cpus": round(others, 3) if others is not None else None,
                   "window_s": len(mine) * BUCKET_S, "decided_by": ["lost_time"]}
        if r in self.current:  # still one: the figures follow the window
            found = self.current[r]
            found.summary, found.details = text, {**found.details, **details}
            return found
        return Finding("straggler", "WARN", since if since is not None else 0, [r], text,
                       {**details, "detected_step": step})

    def _onset(self, r: int, excess: float) -> int | None:
        """The step its excess began: `findings.onset` of its excess series, a healthy rank's
        excess being nil."""
        series = list(self.excess[r])
        start = onset([x for _, x in series], self.threshold, excess, healthy=0.0)
        return next((s for s, _ in series[start:] if s is not None), None)
