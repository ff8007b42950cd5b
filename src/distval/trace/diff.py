"""`distval trace diff A B`: two runs' analyses side by side, per category of the step and per
kernel or op, with a permutation test over steps: is B's step (or its exposed communication,
its compute...) different from A's, or is the difference the steps' own spread?

A step's value is, per category, the mean over the run's ranks of that step's time in it; the step
time is the slowest rank's. The test compares the two sets of steps' means: exact over every
split of the pooled steps when there are at most 20,000, else 20,000 seeded random splits.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from distval.results import Check, Report, Status, Table
from distval.trace.analyze import CATEGORIES
from distval.trace.report import analyze

ALPHA = 0.05  # a difference with p below this is significant
REGRESSION = 0.05  # B's step this much slower than A's, significantly: a WARN
MAX_SPLITS = 20_000


def permutation_p(a: list[float], b: list[float], seed: int = 0) -> float | None:
    """Two-sided p-value of the difference of means of a and b under random relabelling."""
    if len(a) < 2 or len(b) < 2:
        return None
    pooled, n = a + b, len(a)
    observed = abs(statistics.fmean(a) - statistics.fmean(b))
    total = sum(pooled)

    def extreme(idx: tuple[int, ...]) -> bool:
        s = sum(pooled[i] for i in idx)
        return abs(s / n - (total - s) / len(b)) >= observed - 1e-12

    splits = _count(len(pooled), n)
    if splits <= MAX_SPLITS:
        hits = sum(extreme(idx) for idx in itertools.combinations(range(len(pooled)), n))
        return hits / splits
    rng = random.Random(seed)
    hits = sum(extreme(tuple(rng.sample(range(len(pooled)), n))) for _ in range(MAX_SPLITS))
    return (hits + 1) / (MAX_SPLITS + 1)


def _count(total: int, pick: int) -> int:
    from math import comb

    return comb(total, pick)


def per_step(report: Report) -> dict[str, list[float]]:
    """category (and 'step') -> one value per step (ms)."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in report.table("trace_steps").rows:
        by_step[row["step"]].append(row)
    out: dict[str, list[float]] = {"step": [max(r["step_ms"] for r in rows) for rows in by_step.values()]}
    for c in CATEGORIES:
        out[c] = [statistics.fmean(r[c] for r in rows) for rows in by_step.values()]
    return out


def diff(a: list[Path], b: list[Path]) -> Report:
    ra, rb = analyze(a), analyze(b)
    sa, sb = per_step(ra), per_step(rb)
    report = Report("trace diff", meta={"a": [str(p) for p in a], "b": [str(p) for p in b],
                                        "steps": {"a": len(sa["step"]), "b": len(sb["step"])}})
    report.checks += [_renamed(c, "A") for c in ra.checks if c.status is not Status.OK]
    report.checks += [_renamed(c, "B") for c in rb.checks if c.status is not Status.OK]
    table = Table("diff_categories", ["category", "a_ms", "b_ms", "delta_ms", "ratio", "p_value", "significant"],
                  title="A against B, per step (median ms; p: permutation test over steps)",
                  units={"a_ms": "ms", "b_ms": "ms", "delta_ms": "ms"})
    rows = {}
    for c in ("step", *CATEGORIES):
        ma, mb = statistics.median(sa[c]), statistics.median(sb[c])
        p = permutation_p(sa[c], sb[c])
        rows[c] = {"category": c, "a_ms": round(ma, 3), "b_ms": round(mb, 3), "delta_ms": round(mb - ma, 3),
                   "ratio": round(mb / ma, 3) if ma else None, "p_value": None if p is None else round(p, 4),
                   "significant": p is not None and p < ALPHA}
        table.add(**rows[c])
    report.tables.append(table)
    report.tables.append(_ops_table(ra, rb))
    report.add(_verdict(rows, len(sa["step"]), len(sb["step"])))
    return report


def _renamed(check: Check, side: str) -> Check:
    check.name = f"{side}: {check.name}"
    return check


def _verdict(rows: dict[str, dict[str, Any]], na: int, nb: int) -> Check:
    step = rows["step"]
    moved = sorted((r for c, r in rows.items() if c != "step" and r["significant"]), key=lambda r: -abs(r["delta_ms"]))
    where = "; ".join(f"{r['category'].replace('_', ' ')} {r['delta_ms']:+.2f} ms (p={r['p_value']:.3f})"
                      for r in moved[:3]) or "no category changed significantly"
    change = (step["b_ms"] / step["a_ms"] - 1) if step["a_ms"] else 0.0
    p = step["p_value"]
    if p is None:
        text = f"B's step {change:+.1%} against A's ({na} and {nb} steps: too few to test; record 2 or more each)"
        return Check("trace diff step", Status.OK, text, details=step)
    slower = step["significant"] and change > REGRESSION
    text = (f"B's step {'is' if step['significant'] else 'is not significantly'} {abs(change):.1%} "
            f"{'longer' if change > 0 else 'shorter'} than A's (p={p:.3f}, {na} and {nb} steps); {where}")
    return Check("trace diff step", Status.WARN if slower else Status.OK, text, details=step,
                 hint="the categories that moved say where: compute, exposed communication, waiting" if slower else "")


def _ops_table(ra: Report, rb: Report, top: int = 20) -> Table:
    a = {(r["kind"], r["name"]): r for r in ra.table("trace_ops").rows}
    b = {(r["kind"], r["name"]): r for r in rb.table("trace_ops").rows}
    rows = []
    for key in set(a) | set(b):
        ma, mb = (a.get(key) or {}).get("ms_per_step", 0.0), (b.get(key) or {}).get("ms_per_step", 0.0)
        rows.append({"kind": key[0], "name": key[1], "a_ms_per_step": ma, "b_ms_per_step": mb,
                     "delta_ms": round(mb - ma, 4)})
    rows.sort(key=lambda r: -abs(r["delta_ms"]))
    table = Table("diff_ops", ["kind", "name", "a_ms_per_step", "b_ms_per_step", "delta_ms"],
                  title="Kernels or ops whose time per step changed most (among each run's top 200)",
                  units={"a_ms_per_step": "ms", "b_ms_per_step": "ms", "delta_ms": "ms"})
    for r in rows[:top]:
        table.add(**r)
    return table
