"""Does `comm pairs` name the bad node and nothing else, and does `scale` meet the planner?

  pairs   emulated 4-node clusters (1 rank each, 1 gbit, root): uniform; node 2's link at 250mbit;
          node 1 held to a quarter of a core (`--cpu`). Each `--repeats` times; per scenario the
          runs whose findings are exactly the expected ones, and each run's seconds.
  scale   `distval scale` on 1, 2, 3 local ranks (each point a launch, its own bench and probe),
          and on 1, 2, 4 emulated nodes over 1 gbit (one `emulate -- scale` job per node count,
          joined with `scale --join`), `--repeats` times; per world size the median of measured
          and planned efficiency, their ratio, and the `gap` of the median run.

    sudo python benchmarks/scaling.py pairs --repeats 10
    sudo python benchmarks/scaling.py scale --repeats 3 --model tiny --steps 60

Prints markdown tables (docs/scaling.md "Figures"). Long: nothing else should run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCENARIOS = {  # name: (emulate flags, the findings that must be named, and nothing else)
    "uniform": (["--rate", "1gbit"], []),
    "node 2 link at 250mbit": (["--rate", "1gbit,1gbit,250mbit,1gbit"], ["comm.pairs node 2 link"]),
    "node 1 at 0.25 core": (["--rate", "1gbit", "--cpu", "2,0.25,2,2"], ["comm.pairs node 1 compute"]),
}


def distval(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distval", *args], capture_output=True, text=True, timeout=timeout)


def named(doc: dict) -> list[str]:
    return [c["name"] for c in doc["checks"] if c["status"] != "OK"]


def bench_pairs(repeats: int, folder: Path) -> None:
    print("| cluster | runs | exactly the expected findings | other findings seen | seconds (median, max) |")
    print("|---|---|---|---|---|")
    for k, (name, (flags, expected)) in enumerate(SCENARIOS.items()):
        right, others, seconds = 0, [], []
        for i in range(repeats):
            out = folder / f"pairs-{k}-{i}.json"
            began = time.monotonic()
            done = distval("emulate", "--nodes", "4", *flags, "--", "comm", "pairs", "--json", str(out))
            seconds.append(time.monotonic() - began)
            if not out.exists():
                sys.exit(f"emulate -- comm pairs failed ({done.returncode}):\n{done.stderr[-3000:]}")
            found = named(json.loads(out.read_text()))
            right += found == expected
            others += [f for f in found if f not in expected]
        print(f"| {name} | {repeats} | {right} of {repeats} | {', '.join(sorted(set(others))) or '-'} | "
              f"{statistics.median(seconds):.1f}, {max(seconds):.1f} |", flush=True)


def scale_local(model: str, steps: int, folder: Path, i: int) -> dict:
    out = folder / f"local-{i}.json"
    done = distval("scale", "--nproc", "3", "--worlds", "1,2,3", "--model", model, "--steps", str(steps),
                   "--json", str(out))
    if not out.exists():
        sys.exit(f"scale failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def scale_emulated(model: str, steps: int, folder: Path, i: int) -> dict:
    points = []
    for nodes in (1, 2, 4):
        out = folder / f"emu-{i}-{nodes}.json"
        done = distval("emulate", "--nodes", str(nodes), "--rate", "1gbit", "--", "scale", "--model", model,
                       "--steps", str(steps), "--json", str(out))
        if not out.exists():
            sys.exit(f"emulate -- scale failed ({done.returncode}):\n{done.stderr[-3000:]}")
        points.append(str(out))
    out = folder / f"emu-{i}.json"
    done = distval("scale", "--join", ",".join(points), "--model", model, "--json", str(out))
    if not out.exists():
        sys.exit(f"scale --join failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def scale_table(title: str, docs: list[dict]) -> None:
    rows = [d["tables"]["scaling"]["rows"] for d in docs]
    print(f"\n{title}\n")
    print("| world | nodes | measured efficiency (median; runs) | planned (median) | measured / planned | "
          "ranks outnumber cores | gap (median run) |")
    print("|---|---|---|---|---|---|---|")
    for k, first in enumerate(rows[0]):
        runs = [r[k] for r in rows]
        measured = statistics.median(r["efficiency"] for r in runs)
        planned = [r["planned_efficiency"] for r in runs if r["planned_efficiency"] is not None]
        plan = statistics.median(planned) if planned else None
        median_run = sorted(runs, key=lambda r: r["efficiency"])[len(runs) // 2]
        ratio = f"{measured / plan:.2f}" if plan else "-"
        each = ", ".join(f"{r['efficiency']:.2f}" for r in runs)
        print(f"| {first['world_size']} | {first['nodes']} | {measured:.2f} ({each}) | "
              f"{'-' if plan is None else f'{plan:.2f}'} | {ratio} | {'yes' if first['oversubscribed'] else 'no'} | "
              f"{median_run['gap'] or '-'} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("pairs", "scale"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--keep", type=Path, help="Keep the reports in this folder.")
    parser.add_argument("--no-emulated", action="store_true", help="scale: local points only.")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="distval-scaling-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.what == "pairs":
        bench_pairs(args.repeats, folder)
        return 0
    scale_table(f"local ranks, {args.model}, {args.steps} steps",
                [scale_local(args.model, args.steps, folder, i) for i in range(args.repeats)])
    if not args.no_emulated:
        scale_table(f"emulated nodes over 1 gbit, {args.model}, {args.steps} steps",
                    [scale_emulated(args.model, args.steps, folder, i) for i in range(args.repeats)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
