"""`distval diagnose` side by side with PyTorch's own Flight Recorder analyzer (`python -m
torch.distributed.flight_recorder.fr_trace`) on the real dumps of tests/data/frdumps, then on
1,024 ranks' dumps made from real ones: what each names, and its time and peak memory.

    python benchmarks/diagnose_vs_fr_trace.py [--ranks 1024] [--repeats 3]

The analyzer stops on Gloo dumps (their default group is named '' in pg_config, '0' in the
entries: KeyError ('0', 1)); it is also run on the same dumps in the form an NCCL job writes
(the default group named '0' throughout), and the table says which form it read. Each tool runs
as its own process (python, the imports, reading, analysing, printing), timed from outside;
peak memory is the process's maximum RSS (getrusage of the child).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DUMPS = Path(__file__).resolve().parents[1] / "tests" / "data" / "frdumps"
CASES = ("skip", "size", "dtype", "stop", "mesh")


def run(cmd: list[str]) -> tuple[float, str, int]:
    """(wall s, output, exit code) of one command, as its own process."""
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    return time.perf_counter() - start, res.stdout + res.stderr, res.returncode


def nccl_form(src: Path, dst: Path) -> None:
    """The dumps as an NCCL job writes them: every group of the entries in pg_config, under its
    name with its ranks (a Gloo dump lists the default group only, named '', and no sub-group)."""
    docs = {f.name: pickle.loads(f.read_bytes()) for f in src.iterdir()}
    ranks: dict[str, set[int]] = {}
    for name, doc in docs.items():
        for e in doc["entries"]:
            ranks.setdefault(e["process_group"][0], set()).add(int(name.removeprefix("rank")))
    dst.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        mine = {e["process_group"] for e in doc["entries"]}
        doc["pg_config"] = {pg: {"name": pg, "desc": desc, "ranks": str(sorted(ranks[pg]))} for pg, desc in mine}
        (dst / name).write_bytes(pickle.dumps(doc))


def fr_trace(folder: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder), "--allow-incomplete-ranks"]


def distval(folder: Path, report: Path) -> list[str]:
    """diagnose with its terminal report (timed, as the analyzer's printing is) and the JSON one,
    which `distval_says` reads."""
    return [sys.executable, "-m", "distval", "diagnose", str(folder), "--json", str(report)]


def fr_says(out: str, code: int) -> str:
    """The analyzer's first finding, as it printed it: the collective, and the ranks it names
    (its "missing ranks" or "Culprit rank")."""
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if code != 0:
        return f"stops: {lines[-1][:90]}" if lines else f"exit {code}"
    first = next((i for i, line in enumerate(lines) if "sequence number" in line or "cannot decide" in line), None)
    if first is None:
        return "no finding"
    said = [lines[first]]
    for line in lines[first + 1:first + 14]:
        if line.startswith("missing ranks:") or line.startswith("error msg:"):
            said.append(line[:110])
    return "; ".join(said)


def distval_says(report: Path) -> str:
    """The verdict's summary, from the report `distval` wrote (--json)."""
    doc = json.loads(report.read_text())
    verdict = next(c for c in doc["checks"] if c["name"] == "diagnose verdict")
    return f"{verdict['status']}: {verdict['summary'][:140]}"


def scaled(src: Path, dst: Path, ranks: int) -> None:
    """`ranks` dumps from the 3-rank `skip` case: ranks 0..N-2 as its rank 0 (waiting), N-1 as its
    rank 2 (which skipped the last collective), every group's ranks widened to the N."""
    dst.mkdir(parents=True, exist_ok=True)
    waiting, culprit = (pickle.loads((src / f"rank{r}").read_bytes()) for r in (0, 2))
    for doc in (waiting, culprit):
        for g in doc["pg_config"].values():
            if len(ast.literal_eval(g["ranks"])) == 3:
                g["ranks"] = str(list(range(ranks)))
    for r in range(ranks):
        (dst / f"rank{r}").write_bytes(pickle.dumps(culprit if r == ranks - 1 else waiting))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="frdumps-"))
    try:
        print("| case | PyTorch's analyzer (fr_trace) | on | distval diagnose |")
        print("|---|---|---|---|")
        for case in CASES:
            _, out, code = run(fr_trace(DUMPS / case))
            form = "Gloo dumps"
            if code != 0:
                nccl_form(DUMPS / case, work / case)
                _, out, code = run(fr_trace(work / case))
                form = "NCCL form"
            run(distval(DUMPS / case, work / f"{case}.json"))  # the Gloo dumps themselves
            print(f"| {case} | {fr_says(out, code)} | {form} | {distval_says(work / f'{case}.json')} |")
        big = work / f"scaled{args.ranks}"
        nccl_form(DUMPS / "skip", work / "skip_nccl")
        scaled(work / "skip_nccl", big, args.ranks)
        times: dict[str, list[float]] = {"fr_trace": [], "distval": []}
        peaks: dict[str, float] = {}
        says: dict[str, str] = {}
        for _ in range(args.repeats):  # alternating, each its own process
            for name, cmd in (("fr_trace", fr_trace(big)), ("distval", distval(big, work / "big.json"))):
                wall, out, code = run(cmd)
                times[name].append(wall)
                says[name] = fr_says(out, code) if name == "fr_trace" else distval_says(work / "big.json")
        for name, cmd in (("fr_trace", fr_trace(big)), ("distval", distval(big, work / "big.json"))):
            peaks[name] = _peak(cmd)
        print(f"\n{args.ranks} ranks' dumps ({sum(f.stat().st_size for f in big.iterdir()) / 2**20:.1f} MiB), "
              f"median of {args.repeats}:")
        print("| tool | wall s | peak RSS MiB | names |")
        print("|---|---|---|---|")
        for name in ("fr_trace", "distval"):
            print(f"| {name} | {statistics.median(times[name]):.2f} | {peaks[name]:.0f} | {says[name]} |")
        ratio = statistics.median(times["distval"]) / statistics.median(times["fr_trace"])
        print(f"\ndistval / fr_trace: time {ratio:.2f}, memory {peaks['distval'] / peaks['fr_trace']:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _peak(cmd: list[str]) -> float:
    """The peak RSS (MiB) of one run of `cmd`, in a fresh process that starts only it (the
    children's maximum RSS is the largest of any child so far)."""
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True, env=os.environ)
    return int(out.stdout.strip().splitlines()[-1]) / 1024


if __name__ == "__main__":
    main()
