"""A health finding, as every detector reports one (health/monitor.py's, the straggler rule's,
health/lost.py's, a launched script's), and what the detectors share."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

WARMUP_STEPS = 10  # steps the straggler and memory rules leave alone: allocation, warm caches, first collectives


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


def fast_median(xs: Iterable[float]) -> float:
    """statistics.median without its checks (a hot path: every step, every rank)."""
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def onset(series: Sequence[float], rule: float, cap: float, healthy: float) -> int:
    """Where a series' lasting rise to the level `cap` it has now began: one past the last point at
    which its excess over a reference, summed and never below zero (Page's CUSUM), was nil. A point
    a little over the reference adds little, one far over it no more than the level now, and points
    under it drain that: a noisy stretch or a lone slow step before the rise does not move its start
    unless it runs into it. A rise in two levels (a host busier at its start, then less) starts at
    the first, where a split into two sides that sit closest to their own medians would cut at the
    larger step in between.

    The reference is the rule's threshold `rule`, or halfway from the `healthy` level to `cap`
    where that is lower (a rise just over the threshold rises clear of it); and at least a quarter
    of the way from the series' own low level (its tenth percentile) to `cap`, at most halfway from
    `healthy`: where a host kept a rank a little behind its peers, over the threshold, before it
    slowed for real, that stretch drains instead of counting as the rise."""
    mid = (healthy + cap) / 2
    low = sorted(series)[len(series) // 10] if series else healthy
    reference = max(min(rule, mid), min(low + (cap - low) / 4, mid))
    excess, start = 0.0, 0
    for i, x in enumerate(series):
        excess = max(0.0, excess + min(x, cap) - reference)
        if excess == 0.0:
            start = i + 1
    return min(start, len(series) - 1)
