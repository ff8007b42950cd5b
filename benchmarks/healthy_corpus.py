"""False alarms of `distval launch` on healthy scripts: a corpus of training scripts in the styles
people write (benchmarks/corpus/), each run many times under `distval launch --json`, and every
health finding in the reports counted. A healthy script must get none.

The corpus (each a standalone torch + torch.distributed script, Gloo on CPU, seeded, no
downloads, ranks from the environment as torchrun sets them, `--steps N --step-ms M`: the step's
length comes from real compute, the batch sized from a forward and backward timed at start):

  plain_ddp        its own DDP loop, the loss all-reduced by hand every step, rank 0 alone evaluating
                   every 50 steps and saving every 100 (a barrier after the save)
  fsdp2            fully_shard (FSDP2) on each block of a small transformer and the root, gradient
                   clipping, every rank evaluating, a DCP checkpoint every 100 steps
  grad_accum       DDP, 4 micro-batches a step, the first 3 under model.no_sync()
  closure          a Trainer: optimizer.step(closure), callbacks at on_train_batch_end (a logger
                   syncing a dict of metrics every 10 steps, validation every 50 with all_gather and
                   all_reduce, rank 0 saving every 100 with a barrier)
  wrapper          the optimizer stepped through a wrapper (clip_grad_norm_, skip on a non-finite
                   norm), an LR scheduler, DistributedSampler + DataLoader, set_epoch, epochs
  eval_every_rank  every rank evaluating its shard of the validation set every 50 steps, rank 0 logging

A finding is any check of the report that is not OK or SKIP (WARN, FAIL, ERROR: stragglers,
pauses, hangs, numerics, replicas, memory) and any row of its `health` table. Runs go one after
the other (the monitors are timing-sensitive), styles and step lengths interleaved, and each
style's runs alternate over the --nproc values. A run trains about --seconds of steps (a step
counted as 15 ms at least, which is what a 5 ms step costs on a 2-core host; and at least 90 steps:
the compute straggler rule skips 10 steps and needs its 50-step window to tip (25) and hold 50
steps and 8 s before it can fire, at step 85, so a 500 ms run trains 45 s), and is killed past
10x that plus 3 minutes. `--runs` runs of a style cycle over the step lengths and, in turn, the
rank counts.

    python benchmarks/healthy_corpus.py --runs 20 --nproc 2,3 --step-ms 5,50,500 --seconds 10 \\
        --out results.jsonl
    python benchmarks/healthy_corpus.py --table results.jsonl

One JSON line per run: style, nproc, step_ms, steps, exit_code, wall_s, step_ms_measured (the
slowest rank's median compute + wait per step, from the report's rank_health table), checks
(every check's status), findings (kind, status, summary, where) and, for a run with no report or a
non-zero exit, the tail of its stderr. `--table` prints one markdown row per style, nproc and step
length: runs, findings, runs with a finding, the kinds and texts of the findings, the median run
seconds and the median measured step.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"
STYLES = ("plain_ddp", "fsdp2", "grad_accum", "closure", "wrapper", "eval_every_rank")
QUIET = ("OK", "SKIP")
MIN_STEPS = 90
FLOOR_MS = 15.0  # a step asked for 5 ms trains at 10-20 ms here (2 cores, 2-3 ranks, Gloo and the hooks)


def steps_for(step_ms: float, seconds: float) -> int:
    """Steps for about `seconds` of training at `step_ms` a step (FLOOR_MS at least), and at least
    MIN_STEPS."""
    return max(MIN_STEPS, round(seconds * 1e3 / max(step_ms, FLOOR_MS)))


def findings(report: dict) -> list[dict]:
    """Every health finding of a `distval launch` report: the checks that are not OK or SKIP, and
    the rows of the `health` table (a finding of the monitors; it also makes a check, so a finding
    is listed once per check and once per row only where the row has no check of its own)."""
    found = [{"kind": c["name"], "status": c["status"], "summary": c["summary"], "where": c.get("where", {})}
             for c in report.get("checks", []) if c["status"] not in QUIET]
    summaries = {f["summary"] for f in found}
    for row in report.get("tables", {}).get("health", {}).get("rows", []):
        if row["summary"] not in summaries:
            found.append({"kind": row["kind"], "status": row["status"], "summary": row["summary"],
                          "where": {"ranks": row["ranks"], "step": row["step"]}})
    return found


def measured_step_ms(report: dict) -> float | None:
    """The slowest rank's median compute plus median wait per step (rank_health)."""
    rows = report.get("tables", {}).get("rank_health", {}).get("rows", [])
    times = [r["compute_ms"] + r["waiting_ms"] for r in rows
             if isinstance(r.get("compute_ms"), (int, float)) and isinstance(r.get("waiting_ms"), (int, float))]
    return round(max(times), 2) if times else None


def run_once(style: str, nproc: int, step_ms: float, steps: int, timeout_s: float,
             extra: tuple[str, ...] = ()) -> dict:
    """One launch of a corpus script under `distval launch --json`; its record."""
    with tempfile.TemporaryDirectory(prefix=f"corpus_{style}_") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "distval", "launch", "--nproc", str(nproc), "--json", str(out),
               str(CORPUS / f"{style}.py"), "--steps", str(steps), "--step-ms", f"{step_ms:g}", *extra]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "DISTVAL_FAULT"))}
        env["TMPDIR"] = tmp  # checkpoints, torch's elastic folders: gone with the run
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)  # its own process group: the ranks go with it
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                _, stderr = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                _, stderr = proc.communicate()
            code = "timeout"
        wall_s = time.monotonic() - started
        report = json.loads(out.read_text()) if out.exists() else {}
    record = {"style": style, "nproc": nproc, "step_ms": step_ms, "steps": steps, "exit_code": code,
              "wall_s": round(wall_s, 2), "step_ms_measured": measured_step_ms(report),
              "checks": {c["name"]: c["status"] for c in report.get("checks", [])}, "findings": findings(report)}
    if not report:
        record["findings"].append({"kind": "no report", "status": "ERROR", "summary": f"exit {code}, no report",
                                   "where": {}})
    if not report or code != 0:
        record["stderr_tail"] = stderr[-3000:]
    return record


def plan(styles: list[str], runs: int, nprocs: list[int], step_mss: list[float]) -> list[tuple[str, int, float]]:
    """(style, nproc, step_ms) in the order they run: `runs` runs of each style, run i of every
    style before run i+1 (load that drifts over the hours falls on every style alike); run i at
    step_mss[i % m] on nprocs[(i // m) % n], so the runs of a style cover every step length on
    every rank count."""
    m, n = len(step_mss), len(nprocs)
    return [(style, nprocs[(i // m) % n], step_mss[i % m]) for i in range(runs) for style in styles]


def table(records: list[dict]) -> str:
    """One markdown row per (style, nproc, step_ms), then the totals."""
    cells: dict[tuple, list[dict]] = collections.defaultdict(list)
    for r in records:
        cells[(r["style"], r["nproc"], r["step_ms"])].append(r)
    lines = ["| style | nproc | step ms (asked) | step ms (measured, median) | runs | findings | runs with findings "
             "| kinds | texts | median run s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (style, nproc, ms), rs in sorted(cells.items(), key=lambda kv: (STYLES.index(kv[0][0])
                                                                        if kv[0][0] in STYLES else 99, *kv[0][1:])):
        found = [f for r in rs for f in r["findings"]]
        kinds = collections.Counter(f"{f['kind']} {f['status']}" for f in found)
        texts = sorted({_cell(f["summary"])[:300] for f in found})
        measured = [r["step_ms_measured"] for r in rs if r["step_ms_measured"] is not None]
        step = round(statistics.median(measured), 1) if measured else "-"
        lines.append(f"| {style} | {nproc} | {ms:g} | {step} | {len(rs)} "
                     f"| {len(found)} | {sum(1 for r in rs if r['findings'])} "
                     f"| {', '.join(f'{k} ×{n}' for k, n in kinds.items()) or '-'} | {'<br>'.join(texts) or '-'} "
                     f"| {statistics.median(r['wall_s'] for r in rs):.1f} |")
    lines += ["", "| style | runs | findings |", "|---|---|---|"]
    for style in sorted({r["style"] for r in records}, key=lambda x: STYLES.index(x) if x in STYLES else 99):
        rs = [r for r in records if r["style"] == style]
        lines.append(f"| {style} | {len(rs)} | {sum(len(r['findings']) for r in rs)} |")
    total = sum(len(r["findings"]) for r in records)
    lines.append(f"\n{len(records)} runs, {total} findings, {sum(1 for r in records if r['findings'])} runs with a "
                 f"finding, {sum(1 for r in records if r['exit_code'] != 0)} non-zero exits")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--styles", default=",".join(STYLES), help=f"comma-separated, of {', '.join(STYLES)}")
    p.add_argument("--runs", type=int, default=20, help="runs of each style, over the step lengths and rank counts")
    p.add_argument("--nproc", default="2,3", help="rank counts the runs alternate over")
    p.add_argument("--step-ms", default="5,50,500", help="step lengths asked of the scripts")
    p.add_argument("--seconds", type=float, default=30.0, help="training time a run aims at (steps = this / step)")
    p.add_argument("--out", default="healthy_corpus.jsonl", help="JSON lines, appended as each run ends")
    p.add_argument("--table", metavar="JSONL", help="print the markdown table of saved runs and stop")
    args = p.parse_args()
    if args.table:
        print(table([json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()]))
        return
    styles = [s for s in args.styles.split(",") if s]
    unknown = [s for s in styles if s not in STYLES]
    if unknown:
        p.error(f"unknown style(s) {', '.join(unknown)}; known: {', '.join(STYLES)}")
    nprocs = [int(n) for n in args.nproc.split(",")]
    step_mss = [float(ms) for ms in args.step_ms.split(",")]
    todo = plan(styles, args.runs, nprocs, step_mss)
    records = []
    for i, (style, nproc, ms) in enumerate(todo, 1):
        steps = steps_for(ms, args.seconds)
        record = run_once(style, nproc, ms, steps, timeout_s=10 * steps * ms / 1e3 + 180)
        records.append(record)
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
        said = "; ".join(f"{f['kind']} {f['status']}: {f['summary'][:160]}" for f in record["findings"]) or "clean"
        print(f"[{i}/{len(todo)}] {style} nproc {nproc} {ms:g} ms x {steps}: exit {record['exit_code']}, "
              f"{record['wall_s']:.1f} s, step {record['step_ms_measured']} ms: {said}", flush=True)
    print(table(records))


if __name__ == "__main__":
    main()
