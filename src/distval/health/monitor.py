"""The training health monitor: stragglers, numerics, replica consistency and memory, decided on
rank 0 from what every rank measured in the step, gathered in one collective over the control
group (the same one that already gave the step's slowest time and the mean loss).

Per rank and step (`RankStep`): the step time, the time the training thread computed (the step
minus the time it waited in collectives: `comm_blocked_s`), the wait itself, its local loss, its
current and peak memory. Rank 0 feeds the gathered rows to the detectors; each returns at most one
new `Finding` per step (a live line on the terminal) and keeps its findings for the report:

  stragglers   three scores per rank over the last `window` steps (`Stragglers`): its compute over
               its peers' (relative), over its own earlier level (individual), and the share of
               the step its peers wait for it (waited); a rank meeting one of them in most of the
               last `window` steps is a straggler (a one-off hiccup, a scheduling streak of a
               shared host are not). Reported: the rank, its slowdown (×), since which step, the
               share of each step the others wait for it, the throughput lost (tokens/s now
               against the step without it), and which score(s) decided it
  numerics     the first non-finite local loss (the rank(s) named) or, with every loss finite, the
               first non-finite gradient norm (the first parameter with a non-finite gradient
               named): a FAIL; a gradient norm above `spike` × its running median: a WARN
  replicas     every `every` steps, an exact checksum of each parameter on each rank, compared
               where ranks must agree (every rank for the data-parallel family and ZeRO-1/2; a
               fully sharded strategy has no replicas to compare): a FAIL naming the step, the
               rank(s) outside the majority and the tensors
  memory       a rank whose peak exceeds the ranks' median by `imbalance` (and 64 MiB): a WARN; a
               rank whose current memory grows steadily (its median over the last third of the
               window above that over the first third by over 1 MiB per step and 64 MiB in all):
               a WARN with the growth per step
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from distval.health import ranks_text

MIB = 1 << 20
PERSIST = 0.8  # a straggler's window meets the rule in this share of the last `window` steps (a duty cycle flickers)
RANK_WINDOW = 1000  # steps of each rank's compute and waiting kept for the per-rank table
FIELDS = ("step_s", "compute_s", "blocked_s", "loss", "mem_current", "mem_peak")  # what each rank contributes


@dataclass(frozen=True)
class HealthConfig:
    window: int = 50  # steps the straggler and leak statistics look at (and a straggler must persist)
    slow_ratio: float = 1.15  # a rank's compute over its peers' median, as a window median: a straggler ...
    min_loss: float = 0.05  # ... that costs the job at least this share of its step time, for `window` steps
    min_wait: float = 0.10  # or: its peers wait at least this share of the step longer than it, as it arrives last most
    spike: float = 5.0  # a gradient norm above this × its running median: a WARN
    every: int = 50  # replica checksums compared every this many steps (0: never)
    imbalance: float = 0.25  # a rank's peak memory above the ranks' median by this share: a WARN
    on_nan: str = "warn"  # warn: a FAIL in the report, training goes on | stop: stop before the update

    def __post_init__(self) -> None:
        if self.window < 4:
            raise ValueError(f"the health window must be at least 4 steps (got {self.window})")
        if self.slow_ratio <= 1.0:
            raise ValueError(f"--straggler-ratio must be above 1 (got {self.slow_ratio:g}), e.g. 1.1")
        if not 0 < self.min_wait < 1:
            raise ValueError(f"the straggler wait share must be in (0, 1) (got {self.min_wait:g})")
        if self.every < 0:
            raise ValueError(f"--check-replicas-every must be 0 (off) or more (got {self.every})")
        if self.on_nan not in ("warn", "stop"):
            raise ValueError(f"--on-nan must be warn or stop (got {self.on_nan!r})")


@dataclass
class Finding:
    kind: str  # straggler | nonfinite | grad_spike | replicas | memory_imbalance | memory_growth
    status: str  # WARN | FAIL
    step: int  # the first step it was seen at
    ranks: list[int]
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)



class Stragglers:
    """Names a rank that slows the job, from three scores over the last `window` steps, each
    taken per chunk of `window // 5` steps (sums within a chunk, so a slowdown that hits one step
    in four, as a duty cycle of a throttled process does, still counts) and as the median over
    the chunks (so one slow chunk, a hiccup, moves it by nothing):

      relative    the rank's compute over the median of its peers' (nvidia-resiliency-ext's
                  relative score, inverted): ≥ `slow_ratio`, its excess ≥ `min_loss` of the step
      individual  the rank's compute over its own earlier level (its baseline: the median of its
                  past windows' relative scores; the straggler extension's individual score),
                  divided by its peers' own: ≥ `slow_ratio`, the excess ≥ `min_loss` of the step
                  (a whole host slowing is nobody's fault, so the peers' own change is divided out)
      waited      the share of the step the others wait for it: per step, how much longer its
                  peers waited in collectives than it did (it arrived last), summed over the
                  chunk over the chunk's step time: ≥ `min_wait`, ≥ `wait_factor` × every other
                  rank's, and it is the last to arrive in more steps than any other rank

    A rank meeting any of them for `window` steps in a row is a straggler (on a shared host one
    rank is descheduled for streaks of tens of steps; those are not stragglers). The waited score
    sees what the compute ratio misses: a rank stopped from outside (SIGSTOP, a CPU quota) is
    stopped inside a collective as often as in its compute, and there the stop is everybody's
    wait, its own included; only the stops in its compute make it arrive last, and those are
    seen by its peers' wait for it."""

    def __init__(self, cfg: HealthConfig):
        self.cfg = cfg
        self.rows: collections.deque[tuple[int, list[dict[str, float]]]] = collections.deque(maxlen=cfg.window)
        self.history: collections.deque[tuple[int, list[dict[str, float]]]] = collections.deque(maxlen=3 * cfg.window)
        self.baseline: dict[int, collections.deque[float]] = {}  # rank -> its past windows' relative scores
        self.current: dict[int, Finding] = {}  # rank -> its finding while it is a straggler
        self.held: dict[int, collections.deque[bool]] = {}  # rank -> its window met the rule? (last `window` steps)
        self.findings: list[Finding] = []
        self.updates = 0  # windows decided on: every `window`-th adds to the ranks' baselines

    def update(self, step: int, ranks: list[dict[str, float]], tokens: float | None) -> Finding | None:
        """`tokens`: the job's tokens per step (None for a script: rates in steps/s)."""
        if len(ranks) < 2:
            return None
        self.rows.append((step, ranks))
        self.history.append((step, ranks))
        if len(self.rows) < self.cfg.window // 2:
            return None
        scores = self.scores(len(ranks))
        self.updates += 1
        new = None
        for r, score in enumerate(scores):
            decided = self.decide(r, scores)
            if self.updates % self.cfg.window == 0 and not decided and r not in self.current:
                self.baseline.setdefault(r, collections.deque(maxlen=20)).append(score["relative"])
            held = self.held.setdefault(r, collections.deque(maxlen=self.cfg.window))
            held.append(bool(decided))
            if r in self.current and sum(held) < (1 - PERSIST) * self.cfg.window:  # it has recovered
                self.current.pop(r).details["until_step"] = step
            if sum(held) < PERSIST * self.cfg.window and r not in self.current:
                continue  # not yet persistent: a streak of a busy host's scheduling is not a straggler
            if not decided:
                continue  # one window short of it: the rank stays a straggler, nothing new to say
            found = self.report(step, r, score, decided, tokens)
            new = new or found
        return new

    def scores(self, world_size: int) -> list[dict[str, float]]:
        """Each rank's scores over the window: the compute ratio as the median of the steps' (the
        rule that stayed quiet on every clean run of this host); the wait for it and how often it
        arrived last as the median over chunks of each chunk's sums."""
        size = max(self.cfg.window // 5, 1)
        rows = list(self.rows)
        chunks = [rows[i:i + size] for i in range(len(rows) % size, len(rows), size)]  # the newest complete ones
        per_chunk = [_chunk_scores(chunk, world_size) for chunk in chunks]
        step_s = statistics.median(max(x["step_s"] for x in ranks) for _, ranks in rows)  # the slowest's
        out = []
        for r in range(world_size):
            excess = statistics.median(ranks[r]["compute_s"] - statistics.median(
                x["compute_s"] for k, x in enumerate(ranks) if k != r) for _, ranks in rows)
            out.append({"relative": statistics.median(_ratio(ranks, r) for _, ranks in rows),
                        "excess": excess / max(step_s, 1e-9),
                        "compute": statistics.median(ranks[r]["compute_s"] for _, ranks in rows) / max(step_s, 1e-9),
                        **{key: statistics.median(c[r][key] for c in per_chunk) for key in ("waited", "last")}})
        return out

    def decide(self, r: int, scores: list[dict[str, float]]) -> list[str]:
        """The scores by which rank r is a straggler in this window (empty: it is not)."""
        cfg, mine = self.cfg, scores[r]
        peers = [s for k, s in enumerate(scores) if k != r]
        decided = []
        if mine["relative"] >= cfg.slow_ratio and mine["excess"] >= cfg.min_loss:
            decided.append("relative")
        past = self.baseline.get(r)
        if past:  # its compute over its own earlier level, its peers' own change divided out
            individual = mine["individual"] = mine["relative"] / max(statistics.median(past), 1e-9)
            if individual >= cfg.slow_ratio and mine["compute"] * (1 - 1 / individual) >= cfg.min_loss:
                decided.append("individual")
        if mine["waited"] >= cfg.min_wait and mine["last"] > 1 / len(scores) and all(
                mine["last"] >= p["last"] for p in peers):
            decided.append("waited")
        return decided

    def report(self, step: int, r: int, score: dict[str, float], decided: list[str],
               tokens: float | None) -> Finding | None:
        """A new finding for rank r (returned), or the figures of its current one brought up to date."""
        step_s = statistics.median(max(x["step_s"] for x in rows) for _, rows in self.rows)  # the slowest's
        cost = max(score["excess"], score["waited"]) * step_s  # what the job loses to it per step
        since = self.current[r].step if r in self.current else self._onset(r, decided)
        waiting = statistics.median(statistics.mean(x["blocked_s"] / max(x["step_s"], 1e-9)
                                                    for k, x in enumerate(rows) if k != r) for _, rows in self.rows)
        work, unit = (tokens, "tokens/s") if tokens is not None else (1.0, "steps/s")  # a script: no tokens
        now, fixed = work / step_s, work / max(step_s - cost, 1e-9)
        rate = "tokens_per_s" if tokens is not None else "steps_per_s"
        slowdown = score["relative"]
        details = {"slowdown": round(slowdown, 3), "since_step": since, "others_waiting_share": round(waiting, 3),
                   "waited_for_share": round(score["waited"], 3), "last_share": round(score["last"], 3),
                   **({"individual": round(score["individual"], 3)} if "individual" in score else {}),
                   "decided_by": decided, rate: round(now, 2), f"{rate}_at_median": round(fixed, 2),
                   "throughput_lost": round(1 - now / fixed, 3), "window": len(self.rows)}
        text = (f"rank {r} is a straggler: {slowdown:.2f}x the compute time of its peers since step {since}; "
                f"the others wait {waiting:.0%} of each step for it ({score['waited']:.0%} longer than it); "
                f"{_rate(now)} {unit} instead of {_rate(fixed)} ({1 - now / fixed:.0%} lost); decided by "
                f"{_decided_text(decided)}")
        if r in self.current:  # still one: the figures follow the window, since stays
            found = self.current[r]
            found.summary = text.replace(f"since step {since}", f"since step {found.step}")
            found.details = {**found.details, **details, "since_step": found.step}
            return None
        found = Finding("straggler", "WARN", since, [r], text, {**details, "detected_step": step})
        self.current[r] = found
        self.findings.append(found)
        return found

    def _onset(self, r: int, decided: list[str]) -> int:
        """The step rank r's slowness began: the change point of its per-step series over the
        history (three windows, so it reaches back past the streak's start), the split whose two
        sides sit closest to their own medians. Unlike counting steps over the threshold, a stretch
        of a busy host's scheduling (ratios a little over it) sides with the healthy level, not the
        slow one. The series is the compute ratio when that decided; otherwise the share of the
        step the others waited for it, spread over the steps of each chunk (alone, most steps of
        a duty cycle show nothing)."""
        if "waited" not in decided:
            series = [_ratio(rows, r) for _, rows in self.history]
        else:
            size = max(self.cfg.window // 5, 1)
            waits = [_waited(rows, r) / max(max(x["step_s"] for x in rows), 1e-9) for _, rows in self.history]
            series = [statistics.mean(waits[max(i - size // 2, 0):i + size // 2 + 1]) for i in range(len(waits))]

        def spread(xs: list[float]) -> float:
            mid = statistics.median(xs)
            return sum(abs(x - mid) for x in xs)

        split = min(range(1, len(series)), key=lambda i: (spread(series[:i]) + spread(series[i:]), i))
        return self.history[split][0]


def _chunk_scores(chunk: list[tuple[int, list[dict[str, float]]]], world_size: int) -> list[dict[str, float]]:
    """Per rank over a few steps: the peers' wait for it as a share of the step time (sums: a
    duty cycle that hits one step in four counts), and the share of steps it arrived last."""
    step_s = sum(max(x["step_s"] for x in rows) for _, rows in chunk)
    lasts = collections.Counter(min(range(world_size), key=lambda k: rows[k]["blocked_s"]) for _, rows in chunk)
    return [{"waited": sum(_waited(rows, r) for _, rows in chunk) / max(step_s, 1e-9), "last": lasts[r] / len(chunk)}
            for r in range(world_size)]


def _waited(rows: list[dict[str, float]], r: int) -> float:
    """How much longer rank r's peers waited in collectives in this step than r did (the median
    peer's, so one peer's own hiccup is not r's): the wait it caused by arriving after them.
    Negative when r waited for them: summed over steps, a healthy rank's evens out near 0."""
    peers = statistics.median(x["blocked_s"] for k, x in enumerate(rows) if k != r)
    return peers - rows[r]["blocked_s"]


def _decided_text(decided: list[str]) -> str:
    names = {"relative": "its compute against its peers'", "individual": "its compute against its own earlier steps",
             "waited": "its peers' wait for it"}
    return ", ".join(names[d] for d in decided)


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.2f}"


def _ratio(rows: list[dict[str, float]], r: int) -> float:
    peers = statistics.median(x["compute_s"] for k, x in enumerate(rows) if k != r)
    return rows[r]["compute_s"] / max(peers, 1e-9)


class NonFiniteStop(RuntimeError):
    """`--on-nan stop`: every rank stops before the update that would have made the model
    non-finite; the message names the rank(s) and the parameter."""


def nonfinite_text(step: int, losses: list[float], grad_norm: float, bad_param: str | None) -> tuple[list[int], str]:
    """(the ranks whose loss is non-finite, the finding's one line)."""
    bad = [r for r, v in enumerate(losses) if not math.isfinite(v)]
    what = (f"the loss of {ranks_text(bad)} is {losses[bad[0]]}" if bad
            else f"the gradient norm is {grad_norm} with every rank's loss finite")
    where = f"; first parameter with a non-finite gradient: {bad_param}" if bad_param else ""
    return bad, f"first non-finite value at step {step}: {what}{where}"


class Numerics:
    def __init__(self, cfg: HealthConfig):
        self.cfg = cfg
        self.norms: collections.deque[float] = collections.deque(maxlen=50)
        self.findings: list[Finding] = []
        self._nonfinite = False

    def update(self, step: int, losses: list[float], grad_norm: float, bad_param: str | None) -> Finding | None:
        if not self._nonfinite:
            bad, text = nonfinite_text(step, losses, grad_norm, bad_param)
            if bad or not math.isfinite(grad_norm):
                self._nonfinite = True
                found = Finding("nonfinite", "FAIL", step, bad, text,
                                {"losses": losses, "grad_norm": grad_norm, "parameter": bad_param})
                self.findings.append(found)
                return found
        if not math.isfinite(grad_norm):
            return None
        median = statistics.median(self.norms) if len(self.norms) >= 10 else None
        self.norms.append(grad_norm)
        if median and grad_norm > self.cfg.spike * median:
            found = Finding("grad_spike", "WARN", step, [],
                            f"gradient norm spike at step {step}: {grad_norm:.3g}, {grad_norm / median:.1f}x its "
                            f"running median {median:.3g}", {"grad_norm": grad_norm, "median": median})
            self.findings.append(found)
            return found
        return None


class Memory:
    def __init__(self, cfg: HealthConfig):
        self.cfg = cfg
        self.current: collections.deque[tuple[int, list[float]]] = collections.deque(maxlen=max(cfg.window, 30))
        self.findings: list[Finding] = []
        self._flagged: set[tuple[str, int]] = set()

    def update(self, step: int, current: list[float], peak: list[float]) -> Finding | None:
        new = None
        median = statistics.median(peak)
        for r, p in enumerate(peak):
            if len(peak) > 1 and p > median * (1 + self.cfg.imbalance) and p - median > 64 * MIB \
                    and ("imbalance", r) not in self._flagged:
                self._flagged.add(("imbalance", r))
                new = new or self._add(Finding(
                    "memory_imbalance", "WARN", step, [r],
                    f"rank {r} peaks at {p / MIB:,.0f} MiB, {p / median - 1:.0%} above the ranks' median "
                    f"({median / MIB:,.0f} MiB)", {"peak_bytes": peak}))
        self.current.append((step, current))
        if len(self.current) < self.current.maxlen:
            return new
        third = len(self.current) // 3
        first, last = list(self.current)[:third], list(self.current)[-third:]
        steps = statistics.median(s for s, _ in last) - statistics.median(s for s, _ in first)
        for r in range(len(current)):
            growth = statistics.median(c[r] for _, c in last) - statistics.median(c[r] for _, c in first)
            per_step = growth / max(steps, 1)
            if per_step > MIB and growth > 64 * MIB and ("growth", r) not in self._flagged:
                self._flagged.add(("growth", r))
                new = new or self._add(Finding(
                    "memory_growth", "WARN", step, [r],
                    f"rank {r}'s memory grows {per_step / MIB:.1f} MiB per step ({growth / MIB:,.0f} MiB over the "
                    f"last {len(self.current)} steps): a leak?", {"bytes_per_step": round(per_step)}))
        return new

    def _add(self, found: Finding) -> Finding:
        self.findings.append(found)
        return found


def replica_checksums(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[str], torch.Tensor]:
    """An exact checksum per tensor: its bits as integers, summed in int64 (equal bits, equal sum;
    one flipped bit changes it)."""
    names, sums = [], []
    for name, p in named:
        t = p.detach()
        bits = t.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()])
        names.append(name)
        sums.append(torch.sum(bits, dtype=torch.int64))  # accumulated in int64, no int64 copy
    return names, torch.stack(sums).cpu() if sums else torch.zeros(0, dtype=torch.int64)  # one read from a GPU


def compare_replicas(step: int, names: list[str], sums: list[torch.Tensor]) -> Finding | None:
    """`sums[r]`: rank r's checksums, in `names` order. The ranks outside each tensor's majority."""
    odd: dict[int, list[str]] = collections.defaultdict(list)
    for i, name in enumerate(names):
        values = collections.Counter(int(s[i]) for s in sums)
        if len(values) > 1:
            top, n = values.most_common(1)[0]
            tie = list(values.values()).count(n) > 1
            for r, s in enumerate(sums):
                if tie or int(s[i]) != top:
                    odd[r].append(name)
    if not odd:
        return None
    ranks = sorted(odd)
    tensors = sorted({n for ns in odd.values() for n in ns}, key=names.index)
    shown = ", ".join(tensors[:5]) + (f" and {len(tensors) - 5} more" if len(tensors) > 5 else "")
    majority = "no majority: every side named" if len(ranks) == len(sums) else "the other ranks agree"
    verb = "holds" if len(ranks) == 1 else "hold"
    return Finding("replicas", "FAIL", step, ranks,
                   f"replicas differ at step {step}: {ranks_text(ranks)} {verb} other values of {shown} ({majority})",
                   {"tensors": {r: ns for r, ns in odd.items()}})


class HealthMonitor:
    """Rank 0's detectors over the gathered per-rank rows of each step."""

    def __init__(self, cfg: HealthConfig):
        self.cfg = cfg
        self.stragglers, self.numerics, self.memory = Stragglers(cfg), Numerics(cfg), Memory(cfg)
        self.replicas: list[Finding] = []
        self.replica_checks = 0
        self.per_rank: list[dict[str, Any]] = []  # rank -> its recent compute and waiting, peak, current memory

    def update(self, step: int, ranks: list[dict[str, float]], grad_norm: float, bad_param: str | None,
               tokens: float) -> list[Finding]:
        if not self.per_rank:  # the first step (warm-up) is kept apart: used only if it stays the only one
            self.per_rank = [{"first": (r["compute_s"], r["blocked_s"]), "peak": 0.0,
                              "compute": collections.deque(maxlen=RANK_WINDOW),
                              "blocked": collections.deque(maxlen=RANK_WINDOW)} for r in ranks]
        else:
            for mine, row in zip(self.per_rank, ranks):
                mine["compute"].append(row["compute_s"])
                mine["blocked"].append(row["blocked_s"])
        for mine, row in zip(self.per_rank, ranks):
            mine["peak"], mine["current"] = max(mine["peak"], row["mem_peak"]), row["mem_current"]
        found = [self.numerics.update(step, [r["loss"] for r in ranks], grad_norm, bad_param),
                 self.stragglers.update(step, ranks, tokens),
                 self.memory.update(step, [r["mem_current"] for r in ranks], [r["mem_peak"] for r in ranks])]
        return [f for f in found if f is not None]

    def replicas_checked(self, step: int, names: list[str], sums: list[torch.Tensor]) -> Finding | None:
        self.replica_checks += 1
        found = compare_replicas(step, names, sums)
        if found and not self.replicas:  # the first step it was seen; later checks add nothing new
            self.replicas.append(found)
            return found
        return None

    def rank_rows(self) -> list[dict[str, Any]]:
        """Each rank over the run: median compute and waiting per step over its last RANK_WINDOW
        steps (the first step, warm-up, left out when there are others), its peak and its last
        current memory. Bounded: a long run keeps no more than the window."""
        rows = []
        for r, mine in enumerate(self.per_rank):
            compute, blocked = (mine["compute"], mine["blocked"]) if mine["compute"] else \
                ([mine["first"][0]], [mine["first"][1]])
            rows.append({"rank": r, "compute_ms": statistics.median(compute) * 1e3,
                         "waiting_ms": statistics.median(blocked) * 1e3,
                         "peak_mem_bytes": mine["peak"], "current_mem_bytes": mine["current"]})
        return rows

    def findings(self) -> list[Finding]:
        out = [*self.numerics.findings, *self.replicas, *self.stragglers.findings, *self.memory.findings]
        return sorted(out, key=lambda f: f.step)
