"""`distval trace analyze` against Holistic Trace Analysis 0.5.0 on the same traces: the
wall time and peak memory of each, and whether their figures agree.

Inputs: every folder of HTA's own test traces (`--traces`, ../shared/traces/hta: its README.md
says what each holds), and a large set built here once and reused from `--work` while its
manifest matches: the rank(s) of `--source` (df_index_resolver's 54 MB rank by default) copied
into `--ranks` ranks (distributedInfo's rank and world_size rewritten), each rank's whole profile
played `--copies` times one after the other (timestamps shifted by the profile's span,
ProfilerStep#N renumbered, correlation, External id, Ev Idx, Sequence number and flow ids offset
so they stay unique; 0 = as many copies as make `--min-mb` MB of JSON). Written event by event,
gzip-compressed, from the streaming reader (the source is never held whole).

Per input, one command after the other (never two at once), `--repeats` times interleaved
(`--large-repeats` for the large set); medians are printed:
  distval  `python -m distval trace analyze DIR --json OUT` with this interpreter
  HTA      TraceAnalysis(trace_dir=DIR); get_temporal_breakdown(visualize=False);
           get_comm_comp_overlap(visualize=False), with the python of `--hta-venv` (created with
           `holistictraceanalysis==0.5.0 "pandas<3"` when it cannot import hta)
Time: the wall clock of the whole command (interpreter start and imports included); CPU: its user
+ system time, reaped children included. Peak memory: the larger of the command's ru_maxrss
(os.wait4: its own peak or that of a child it reaped, whichever is higher) and the peak, sampled
every 0.2 s while the command has child processes, of the proportional set sizes (PSS) summed over
its process tree: HTA parses ranks in a pool of forked processes (one per core), whose memory adds
up. The files are read once before timing, so both find them in the page cache.
Agreement: HTA's idle, compute and non-compute percentages and its overlap against distval's
hta_temporal and hta_overlap tables, rank by rank: the largest absolute difference, in percentage
points. HTA fails on cpu_only (no GPU kernels); that row says so.

Goal: on the large set, distval in <= 1/3 of HTA's time and <= 1/3 of its peak memory;
exit 1 when missed.

    python benchmarks/trace_vs_hta.py                       # HTA's folders and the large set
    python benchmarks/trace_vs_hta.py --quick               # HTA's folders only (a smoke run)
    python benchmarks/trace_vs_hta.py --hta-venv /work/hta_venv --work /tmp/trace-vs-hta --ranks 4
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from distval.trace.kineto import open_trace
from distval.trace.report import find_files

ROOT = Path(__file__).resolve().parents[1]
GOAL = 1 / 3
PCTG = ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg")
ID_ARGS = ("correlation", "External id", "Ev Idx", "Sequence number", "Python id", "Python parent id")
STEP = re.compile(r"^ProfilerStep#(\d+)$")
MB, MIB = 1e6, 2**20

HTA_SCRIPT = r'''
import json, math, sys
from hta.trace_analysis import TraceAnalysis

def rows(df):
    return [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
            for r in df.to_dict(orient="records")]

analysis = TraceAnalysis(trace_dir=sys.argv[1])
temporal = analysis.get_temporal_breakdown(visualize=False)
overlap = analysis.get_comm_comp_overlap(visualize=False)
with open(sys.argv[2], "w") as f:
    json.dump({"temporal": rows(temporal), "overlap": rows(overlap)}, f, default=lambda v: v.item())
'''


# --- HTA's venv ---------------------------------------------------------------------------------

def hta_python(venv: Path) -> Path:
    """The venv's python, after installing HTA 0.5.0 there if it cannot import hta."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import hta"], capture_output=True).returncode == 0:
        return py
    print(f"installing HTA 0.5.0 (pandas < 3) into {venv} ...", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "holistictraceanalysis==0.5.0", "pandas<3"], check=True)
    if subprocess.run([py, "-c", "import hta"], capture_output=True).returncode != 0:
        raise SystemExit(f"{py} still cannot import hta")
    return py


def versions(py: Path) -> str:
    code = ("import importlib.metadata as m, platform; print(f\"HTA {m.version('holistictraceanalysis')}, pandas "
            "{m.version('pandas')}, Python {platform.python_version()}\")")
    return subprocess.run([py, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


# --- the large set ------------------------------------------------------------------------------

@dataclass
class Source:
    """What one pass over a source rank's file tells: the header keys around traceEvents, the time
    span, the largest id and step number, the JSON bytes of one copy of its events."""

    path: Path
    before: dict = field(default_factory=dict)  # the top-level keys before traceEvents, in order
    after: dict = field(default_factory=dict)  # ... and after it
    first: float = math.inf
    last: float = -math.inf
    max_id: int = 0
    steps: set[int] = field(default_factory=set)
    copy_bytes: int = 0  # one copy's events (metadata events, written once, left out)


def scan(path: Path) -> Source:
    src = Source(path)
    header, events = open_trace(path)
    for ev in events:
        if not src.before and header:  # the keys read before the first event
            src.before = dict(header)
        if ev.get("ph") == "M":
            continue
        src.copy_bytes += len(json.dumps(ev)) + 2
        ts = ev.get("ts")
        if isinstance(ts, (int, float)):
            src.first = min(src.first, ts)
            src.last = max(src.last, ts + (ev.get("dur") or 0))
        if isinstance(ev.get("id"), int):
            src.max_id = max(src.max_id, ev["id"])
        args = ev.get("args")
        if isinstance(args, dict):
            src.max_id = max([src.max_id] + [args[k] for k in ID_ARGS if isinstance(args.get(k), int)])
        m = STEP.match(str(ev.get("name", "")))
        if m:
            src.steps.add(int(m.group(1)))
    src.after = {k: v for k, v in header.items() if k not in src.before}
    return src


def replay(ev: dict, k: int, shift: int, id_step: int, step_step: int) -> dict:
    """Event `ev` in the k-th copy of the profile."""
    if not k:
        return ev
    ev = dict(ev)
    if isinstance(ev.get("ts"), (int, float)):
        ev["ts"] += k * shift
    if isinstance(ev.get("id"), int):
        ev["id"] += k * id_step
    args = ev.get("args")
    if isinstance(args, dict) and any(key in args for key in ID_ARGS):
        ev["args"] = args = dict(args)
        for key in ID_ARGS:
            if isinstance(args.get(key), int) and args[key] >= 0:
                args[key] += k * id_step
    m = STEP.match(str(ev.get("name", "")))
    if m:
        ev["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_step}"
    return ev


def build_large(traces: Path, source: str, ranks: int, copies: int, min_mb: float, work: Path) -> tuple[Path, dict]:
    """The large set's folder (built, or reused when its manifest matches) and its manifest."""
    files = find_files([traces / source])
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    want = {"source": stats, "ranks": ranks, "copies": copies, "min_mb": min_mb, "version": 1}
    out = work / f"large-{source}-{ranks}r-{copies or 'auto'}x-{min_mb:g}mb"
    manifest = out.with_name(out.name + ".manifest.json")  # beside the folder: the folder holds traces only
    if manifest.exists() and out.is_dir():
        done = json.loads(manifest.read_text())
        if {k: done.get(k) for k in want} == json.loads(json.dumps(want)):
            print(f"large set: reusing {out}")
            return out, done
    started = time.monotonic()
    print(f"large set: reading {source} ({len(files)} file(s)) ...", flush=True)
    srcs = [scan(f) for f in files]
    shift = math.ceil(max(s.last for s in srcs) - min(s.first for s in srcs)) + 1000  # 1 ms between copies
    id_step = max(s.max_id for s in srcs) + 1
    steps = set().union(*(s.steps for s in srcs))
    step_step = max(steps) - min(steps) + 1 if steps else 0
    per_copy = sum(srcs[r % len(srcs)].copy_bytes for r in range(ranks))
    copies_n = copies or max(1, math.ceil(min_mb * MB / per_copy))
    print(f"large set: {ranks} ranks x {copies_n} copies of the profile ({len(steps)} ProfilerSteps, "
          f"{shift / 1e6:.2f} s, each copy) into {out} ...", flush=True)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    partial.mkdir(parents=True)
    sizes = [0] * ranks
    for i, src in enumerate(srcs):
        mine = [r for r in range(ranks) if r % len(srcs) == i]
        outs = {r: gzip.open(partial / f"rank-{r}.json.gz", "wt", encoding="ascii", compresslevel=6) for r in mine}
        pending: dict[int, list[str]] = {r: [] for r in mine}

        def write(r: int, text: str, flush: bool = False) -> None:  # json.dumps writes ASCII: len() is bytes
            pending[r].append(text)
            sizes[r] += len(text)
            if flush or len(pending[r]) >= 4096:
                outs[r].write("".join(pending[r]))
                pending[r].clear()

        def keys(r: int, header: dict, last: bool) -> None:
            for n, (key, value) in enumerate(header.items()):
                if key == "distributedInfo" and isinstance(value, dict):
                    value = dict(value, rank=r, world_size=ranks)
                elif key == "traceName":
                    value = f"rank-{r}.json"
                write(r, f'  "{key}": {json.dumps(value)}{"" if last and n == len(header) - 1 else ","}\n')

        for r in mine:
            write(r, "{\n")
            before = src.before if "distributedInfo" in src.before or "distributedInfo" in src.after else \
                dict(src.before, distributedInfo={"rank": r, "world_size": ranks})
            keys(r, before, False)
            write(r, '  "traceEvents": [\n')
        first = True
        for k in range(copies_n):
            _, events = open_trace(src.path)
            for ev in events:
                if k and ev.get("ph") == "M":
                    continue
                text = ("" if first else ",\n") + json.dumps(replay(ev, k, shift, id_step, step_step))
                first = False
                for r in mine:
                    write(r, text)
        for r in mine:
            write(r, "\n  ]" + (",\n" if src.after else "\n"))
            keys(r, src.after, True)
            write(r, "}\n", flush=True)
            outs[r].close()
    done = dict(want, copies_built=copies_n, json_bytes=sum(sizes), steps_per_rank=len(steps) * copies_n,
                build_s=round(time.monotonic() - started, 1))
    partial.rename(out)
    manifest.write_text(json.dumps(done, indent=1))
    print(f"large set: {sum(sizes) / MB:.0f} MB of JSON in {ranks} files "
          f"({sum(f.stat().st_size for f in out.glob('*.gz')) / MB:.0f} MB gzip), built in {done['build_s']:.0f} s")
    return out, done


# --- measuring one command ----------------------------------------------------------------------

def tree(pid: int) -> list[int]:
    """pid and its descendants (from /proc/PID/task/TID/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:  # it exited while we looked: no children to follow
            continue
    return out


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:  # it exited while we looked
        return 0
    return 0


class TreeSampler(threading.Thread):
    """The peak of the process tree's summed PSS, sampled while the tree has more than one process
    (a lone process's peak is its ru_maxrss, exactly)."""

    def __init__(self, pid: int, every_s: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.every_s, self.peak_kib, self.done = pid, every_s, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            pids = tree(self.pid)
            if len(pids) > 1:
                self.peak_kib = max(self.peak_kib, sum(pss_kib(p) for p in pids))


@dataclass
class Run:
    ok: bool
    wall_s: float
    cpu_s: float
    peak_mib: float
    error: str = ""


def measure(cmd: list, log: Path, ok_codes: tuple[int, ...], out: Path) -> Run:
    """Run `cmd` (output to `log`) to its end; it succeeded if it exited with one of `ok_codes`
    and wrote `out`."""
    with open(log, "wb") as f:
        started = time.perf_counter()
        proc = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        sampler.done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    peak = max(ru.ru_maxrss, sampler.peak_kib) / 1024
    error = ""
    if proc.returncode not in ok_codes or not out.exists():
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
        error = lines[-1].strip() if lines and proc.returncode else f"exit {proc.returncode}, no {out.name}"
    return Run(not error, wall, ru.ru_utime + ru.ru_stime, peak, error)


def json_bytes(files: list[Path]) -> int:
    """The JSON size of trace files (decompressed); reading them also puts them in the page cache."""
    total = 0
    for f in files:
        with (gzip.open(f, "rb") if f.name.endswith(".gz") else open(f, "rb")) as r:
            while chunk := r.read(1 << 22):
                total += len(chunk)
    return total


# --- agreement ----------------------------------------------------------------------------------

def disagreement(dv: dict, hta: dict) -> tuple[float | None, str]:
    """The largest |distval - HTA| in percentage points over every rank's four figures, and what
    did not even match (a rank missing, a figure None on one side only)."""
    tables = dv.get("tables", {})
    temporal = {r["rank"]: r for r in (tables.get("hta_temporal") or {}).get("rows", [])}
    overlap = {r["rank"]: r["comp_comm_overlap_pctg"] for r in (tables.get("hta_overlap") or {}).get("rows", [])}
    diffs, problems = [], []
    if set(temporal) != {r["rank"] for r in hta["temporal"]}:
        problems.append(f"ranks {sorted(temporal)} against HTA's {sorted(r['rank'] for r in hta['temporal'])}")
    for row in hta["temporal"]:
        mine = temporal.get(row["rank"])
        if mine:
            diffs += [abs(mine[c] - row[c]) for c in PCTG if mine[c] is not None and row[c] is not None]
            problems += [f"rank {row['rank']} {c}: {mine[c]} against {row[c]}" for c in PCTG
                         if (mine[c] is None) != (row[c] is None)]
    for row in hta["overlap"]:
        mine, theirs = overlap.get(row["rank"]), row["comp_comm_overlap_pctg"]
        if mine is not None and theirs is not None:
            diffs.append(abs(mine - theirs))
        elif (mine is None) != (theirs is None) and row["rank"] in overlap:
            problems.append(f"rank {row['rank']} overlap: {mine} against {theirs}")
    return (max(diffs) if diffs else None), "; ".join(problems)


# --- one input ----------------------------------------------------------------------------------

@dataclass
class Result:
    name: str
    mb: float
    ranks: int
    dv: list[Run]
    hta: list[Run]
    diff: float | None
    problems: str
    figures: dict

    @staticmethod
    def med(runs: list[Run], attr: str) -> float | None:
        ok = [getattr(r, attr) for r in runs if r.ok]
        return statistics.median(ok) if ok else None


def compare(name: str, folder: Path, repeats: int, py: Path, tmp: Path, mb: float | None = None) -> Result:
    files = find_files([folder])
    size = json_bytes(files) / MB  # also the page-cache warm-up
    mb = size if mb is None else mb
    script = tmp / "hta_run.py"
    script.write_text(HTA_SCRIPT)
    dv_runs, hta_runs, dv_doc, hta_doc = [], [], {}, {}
    slug = re.sub(r"\W+", "_", name)
    for rep in range(repeats):
        dv_out, hta_out = tmp / f"{slug}.distval.json", tmp / f"{slug}.hta.json"
        # distval exits 1 when a check FAILs (the analysis is there), 2 when it cannot analyse
        run = measure([sys.executable, "-m", "distval", "trace", "analyze", folder, "--json", dv_out],
                      tmp / f"{slug}.distval.log", (0, 1), dv_out)
        dv_runs.append(run)
        if run.ok:
            dv_doc = json.loads(dv_out.read_text())
        if rep and not any(r.ok for r in hta_runs):
            continue  # HTA failed: once is enough to say so
        run = measure([py, script, folder, hta_out], tmp / f"{slug}.hta.log", (0,), hta_out)
        hta_runs.append(run)
        if run.ok:
            hta_doc = json.loads(hta_out.read_text())
        for p in (dv_out, hta_out):
            p.unlink(missing_ok=True)
    ranks = len((dv_doc.get("tables", {}).get("trace_breakdown") or {}).get("rows", [])) or len(files)
    diff, problems, figures = None, "", {}
    if dv_doc and hta_doc:
        diff, problems = disagreement(dv_doc, hta_doc)
        ov = {r["rank"]: r["comp_comm_overlap_pctg"] for r in hta_doc["overlap"]}
        figures = {r["rank"]: (*(r[c] for c in PCTG), ov.get(r["rank"])) for r in hta_doc["temporal"]}
    return Result(name, mb, ranks, dv_runs, hta_runs, diff, problems, figures)


# --- printing -----------------------------------------------------------------------------------

def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(results: list[Result]) -> None:
    width = max(len("input"), *(len(r.name) for r in results))
    print(f"{'input':<{width}} {'JSON MB':>8} {'ranks':>5} {'distval s':>9} {'HTA s':>8} {'time ratio':>10} "
          f"{'distval MiB':>11} {'HTA MiB':>8} {'mem ratio':>9} {'max diff pp':>11} {'distval CPU s':>13} "
          f"{'HTA CPU s':>9}")
    for r in results:
        dv_s, hta_s = Result.med(r.dv, "wall_s"), Result.med(r.hta, "wall_s")
        dv_m, hta_m = Result.med(r.dv, "peak_mib"), Result.med(r.hta, "peak_mib")
        t_ratio = dv_s / hta_s if dv_s and hta_s else None
        m_ratio = dv_m / hta_m if dv_m and hta_m else None
        diff = "HTA fails" if not hta_s else ("distval fails" if not dv_s else fmt(r.diff, ".2f"))
        print(f"{r.name:<{width}} {r.mb:>8.1f} {r.ranks:>5} {fmt(dv_s, '.2f'):>9} {fmt(hta_s, '.2f'):>8} "
              f"{fmt(t_ratio, '.3f'):>10} {fmt(dv_m, '.0f'):>11} {fmt(hta_m, '.0f'):>8} {fmt(m_ratio, '.3f'):>9} "
              f"{diff:>11} {fmt(Result.med(r.dv, 'cpu_s'), '.2f'):>13} {fmt(Result.med(r.hta, 'cpu_s'), '.2f'):>9}")


def notes(results: list[Result]) -> None:
    for r in results:
        dv_err = next((x.error for x in r.dv if not x.ok), "")
        hta_err = next((x.error for x in r.hta if not x.ok), "")
        if hta_err and not dv_err:
            print(f"  {r.name}: HTA fails ({hta_err}); distval analyses it ({r.ranks} rank(s))")
        elif dv_err:
            print(f"  {r.name}: distval fails ({dv_err})" + (f"; HTA fails too ({hta_err})" if hta_err else ""))
        if r.problems:
            print(f"  {r.name}: figures that do not match: {r.problems}")
    print("HTA 0.5.0's figures, rank: (idle %, compute %, non-compute %, overlap %):")
    for r in results:
        if r.figures:
            print(f'  "{r.name}": {{{", ".join(f"{k}: {v}" for k, v in sorted(r.figures.items()))}}},')


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces" / "hta",
                   help="HTA's test traces, a folder of trace folders (default: ../shared/traces/hta)")
    p.add_argument("--only", default="", help="these folders only (comma-separated names)")
    p.add_argument("--hta-venv", type=Path, default=Path.home() / ".cache" / "distval" / "hta-venv")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "distval-trace-vs-hta",
                   help="where the large set is built and kept for the next run")
    p.add_argument("--repeats", type=int, default=3, help="runs of each tool per folder of HTA's traces")
    p.add_argument("--large-repeats", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="no large set")
    p.add_argument("--source", default="df_index_resolver", help="the folder whose rank(s) the large set copies")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--copies", type=int, default=0, help="copies of each rank's profile (0: enough for --min-mb)")
    p.add_argument("--min-mb", type=float, default=200, help="JSON MB the large set holds at least")
    p.add_argument("--json", type=Path, help="also write every run's figures here")
    args = p.parse_args()
    py = hta_python(args.hta_venv.expanduser())
    folders = sorted(d for d in args.traces.iterdir() if d.is_dir() and (not args.only or d.name in
                                                                            args.only.split(",")))
    print(f"distval (Python {sys.version.split()[0]}) against {versions(py)} ({py}); {os.cpu_count()} CPU(s); "
          f"medians of {args.repeats} run(s) per folder, one command at a time", flush=True)
    results: list[Result] = []
    args.work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        for folder in folders:
            results.append(compare(folder.name, folder, args.repeats, py, Path(tmp)))
            print(f"  {folder.name}: done", flush=True)
        large = None
        if not args.quick:
            where, manifest = build_large(args.traces, args.source, args.ranks, args.copies, args.min_mb, args.work)
            name = f"large ({args.source} x{args.ranks} ranks x{manifest['copies_built']} copies)"
            large = compare(name, where, args.large_repeats, py, Path(tmp), manifest["json_bytes"] / MB)
            results.append(large)
    print()
    table(results)
    print("time: wall clock of the whole command; memory: peak of the process tree (MiB); ratios: distval / HTA; "
          "max diff pp: HTA's idle, compute, non-compute and overlap % against distval's, largest |difference|")
    notes(results)
    if args.json:
        args.json.write_text(json.dumps([{**{k: v for k, v in r.__dict__.items() if k not in ("dv", "hta")},
                                          "distval": [x.__dict__ for x in r.dv], "hta": [x.__dict__ for x in r.hta]}
                                         for r in results], indent=1, default=str))
    if large is None:
        print("no large set (--quick): no verdict on the goal")
        return 0
    dv_s, hta_s = Result.med(large.dv, "wall_s"), Result.med(large.hta, "wall_s")
    dv_m, hta_m = Result.med(large.dv, "peak_mib"), Result.med(large.hta, "peak_mib")
    if not (dv_s and hta_s):
        print("goal (large set): not measured, a tool failed")
        return 1
    t_ok, m_ok = dv_s / hta_s <= GOAL, dv_m / hta_m <= GOAL
    print(f"goal (large set, {large.mb:.0f} MB of JSON, {large.ranks} ranks: distval <= 1/3 of HTA's time and of its "
          f"peak memory): time {dv_s:.1f} s / {hta_s:.1f} s = {dv_s / hta_s:.3f} ({'met' if t_ok else 'MISSED'}), "
          f"memory {dv_m:.0f} / {hta_m:.0f} MiB = {dv_m / hta_m:.3f} ({'met' if m_ok else 'MISSED'}) -> "
          f"{'met' if t_ok and m_ok else 'NOT met'}")
    return 0 if t_ok and m_ok else 1


if __name__ == "__main__":
    sys.exit(main())
