"""Expectations against a Report: each threshold becomes one Check named `expect <section> <what>`.

OK when the measured figure meets the threshold (`>=` for a `min_*`, `<=` for a `max_*`: a figure
exactly at the threshold passes), FAIL when it does not, SKIP (with the reason) when the report has
no figure for it. Which figure each threshold reads (docs/expectations.md):

  [[bench]]  table `bench`: the best busbw_gbps of the op's rows at exactly that size (in- and
             out-of-place, of the dtype when given), when the job's world size and nodes match
  [pairs]    table `pairs`: the slowest direction of the level's rows; table `pair_nodes`: the
             slowest node's allreduce_busbw_gbps
  [scale]    table `scaling`: the worst row at each world size; the slowest step_time_s
  [train]    table `steps`: medians over the steps after the first

A summary starts with PASS, FAIL or SKIP and says the measured value, the comparison, the
threshold with its unit and where the threshold comes from (the preset or the file).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from distval.expect.spec import BenchExpectation, Expectations, PairsExpectation, ScaleExpectation, TrainExpectation
from distval.results import Check, Report, Status, Table
from distval.units import format_size


def judge(exp: Expectations, report: Report) -> list[Check]:
    checks = [_bench(b, exp, report) for b in exp.bench]
    if exp.pairs is not None:
        checks += _pairs(exp.pairs, exp, report)
    if exp.scale is not None:
        checks += _scale(exp.scale, exp, report)
    if exp.train is not None:
        checks += _train(exp.train, exp, report)
    return checks


# -- the verdict every section shares ---------------------------------------------------------------


def _verdict(name: str, what: str, measured: float, threshold: float, unit: str, exp: Expectations, *,
             at_least: bool, where: dict[str, Any], hint: str, details: dict[str, Any] | None = None,
             more: str = "") -> Check:
    """OK or FAIL of one figure against one threshold; `more` follows the comparison on a FAIL
    (", and 3 more directions below it")."""
    ok = measured >= threshold if at_least else measured <= threshold
    sign = (">=" if ok else "<") if at_least else ("<=" if ok else ">")
    m, t = _numbers(measured, threshold)
    suffix = f" {unit}" if unit else ""
    summary = f"{'PASS' if ok else 'FAIL'} {what}: {m}{suffix} {sign} {t}{suffix}{'' if ok else more} ({exp.label})"
    info = {"measured": measured, "threshold": threshold, "unit": unit, "comparison": ">=" if at_least else "<=",
            "source": exp.source, **(details or {})}
    return Check(name, Status.OK if ok else Status.FAIL, summary, details=info, hint="" if ok else hint, where=where)


def _skip(name: str, what: str, reason: str, exp: Expectations, where: dict[str, Any]) -> Check:
    return Check(name, Status.SKIP, f"SKIP {what}: {reason} ({exp.label})",
                 details={"reason": reason, "source": exp.source}, where=where)


def _numbers(measured: float, threshold: float) -> tuple[str, str]:
    """The two numbers as a summary prints them: the threshold as written, the measured value to
    4 significant digits, more where fewer would print a failing value equal to the threshold."""
    t = _as_written(threshold)
    for digits in range(4, 13):
        m = f"{measured:.0f}" if abs(measured) >= 10**digits else f"{measured:.{digits}g}"
        if m != t or measured == threshold:
            break
    return m, t


def _as_written(threshold: float) -> str:
    return str(int(threshold)) if float(threshold).is_integer() else f"{threshold:.12g}"


def _number(value: Any) -> float | None:
    """A finite number from a table cell, else None (null, 'nan' from a JSON round trip, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _size(n: int) -> str:
    for unit, mult in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    return f"{n} B"


def _no_table(name: str, report: Report, run: str) -> str:
    return f"this report ({report.command}) has no table `{name}`; {run} measures it"


# -- [[bench]] --------------------------------------------------------------------------------------


def _bench(b: BenchExpectation, exp: Expectations, report: Report) -> Check:
    scope = [x for x in (b.dtype, b.world_size and f"{b.world_size} ranks",
                         b.nodes and f"{b.nodes} node{'s' * (b.nodes > 1)}") if x]
    name = f"expect bench {b.op} {format_size(b.size_bytes)}" + "".join(f" {x}" for x in scope)
    what = f"{b.op} busbw at {_size(b.size_bytes)}" + (f" ({', '.join(scope)})" if scope else "")
    where: dict[str, Any] = {"op": b.op, "bytes": b.size_bytes,
                             **{k: v for k, v in (("dtype", b.dtype), ("world_size", b.world_size),
                                                  ("nodes", b.nodes)) if v is not None}}
    rows, reason = _bench_rows(b, report)
    if not rows:
        return _skip(name, what, reason, exp, where)
    best = max(rows, key=lambda r: r["busbw_gbps"])
    where.update(dtype=best.get("dtype"), inplace=best.get("inplace"))
    if report.meta.get("world_size") is not None:
        where["world_size"] = report.meta["world_size"]
    share = best["busbw_gbps"] / b.min_busbw_gbps
    hint = (f"{b.op} at {_size(b.size_bytes)} reaches {share:.0%} of the {_as_written(b.min_busbw_gbps)} GB/s "
            "expected: run `distval comm pairs` to find a slow node or link; check that every GPU link and NIC is up "
            "(nvidia-smi nvlink -s or amd-smi xgmi, ibstat) and which transport NCCL/RCCL chose (NCCL_DEBUG=INFO)")
    return _verdict(name, what, best["busbw_gbps"], b.min_busbw_gbps, "GB/s", exp, at_least=True, where=where,
                    hint=hint, details={"rows": len(rows), "timing": report.meta.get("timing")})


def _bench_rows(b: BenchExpectation, report: Report) -> tuple[list[dict[str, Any]], str]:
    """The bench rows this threshold reads (busbw a number), or none and why."""
    table = report.table("bench")
    if table is None:
        return [], _no_table("bench", report, "`distval comm bench` (or `distval run`)")
    world, hosts = report.meta.get("world_size"), report.meta.get("hosts")
    if b.world_size is not None and world != b.world_size:
        return [], f"the threshold is for {b.world_size} ranks; this job ran {_known_count(world)}"
    num_hosts = len(hosts) if isinstance(hosts, dict) else None
    if b.nodes is not None and num_hosts != b.nodes:
        return [], f"the threshold is for {b.nodes} node(s); this job ran on {_known_count(num_hosts)}"
    rows = [r for r in table.rows if r.get("op") == b.op]
    if not rows:
        return [], f"no {b.op} rows; ops measured: {_listed(sorted({str(r.get('op')) for r in table.rows}))}"
    if b.dtype is not None:
        kept = [r for r in rows if r.get("dtype") == b.dtype]
        if not kept:
            return [], f"no {b.dtype} rows; dtypes measured: {_listed(sorted({str(r.get('dtype')) for r in rows}))}"
        rows = kept
    at_size = [r for r in rows if r.get("bytes") == b.size_bytes]
    if not at_size:
        sizes = sorted({r["bytes"] for r in rows if isinstance(r.get("bytes"), int)})
        fix = "raise -e to reach it" if not sizes or b.size_bytes > sizes[-1] else "choose -b, -f so the sweep has it"
        return [], f"not measured at this size; sizes measured: {_sizes(sizes)} ({fix})"
    numeric = [{**r, "busbw_gbps": v} for r in at_size if (v := _number(r.get("busbw_gbps"))) is not None]
    return numeric, "" if numeric else "no busbw figure at this size"


def _known_count(n: int | None) -> str:
    return str(n) if n is not None else "a number the report does not say"


def _sizes(sizes: list[int]) -> str:
    if not sizes:
        return "none"
    if len(sizes) <= 6:
        return ", ".join(_size(s) for s in sizes)
    return f"{_size(sizes[0])} to {_size(sizes[-1])} ({len(sizes)} sizes)"


def _listed(items: list[str]) -> str:
    return ", ".join(items) if items else "none"


# -- [pairs] ----------------------------------------------------------------------------------------


def _pairs(p: PairsExpectation, exp: Expectations, report: Report) -> list[Check]:
    out = []
    if p.min_node_gbps is not None:
        out.append(_pair_level("node", p.min_node_gbps, exp, report))
    if p.min_rank_gbps is not None:
        out.append(_pair_level("rank", p.min_rank_gbps, exp, report))
    if p.min_allreduce_busbw_gbps is not None:
        out.append(_node_allreduce(p.min_allreduce_busbw_gbps, exp, report))
    return out


def _directions(table: Table, level: str) -> list[dict[str, Any]]:
    """Both directions of every row of `level`, slowest first: label, ends, GB/s, where."""
    out = []
    for row in table.rows:
        if row.get("level") != level:
            continue
        for a, b, key in (("a", "b", "a_to_b_gbps"), ("b", "a", "b_to_a_gbps")):
            gbps = _number(row.get(key))
            if gbps is None:
                continue
            ends = (_end(row, level, a), _end(row, level, b))
            where = {k: row[k] for k in ("level", "node_a", "node_b", "host_a", "host_b", "rank_a", "rank_b")
                     if row.get(k) is not None}
            where.update(direction=key.removesuffix("_gbps"), link=f"{ends[0]} -> {ends[1]}")
            out.append({"link": where["link"], "ends": ends, "gbps": gbps, "where": where, "bytes": row.get("bytes")})
    return sorted(out, key=lambda d: d["gbps"])


def _end(row: dict[str, Any], level: str, side: str) -> str:
    host = row.get(f"host_{side}")
    if level == "node":
        return f"node {row.get(f'node_{side}')}" + (f" ({host})" if host else "")
    return f"rank {row.get(f'rank_{side}')}" + (f" (node {row.get(f'node_{side}')}, {host})" if host else "")


def _pair_level(level: str, threshold: float, exp: Expectations, report: Report) -> Check:
    name, what = f"expect pairs {level}", f"slowest {level}-to-{level} direction"
    table = report.table("pairs")
    if table is None:
        return _skip(name, what, _no_table("pairs", report, "`distval comm pairs`"), exp, {"level": level})
    directions = _directions(table, level)
    if not directions:
        why = "one node" if level == "node" else "one rank per node"
        return _skip(name, what, f"no {level}-level pairs were measured ({why}?)", exp, {"level": level})
    worst = directions[0]
    below = [d for d in directions if d["gbps"] < threshold]
    more = f", and {len(below) - 1} more direction{'s' * (len(below) > 2)} below it" if len(below) > 1 else ""
    details = {"num_directions": len(directions), "bytes": worst["bytes"],
               "below": [{"link": d["link"], "gbps": d["gbps"]} for d in below]}
    return _verdict(name, worst["link"] if below else f"{what}, {worst['link']}", worst["gbps"], threshold, "GB/s",
                    exp, at_least=True, where=worst["where"], hint=_pair_hint(level, below, directions),
                    details=details, more=more)


def _pair_hint(level: str, below: list[dict[str, Any]], directions: list[dict[str, Any]]) -> str:
    if not below:
        return ""
    common = set.intersection(*(set(d["ends"]) for d in below))
    everyone = {e for d in directions for e in d["ends"]}
    if level == "rank":
        fix = ("check the GPU links of that node (nvidia-smi topo -m, nvidia-smi nvlink -s; amd-smi topology) and "
               "that peer-to-peer is on (ACS/IOMMU settings, NCCL_P2P_DISABLE unset)")
    else:
        fix = ("check that node's NIC: link rate and error counters (ibstat, ethtool -S), and the interface the "
               "backend chose (NCCL_DEBUG=INFO; NCCL_IB_HCA, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)")
    if len(everyone) == 2:
        return (f"with two {level}s a slow pair cannot say which end is slow: measure each against a third, "
                f"known good {level}; {fix}")
    if len(common) == 1 and len(below) > 1:
        return f"{next(iter(common))} is in every slow direction: {fix}"
    return f"{len(below)} direction(s) are slow (details.below; the slowest first): {fix}"


def _node_allreduce(threshold: float, exp: Expectations, report: Report) -> Check:
    name, what = "expect pairs allreduce", "slowest node's all_reduce busbw among its own ranks"
    table = report.table("pair_nodes")
    if table is None:
        return _skip(name, what, _no_table("pair_nodes", report, "`distval comm pairs`"), exp, {})
    rows = sorted(((v, r) for r in table.rows if (v := _number(r.get("allreduce_busbw_gbps"))) is not None),
                  key=lambda vr: vr[0])
    if not rows:
        return _skip(name, what, "no node has an all_reduce figure (one rank per node)", exp, {})
    gbps, row = rows[0]
    node = f"node {row.get('node')}" + (f" ({row['host']})" if row.get("host") else "")
    below = [(v, r) for v, r in rows if v < threshold]
    more = f", and {len(below) - 1} more node{'s' * (len(below) > 2)} below it" if len(below) > 1 else ""
    hint = (f"{node}'s own GPUs reduce slowly among themselves: check its GPU links (nvidia-smi nvlink -s, "
            "amd-smi xgmi) and peer-to-peer (ACS/IOMMU); compare its compute_share in table pair_nodes")
    return _verdict(name, f"all_reduce busbw within {node}" if below else f"{what}, {node}", gbps, threshold, "GB/s",
                    exp, at_least=True, where={"node": row.get("node"), "host": row.get("host")}, hint=hint,
                    more=more, details={"below": [{"node": r.get("node"), "host": r.get("host"), "gbps": v}
                                                  for v, r in below], "num_nodes": len(rows)})


# -- [scale] ----------------------------------------------------------------------------------------


def _scale(s: ScaleExpectation, exp: Expectations, report: Report) -> list[Check]:
    table = report.table("scaling")
    out = [_efficiency(size, minimum, table, exp, report) for size, minimum in s.min_efficiency]
    if s.max_step_time_s is not None:
        out.append(_scale_step_time(s.max_step_time_s, table, exp, report))
    return out


def _efficiency(size: int, minimum: float, table: Table | None, exp: Expectations, report: Report) -> Check:
    name, what, where = f"expect scale efficiency {size}", f"scaling efficiency at {size} ranks", {"world_size": size}
    if table is None:
        return _skip(name, what, _no_table("scaling", report, "`distval scale`"), exp, where)
    rows = [(v, r) for r in table.rows if r.get("world_size") == size
            and (v := _number(r.get("efficiency"))) is not None]
    if not rows:
        sizes = sorted({r.get("world_size") for r in table.rows if isinstance(r.get("world_size"), int)})
        return _skip(name, what, f"not measured; world sizes measured: {_listed([str(n) for n in sizes])}", exp, where)
    value, row = min(rows, key=lambda vr: vr[0])
    where.update(nodes=row.get("nodes"), ranks_per_node=row.get("ranks_per_node"))
    planned = _number(row.get("planned_efficiency"))
    hint = "see where the step's time goes with `distval trace`, and what the links deliver with `distval comm bench`"
    if planned is not None:
        gap = f"; its largest miss is {row['gap']}" if row.get("gap") else ""
        hint = f"the planner expected {planned:.2f} at this point{gap}: {hint}"
    return _verdict(name, what, value, minimum, "", exp, at_least=True, where=where, hint=hint,
                    details={"planned_efficiency": planned, "tokens_per_s": row.get("tokens_per_s")})


def _scale_step_time(maximum: float, table: Table | None, exp: Expectations, report: Report) -> Check:
    name, what = "expect scale step_time", "slowest step time over the world sizes"
    if table is None:
        return _skip(name, what, _no_table("scaling", report, "`distval scale`"), exp, {})
    rows = sorted(((v, r) for r in table.rows if (v := _number(r.get("step_time_s"))) is not None),
                  key=lambda vr: -vr[0])
    if not rows:
        return _skip(name, what, "no step_time_s figure in table `scaling`", exp, {})
    value, row = rows[0]
    above = [(v, r) for v, r in rows if v > maximum]
    point = f"step time at {row.get('world_size')} ranks" if above else f"{what}, at {row.get('world_size')} ranks"
    more = f", and {len(above) - 1} more world size{'s' * (len(above) > 2)} above it" if len(above) > 1 else ""
    return _verdict(name, point, value, maximum, "s", exp, at_least=False,
                    where={"world_size": row.get("world_size"), "nodes": row.get("nodes")}, more=more,
                    hint="compare with planned_step_time_s in table `scaling` and its `gap` column; "
                         "`distval trace` at that world size shows where the time goes",
                    details={"above": [{"world_size": r.get("world_size"), "step_time_s": v} for v, r in above]})


# -- [train] ----------------------------------------------------------------------------------------

_TRAIN = {  # key -> (column, check name, what, unit, at least)
    "max_step_time_s": ("step_time_s", "step_time", "median step time", "s", False),
    "min_mfu": ("mfu", "mfu", "median MFU", "", True),
    "min_tokens_per_s": ("tokens_per_s", "tokens_per_s", "median throughput", "tokens/s", True),
}


def _train(t: TrainExpectation, exp: Expectations, report: Report) -> list[Check]:
    table = report.table("steps")
    steps = (table.rows[1:] or table.rows) if table is not None else []  # the first step pays for warm-up
    out = []
    for key, (column, short, what, unit, at_least) in _TRAIN.items():
        threshold = getattr(t, key)
        if threshold is None:
            continue
        name = f"expect train {short}"
        where = {k: v for k, v in (("world_size", report.meta.get("world_size")),) if v is not None}
        if table is None:
            out.append(_skip(name, what, _no_table("steps", report, "`distval train` (or `distval run`)"), exp, where))
            continue
        values = [v for r in steps if (v := _number(r.get(column))) is not None]
        if not values:
            out.append(_skip(name, what, f"no {column} figure in table `steps`", exp, where))
            continue
        where["steps"] = len(values)
        out.append(_verdict(name, f"{what} over {len(values)} steps", statistics.median(values), threshold, unit, exp,
                            at_least=at_least, where=where, hint=_train_hint(steps),
                            details={"num_steps": len(values), "column": column}))
    return out


def _train_hint(steps: list[dict[str, Any]]) -> str:
    """Where a slow step goes, from the step table's own columns."""
    def median(column: str) -> float | None:
        values = [v for r in steps if (v := _number(r.get(column))) is not None]
        return statistics.median(values) if values else None

    step, blocked, optimizer = median("step_time_s"), median("comm_blocked_s"), median("optimizer_s")
    split = ""
    if step and blocked is not None and optimizer is not None:
        split = (f"waiting on communication is {blocked / step:.0%} of a step (comm_blocked_s), "
                 f"the optimizer {optimizer / step:.0%}; ")
    return (f"{split}`distval trace` shows where the step goes, `distval plan` what it should take, "
            "`distval comm bench` what the links deliver")
