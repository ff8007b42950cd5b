"""The training health monitor: stragglers, numerics, replica consistency and memory, decided on
rank 0 from what every rank measured in the step, gathered in one collective over the control
group (the same one that already gave the step's slowest time and the mean loss). A launched
script's monitor (health/script.py) feeds the same detectors in the launcher, from what each
rank's step clock and probe published (no loss there: its numerics come from the probe).

Per rank and step (a row of `FIELDS`): the step time, the time the training thread computed (the step
minus the time it waited in collectives: `comm_blocked_s`), the wait itself, its local loss, its
current and peak memory. Rank 0 feeds the gathered rows to the detectors; each returns at most one
new `Finding` per step (a live line on the terminal) and keeps its findings for the report:

  stragglers   per step each rank's compute time over the median of its peers' (health/stragglers.py)
  numerics     the first non-finite local loss (the rank(s) named) or, with every loss finite, the
               first non-finite gradient norm (the first parameter with a non-finite gradient
               named): a FAIL; a gradient norm above `spike` × its running median: a WARN
  replicas     every `every` steps, an exact checksum of each parameter on each rank, compared
               where ranks must agree (every rank for the data-parallel family and ZeRO-1/2; a
               fully sharded strategy has no replicas to compare): a FAIL naming the step, the
               rank(s) outside the majority and the tensors
  memory       a rank whose peak exceeds the ranks' median by `imbalance` (and 64 MiB): a WARN; a
               rank whose current memory grows steadily (its median over the last third of the
               window above that over the first third by over 1 MiB per step and 64 MiB in all,
               with a quarter of that growth or more in each half: one jump is not a leak):
               a WARN with the growth per step
"""

from __future__ import annotations

import collections
import math
import statistics
import time
from typing import Any, Callable, Iterable

import torch

from distval.health import ranks_text
from distval.health.config import HealthConfig
from distval.health.findings import WARMUP_STEPS, Finding, fast_median
from distval.health.stragglers import Stragglers

FIELDS = ("step_s", "compute_s", "blocked_s", "loss", "mem_current", "mem_peak")  # what each rank contributes
MIB = 1 << 20
RANK_WINDOW = 1000  # steps of each rank's compute and waiting kept for the per-rank table


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


def nonfinite_in_script(step: int, ranks: list[int], what: str, value: float, param: str) -> Finding:
    """A launched script's first non-finite `what` (gradient | parameter), seen by the probe
    (health/probe.py) on `ranks` at `step`: the same finding as `distval train`'s."""
    text = (f"first non-finite value at step {step}: a {what} of {ranks_text(ranks)} is {value}; first "
            f"{'parameter with a non-finite gradient' if what == 'gradient' else 'non-finite parameter'}: {param}")
    return Finding("nonfinite", "FAIL", step, ranks, text, {"what": what, "value": value, "parameter": param})


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
    """Imbalance across ranks and growth of a rank's current memory, each on evidence that lasts.

    Both are judged every 10 steps from the end of the warm-up. Imbalance: a rank whose current
    memory, as its median over the last window, stands `imbalance` (25%) and 64 MiB above the ranks'
    median of theirs (a peak is one moment: one allocation burst sets a host's RSS peak for the rest
    of the run; the peaks are in the finding). Growth: over thirds of a window: the
    last third's median over the first's, grown in both halves (one jump, an evaluation's or a
    checkpoint's buffers kept by the allocator, is no leak). It is a leak when it holds over two
    windows (> 1 MiB a step and 64 MiB in all), or sooner when one window's growth is a large share
    (`FAST_SHARE`) of what the rank held at its start: an allocator that settles (host RSS creeping
    a few per cent over the first hundred steps) is neither.
    """

    FAST_SHARE = 0.25

    def __init__(self, cfg: HealthConfig):
        self.cfg = cfg
        self.window = max(cfg.window, 30)
        self.current: collections.deque[tuple[int, list[float]]] = collections.deque(maxlen=2 * self.window)
        self.findings: list[Finding] = []
        self._flagged: set[tuple[str, int]] = set()
        self._seen = 0

    def update(self, step: int, current: list[float], peak: list[float]) -> list[Finding]:
        """The findings new at this step (an imbalance and a leak may come together)."""
        new: list[Finding] = []
        self._seen += 1
        if self._seen <= WARMUP_STEPS:  # allocation and the allocator's first growth are not judged
            return new
        self.current.append((step, current))
        if len(self.current) < self.window or self._seen % 10:
            return new  # an imbalance or a leak takes tens of steps to show
        rows = list(self.current)
        levels = [fast_median(c[r] for _, c in rows[-self.window:]) for r in range(len(current))]
        median = fast_median(levels)
        for r, level in enumerate(levels):
            if len(levels) > 1 and level > median * (1 + self.cfg.imbalance) and level - median > 64 * MIB \
                    and ("imbalance", r) not in self._flagged:
                self._flagged.add(("imbalance", r))
                new.append(self._add(Finding(
                    "memory_imbalance", "WARN", step, [r],
                    f"rank {r} holds {level / MIB:,.0f} MiB, {level / median - 1:.0%} above the ranks' median "
                    f"({median / MIB:,.0f} MiB) over the last {self.window} steps (peak {peak[r] / MIB:,.0f} MiB)",
                    {"current_bytes": levels, "peak_bytes": peak})))
        for r in range(len(current)):
            if ("growth", r) in self._flagged:
                continue
            per_step, growth, early = _growth(rows[-self.window:], r)
            fast = growth >= self.FAST_SHARE * early
            if len(rows) == self.current.maxlen and not fast:
                per_step, growth, early = _growth(rows, r)  # held over both windows
            elif not fast:
                continue
            if per_step > MIB and growth > 64 * MIB:
                self._flagged.add(("growth", r))
                new.append(self._add(Finding(
                    "memory_growth", "WARN", step, [r],
                    f"rank {r}'s memory grows {per_step / MIB:.1f} MiB per step ({growth / MIB:,.0f} MiB over the "
                    f"last {len(rows) if not fast else self.window} steps): a leak?",
                    {"bytes_per_step": round(per_step)})))
        return new

    def _add(self, found: Finding) -> Finding:
        self.findings.append(found)
        return found


def _growth(rows: list[tuple[int, list[float]]], r: int) -> tuple[float, float, float]:
    """Rank r's (bytes per step, growth, early level) over `rows`: the last third's median over the
    first third's; no growth unless it grew by a quarter of it in each half."""
    third = len(rows) // 3
    first, middle, last = rows[:third], rows[third:-third], rows[-third:]
    early, mid, late = (fast_median(c[r] for _, c in part) for part in (first, middle, last))
    growth = late - early
    if min(mid - early, late - mid) < growth / 4:
        return 0.0, 0.0, early
    steps = fast_median(st for st, _ in last) - fast_median(st for st, _ in first)
    return growth / max(steps, 1), growth, early


def replica_checksums(named: Iterable[tuple[str, torch.Tensor]], host: bool = True) -> tuple[list[str], torch.Tensor]:
    """An exact checksum per tensor: its bits as integers, summed in int64 (equal bits, equal sum;
    one flipped bit changes it). `host=False`: left on the device (no sync; the caller reads it
    back later)."""
    names, sums = [], []
    for name, p in named:
        t = p.detach()
        bits = t.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()])
        names.append(name)
        sums.append(torch.sum(bits, dtype=torch.int64))  # accumulated in int64, no int64 copy
    if not sums:
        return names, torch.zeros(0, dtype=torch.int64)
    stacked = torch.stack(sums)
    return names, stacked.cpu() if host else stacked  # one read from a GPU


def compare_replicas(step: int, names: list[str], sums: list[Any], ranks: list[int] | None = None) -> Finding | None:
    """`sums[k]`: the checksums of rank `ranks[k]` (default: rank k), in `names` order. The ranks
    outside each tensor's majority."""
    ranks = list(range(len(sums))) if ranks is None else ranks
    odd: dict[int, list[str]] = collections.defaultdict(list)
    for i, name in enumerate(names):
        values = collections.Counter(int(s[i]) for s in sums)
        if len(values) > 1:
            top, n = values.most_common(1)[0]
            tie = list(values.values()).count(n) > 1
            for r, s in zip(ranks, sums):
                if tie or int(s[i]) != top:
                    odd[r].append(name)
    if not odd:
        return None
    culprits = sorted(odd)
    tensors = sorted({n for ns in odd.values() for n in ns}, key=names.index)
    shown = ", ".join(tensors[:5]) + (f" and {len(tensors) - 5} more" if len(tensors) > 5 else "")
    majority = "no majority: every side named" if len(culprits) == len(sums) else "the other ranks agree"
    verb = "holds" if len(culprits) == 1 else "hold"
    return Finding("replicas", "FAIL", step, culprits,
                   f"replicas differ at step {step}: {ranks_text(culprits)} {verb} other values of {shown} "
                   f"({majority})", {"tensors": {r: ns for r, ns in odd.items()}, "compared": ranks})


class Detectors:
    """Rank 0's detectors over the gathered per-rank rows of each step."""

    def __init__(self, cfg: HealthConfig, by_host: Callable[[int, float], bool] | None = None):
        self.cfg = cfg
        self.stragglers, self.numerics, self.memory = Stragglers(cfg, by_host), Numerics(cfg), Memory(cfg)
        self.replicas: list[Finding] = []
        self.replica_checks = 0
        self.per_rank: list[dict[str, Any]] = []  # rank -> its recent compute and waiting, peak, current memory
        self.last: list[dict[str, float]] = []  # the last step's per-rank rows (live metrics: health/metrics.py)
        self._live: tuple[float, dict[str, Any]] | None = None

    def update(self, step: int, ranks: list[dict[str, float]], grad_norm: float | None, bad_param: str | None,
               tokens: float | None) -> list[Finding]:
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
        self.last = ranks
        found = [self.numerics.update(step, [r["loss"] for r in ranks], grad_norm, bad_param)
                 if grad_norm is not None else None,  # a launched script: its probe's findings come apart
                 self.stragglers.update(step, ranks, tokens),
                 *self.memory.update(step, [r["mem_current"] for r in ranks], [r["mem_peak"] for r in ranks])]
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

    def metrics(self) -> dict[str, Any]:
        """The live figures (health/metrics.py): the last step's per-rank rows with each rank's
        straggler score, and the findings by (kind, status)."""
        from distval.health.metrics import finding_counts, rank_row

        now = time.monotonic()
        if self._live is None or now - self._live[0] >= 1.0:  # at most once a second: the scores are medians
            scores = self.stragglers.scores()
            self._live = (now, {"ranks": {r: rank_row(row, scores.get(r)) for r, row in enumerate(self.last)},
                                "findings": finding_counts(self.findings())})
        return self._live[1]

    def findings(self) -> list[Finding]:
        out = [*self.numerics.findings, *self.replicas, *self.stragglers.findings, *self.memory.findings]
        return sorted(out, key=lambda f: f.step)
