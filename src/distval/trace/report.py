"""`distval trace analyze`: find the per-rank trace files, read each (a bad one is a WARN, not a
lost analysis), match collectives across ranks, and build the report: checks, the per-rank and
per-step breakdown, HTA's temporal and overlap figures, collectives and late arrivals."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any

from distval.results import Check, Report, Status, Table
from distval.trace import hta
from distval.trace.analyze import CATEGORIES, Step, breakdown, collective_rows, late_rows, match, op_rows
from distval.trace.events import RankTrace, read_rank
from distval.trace.kineto import TraceError
from distval.trace.merge import write_merged

SUFFIXES = (".json", ".json.gz")
PARALLEL_BYTES = 4 << 20  # files bigger than this in all are read in parallel
WAIT_WARN = 0.20  # the others wait this share of the step time for one rank: a WARN
MIN_MATCHED = 8  # ... over at least this many collectives


def find_files(paths: list[Path]) -> list[Path]:
    """Trace files named on the command line, or the *.json / *.json.gz files of a folder."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(SUFFIXES)
                           and not f.name.startswith("."))  # a write in progress (.tmp-...) is not a trace
            if not found:
                inner = sorted(d.name for d in p.iterdir() if d.is_dir() and any(
                    f.name.endswith(SUFFIXES) for f in d.iterdir()))
                hint = f" (its folder{'s' if len(inner) > 1 else ''} {', '.join(inner)} hold traces: name one)" \
                    if inner else ""
                raise TraceError(p, f"no trace files (*.json, *.json.gz) in this folder{hint}")
            files += found
        elif p.exists():
            files.append(p)
        else:
            raise TraceError(p, "no such file or folder")
    return files


def _read(f: Path) -> RankTrace | TraceError:
    try:
        return read_rank(f)
    except TraceError as e:
        return e


def read_all(files: list[Path]) -> tuple[list[RankTrace], list[Check]]:
    """Every readable file as a rank, big files in parallel (a process per core); a file that
    cannot be read is a WARN when others can be, and the error (exit 2) when none can."""
    workers = min(len(files), os.cpu_count() or 1)
    main = sys.modules.get("__main__")  # a spawned worker imports it again: a script on stdin cannot be
    spawnable = getattr(main, "__spec__", None) is not None or os.path.isfile(getattr(main, "__file__", "") or "")
    if workers > 1 and spawnable and sum(f.stat().st_size for f in files) > PARALLEL_BYTES:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        try:  # spawn: safe beside torch's threads (train --trace)
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                read = list(pool.map(_read, files))
        except BrokenProcessPool:  # a __main__ spawn cannot import again (a script on stdin): one at a time
            read = [_read(f) for f in files]
    else:
        read = [_read(f) for f in files]
    ranks, problems, errors = [], [], []
    for f, got in zip(files, read):
        if isinstance(got, RankTrace):
            ranks.append(got)
        else:
            errors.append(e := got)
            problems.append(Check(f"trace file {f.name}", Status.WARN, f"not analysed: {e.reason}",
                                  hint="re-export it from torch.profiler, or leave it out", where={"file": str(f)}))
    if not ranks:
        raise errors[0]
    seen: set[int] = set()
    for rt in ranks:  # the first file of each rank keeps it; a repeat or a file without one gets a free number
        if rt.rank is not None and rt.rank in seen:
            problems.append(Check(f"trace file {Path(rt.path).name}", Status.WARN, f"rank {rt.rank} appears in "
                                  "more than one file: analysed as another rank", where={"file": rt.path}))
            rt.rank = None
        elif rt.rank is not None:
            seen.add(rt.rank)
    free = (r for r in range(len(ranks) + max(seen, default=0) + 1) if r not in seen)
    for rt in ranks:
        if rt.rank is None:
            rt.rank = next(free)
    ranks.sort(key=lambda r: r.rank)
    return ranks, problems


def one_job(ranks: list[RankTrace]) -> str | None:
    """Why these ranks cannot be one job (None if they can be)."""
    worlds = {rt.world_size for rt in ranks if rt.world_size}
    if len(worlds) > 1:
        return f"their world sizes differ ({', '.join(str(w) for w in sorted(worlds))})"
    if {rt.on_gpu for rt in ranks} == {True, False}:
        return "some ran on GPU and some on CPU"
    numbers = [{n for n, _, _ in rt.steps} for rt in ranks]
    if all(numbers) and not set.intersection(*numbers):
        return "they recorded no profiler step in common"
    return None


def analyze(paths: list[Path], merged: Path | None = None) -> Report:
    """The analysis of the traces in `paths`; `merged`: also write one Perfetto trace of all ranks."""
    files = find_files(paths)
    ranks, problems = read_all(files)
    report = Report("trace analyze", meta={"inputs": [str(p) for p in paths], "files": len(files),
                                           "ranks": [rt.rank for rt in ranks]})
    where = "GPU kernels" if any(rt.on_gpu for rt in ranks) else "CPU ops and Gloo work"
    report.add(Check("trace files", Status.OK, f"{len(ranks)} of {len(files)} file(s) read: "
                     f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r.rank) for r in ranks)}; "
                     f"{sum(r.events for r in ranks):,} events; breakdown from {where}"))
    for c in problems:
        report.add(c)
    apart = one_job(ranks) if len(ranks) > 1 else None
    matched, unmatched = ([], []) if apart else match(ranks)
    if len(ranks) < 2:
        report.add(Check("trace matching", Status.SKIP, "one rank: no collective to match across ranks"))
    elif apart:
        report.add(Check("trace matching", Status.WARN, f"these traces are not one job: {apart}; each rank is "
                         "analysed alone (no waiting-for-peers split, no late arrivals)",
                         hint="analyse the files of one job together"))
    elif not matched and not unmatched:
        report.add(Check("trace matching", Status.SKIP, "no collective to match across ranks (sends and receives "
                         "are not matched)"))
    else:
        report.add(Check("trace matching", Status.WARN if unmatched else Status.OK,
                         f"{len(matched):,} collectives matched across {len(ranks)} ranks" +
                         (f"; {len(unmatched)} kinds not matched one to one: {unmatched[0]}" if unmatched else ""),
                         details={"unmatched": unmatched}))
    steps = [s for rt in ranks for s in breakdown(rt)]
    for rt in ranks:
        if not rt.steps:
            report.add(Check(f"trace steps rank {rt.rank}", Status.WARN, "no ProfilerStep# markers: the whole "
                             "trace is analysed as one step", hint="call prof.step() once per training step",
                             where={"rank": rt.rank}))
    late = late_rows(ranks, matched, steps)
    _add_waiting_check(report, late, sum(r["arrived_last"] for r in late))
    if merged is not None:
        offsets = write_merged(ranks, matched, merged)
        report.meta["merged"] = {"path": str(merged), "clock_offsets_us": offsets}
    report.tables += [rank_table(ranks, steps), step_table(steps), *hta.tables(ranks),
                      _table("trace_collectives", "Collectives (per call; transfer = the shortest rank's time)",
                             collective_rows(ranks, matched), {"time_us": "us", "transfer_us": "us",
                                                               "algbw_GBps": "GB/s", "busbw_GBps": "GB/s"}),
                      _table("trace_ops", "Where the time goes by kernel or op (per step, mean over ranks)",
                             op_rows(ranks, steps), {"ms_per_step": "ms"})]
    if late:
        report.tables.append(_table("trace_late_arrivals", "Who arrives last at a collective", late,
                                    {"others_waited_ms": "ms"}))
    return report


def _add_waiting_check(report: Report, late: list[dict[str, Any]], matched: int) -> None:
    """A WARN when one rank makes the others wait a fifth of the step or more, twice as long as
    any other rank does (ranks that take turns arriving last are noise, not a straggler), over
    at least MIN_MATCHED collectives."""
    if not late:
        return
    worst = max(late, key=lambda r: r["others_waited_ms"])
    share = worst["of_step_time"] or 0.0
    runner_up = max((r["others_waited_ms"] for r in late if r is not worst), default=0.0)
    text = (f"rank {worst['rank']} arrives last at {worst['share']:.0%} of the collectives; the others wait "
            f"{share:.0%} of the step time for it")
    if matched < MIN_MATCHED:
        status, text = Status.OK, f"{text} ({matched} collectives: too few to name a straggler)"
    elif share >= WAIT_WARN and worst["others_waited_ms"] >= 2 * runner_up:
        status = Status.WARN
    else:
        status, text = Status.OK, f"{text} (the next rank: {runner_up:.2f} ms)"
    report.add(Check("trace stragglers", status, text, where={"rank": worst["rank"]}, details=worst,
                     hint="a straggler: compare its compute with its peers' (distval train reports it live)"
                     if status is Status.WARN else ""))


def _table(name: str, title: str, rows: list[dict[str, Any]], units: dict[str, str]) -> Table:
    t = Table(name, list(rows[0]) if rows else [], title=title, units=units)
    for r in rows:
        t.add(**r)
    return t


def rank_table(ranks: list[RankTrace], steps: list[Step]) -> Table:
    """Per rank over its steps: the step time (median) and each category's share of it."""
    rows = []
    for rt in ranks:
        mine = [s for s in steps if s.rank == rt.rank]
        if not mine:
            continue
        total = sum(s.span for s in mine)
        mfus = [s.mfu for s in mine if s.mfu is not None]
        median_ms = statistics.median(s.span for s in mine) / 1e3
        rows.append({"rank": rt.rank, "steps": len(mine), "step_ms": round(median_ms, 3),
                     **{c: round(100 * sum(s.parts[c] for s in mine) / total, 2) if total else 0.0
                        for c in CATEGORIES},
                     "mfu": round(statistics.median(mfus), 4) if mfus else None,
                     "mem_peak_bytes": max(rt.memory_peak.values(), default=None)})  # with profile_memory
    units = {"step_ms": "ms", **{c: "%" for c in CATEGORIES}, "mem_peak_bytes": "B"}
    return _table("trace_breakdown", "Where each rank's step time goes (share of the step time)", rows, units)


def step_table(steps: list[Step]) -> Table:
    rows = [{"rank": s.rank, "step": s.step, "step_ms": round(s.span / 1e3, 3),
             **{c: round(s.parts[c] / 1e3, 3) for c in CATEGORIES}} for s in steps]
    return _table("trace_steps", "Every step, every rank (ms; the categories sum to step_ms)", rows,
                  {"step_ms": "ms", **{c: "ms" for c in CATEGORIES}})


AGREE = 0.05  # the trace's step time within 5% of the harness's


def harness_check(traced: Report, harness: dict[int, float], name: str, folder: str) -> Check:
    """Do the traces' steps (the slowest rank's, as the harness takes them) last what the harness
    measured? And where did the time go, over all ranks."""
    per_step = _slowest(traced)
    common = sorted(set(per_step) & set(harness))
    if not common:
        return Check(name, Status.WARN, f"the traces in {folder} hold none of the run's steps",
                     details={"trace_steps": sorted(per_step)})
    t, h = statistics.median(per_step[s] for s in common), statistics.median(harness[s] for s in common)
    diff = t / h - 1 if h else 0.0
    shares, top = _shares(traced)
    return Check(name, Status.OK if abs(diff) <= AGREE else Status.WARN,
                 f"steps {common[0]}-{common[-1]} traced in {folder}: {t * 1e3:.1f} ms per step in the trace, "
                 f"{h * 1e3:.1f} ms measured ({diff:+.1%}); {top}",
                 hint="" if abs(diff) <= AGREE else "the profiler's own cost, or a trace of another run in the folder",
                 details={"trace_step_s": t, "harness_step_s": h, "difference": diff, "steps": common,
                          "shares_pct": shares, "folder": folder})


def _slowest(traced: Report) -> dict[int, float]:
    """step -> its time on the slowest rank (s), as the harness takes a step's time."""
    per_step: dict[int, float] = {}
    for r in traced.table("trace_steps").rows:
        per_step[r["step"]] = max(per_step.get(r["step"], 0.0), r["step_ms"] / 1e3)
    return per_step


def _shares(traced: Report) -> tuple[dict[str, float], str]:
    """Each category's share of the step (%, mean over ranks), and the ones over 1% as text."""
    rows = traced.table("trace_breakdown").rows
    shares = {c: statistics.mean(r[c] for r in rows) for c in CATEGORIES}
    top = ", ".join(f"{c.replace('_', ' ')} {v:.0f}%" for c, v in sorted(shares.items(), key=lambda kv: -kv[1])
                    if v >= 1)
    return shares, top


def add_summary(report: Report, folder: str) -> None:
    """`distval launch --trace`: the analysis of the script's traces in the launch report: a
    check with the step time and where it goes, the analysis's own warnings, the breakdown."""
    try:
        traced = analyze([Path(folder)])
    except TraceError as e:
        report.add(Check("trace", Status.WARN, f"no analysis: {e.reason}", hint="the script ended before the "
                         "recorded steps, or never called optimizer.step(): lower SKIP:N", where={"folder": folder}))
        return
    shares, top = _shares(traced)
    per_step = _slowest(traced)
    numbers = sorted(per_step)
    slowest = statistics.median(per_step.values()) * 1e3
    report.add(Check("trace", Status.OK, f"{len(traced.meta['ranks'])} rank(s), steps {numbers[0]}-{numbers[-1]} "
                     f"traced in {folder}: {slowest:.1f} ms per step (the slowest rank); {top}",
                     details={"folder": folder, "step_ms": slowest, "shares_pct": shares}))
    report.checks += [c for c in traced.checks if c.status is not Status.OK and c.name != "trace matching"]
    report.tables.append(traced.table("trace_breakdown"))


def write_csv(report: Report, folder: Path) -> list[Path]:
    """Each table with rows as <folder>/<name>.csv (written whole or not at all)."""
    import csv
    import io

    from distval.results import atomic_write_text

    written = []
    for table in report.tables:
        if not table.rows:
            continue
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=table.columns, lineterminator="\n")
        w.writeheader()
        w.writerows(table.rows)
        path = folder / f"{table.name}.csv"
        atomic_write_text(path, out.getvalue())
        written.append(path)
    return written
