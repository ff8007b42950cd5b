"""Sets of time as sorted, disjoint [start, end) intervals (microseconds): union, intersection,
difference and length, each a linear merge. The breakdown of a step is arithmetic on these."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

Spans = list[tuple[float, float]]


def union(spans: Iterable[tuple[float, float]]) -> Spans:
    out: Spans = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def length(spans: Spans) -> float:
    return sum(e - s for s, e in spans)


def intersect(a: Spans, b: Spans) -> Spans:
    out: Spans = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Spans, b: Spans) -> Spans:
    out: Spans = []
    j = 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def clip(a: Spans, start: float, end: float) -> Spans:
    """The part of a (sorted, disjoint) inside [start, end): a binary search, then the spans in it."""
    i = bisect.bisect_right(a, (start, float("inf"))) - 1
    i = max(i, 0)
    out: Spans = []
    while i < len(a) and a[i][0] < end:
        s, e = max(a[i][0], start), min(a[i][1], end)
        if s < e:
            out.append((s, e))
        i += 1
    return out
