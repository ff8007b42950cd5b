"""Does the planner predict the step time of every strategy? `comm bench` → `compare --calibration`.

Per setting (ranks × model): a `comm bench` of all_reduce, all_gather and reduce_scatter (1K-16M,
x4) saved as JSON, then `distval compare --calibration` of the strategies below, whose reference
rank also measures each strategy's own costs on one rank (the plan's step costs). Repeated
`--repeats` times, each repeat a fresh bench and compare; per strategy the median over repeats of
measured p50 step time, the plan's prediction, their ratio, and per category (forward+backward,
optimizer, exposed communication) measured vs predicted. Goal (issue 28): measured/predicted in
0.8-1.25 for every strategy and setting. Prints a markdown table (docs/plan.md "How close").

    python benchmarks/plan_accuracy.py                       # 2 and 3 ranks, tiny and small
    python benchmarks/plan_accuracy.py --settings 2:tiny --repeats 1 --steps 20

Long (about 3 minutes per setting and repeat on the 2-core host); nothing else should run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STRATEGIES = ("pytorch_ddp", "bucket_ddp_async", "simple_ddp", "zero1", "zero2", "zero3", "fsdp2")
CATEGORIES = (("compute", "measured_compute_s", "predicted_compute_s"),
              ("optimizer", "measured_optimizer_s", "predicted_optimizer_s"),
              ("exposed comm", "measured_exposed_comm_s", "predicted_exposed_comm_s"))


def distval(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "distval", *args], capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: a WARN or FAIL in the report, still a report
        sys.exit(f"distval {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")


def one(nproc: int, model: str, steps: int, folder: Path, tag: str) -> list[dict]:
    bench, report = folder / f"bench-{tag}.json", folder / f"compare-{tag}.json"
    distval("comm", "bench", "--nproc", str(nproc), "--ops", "all_reduce,all_gather,reduce_scatter", "-b", "1K",
            "-e", "16M", "-f", "4", "-n", "20", "-w", "5", "--json", str(bench))
    distval("compare", "--nproc", str(nproc), "--model", model, "--steps", str(steps), "--strategies",
            ",".join(STRATEGIES), "--calibration", str(bench), "--json", str(report))
    return json.loads(report.read_text())["tables"]["strategies"]["rows"]


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="2:tiny,3:tiny,2:small,3:small", help="ranks:model, comma-separated")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--keep", help="keep the bench and compare JSON files in this folder")
    args = p.parse_args()
    lines = ["| ranks | model | strategy | measured ms | plan ms | ratio | compute ms (meas/plan) | optimizer ms | "
             "exposed comm ms | largest error |", "|---|---|---|---|---|---|---|---|---|---|"]
    misses = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for setting in args.settings.split(","):
            nproc, model = setting.split(":")
            runs = [one(int(nproc), model, args.steps, folder, f"{nproc}-{model}-{i}") for i in range(args.repeats)]
            for name in STRATEGIES:
                rows = [r for run in runs for r in run if r["strategy"] == name and r["predicted_step_time_s"]]
                if not rows:
                    continue

                def med(key: str) -> float | None:
                    values = [r[key] for r in rows if r[key] is not None]
                    return statistics.median(values) if values else None

                ratio = statistics.median(r["step_time_p50_s"] / r["predicted_step_time_s"] for r in rows)
                errors = {label: abs(med(m) - med(pr)) for label, m, pr in CATEGORIES
                          if med(m) is not None and med(pr) is not None}
                if med("measured_compute_s") is None:  # fsdp2: forward+backward and its collectives are one figure
                    errors["compute+comm (unsplit)"] = abs((med("step_time_p50_s") - med("measured_optimizer_s"))
                                                           - (med("predicted_step_time_s") - med("predicted_optimizer_s")))
                largest = max(errors, key=errors.__getitem__)
                ok = 0.8 <= ratio <= 1.25
                misses += not ok
                cats = " | ".join(f"{ms(med(m))} / {ms(med(pr))}" for _, m, pr in CATEGORIES)
                lines.append(f"| {nproc} | {model} | {name} | {ms(med('step_time_p50_s'))} | "
                             f"{ms(med('predicted_step_time_s'))} | {'' if ok else '**'}{ratio:.2f}{'' if ok else '**'}"
                             f" | {cats} | {largest} |")
            print("\n".join(lines[-len(STRATEGIES):]), flush=True)
    print("\n" + "\n".join(lines))
    print(f"\n{misses} strategy/setting pairs outside 0.8-1.25 (median of {args.repeats} repeats, {args.steps} steps)")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
