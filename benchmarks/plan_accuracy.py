"""Does the planner predict the step time of every strategy? `comm bench` → `compare --calibration`.

Per setting (ranks × model): a `comm bench` of all_reduce, all_gather and reduce_scatter (1K-16M,
x4) saved as JSON, then `distval compare --calibration` of the strategies below, whose reference
rank also measures each strategy's own costs on one rank (the plan's step costs). Repeated
`--repeats` times, each repeat a fresh bench and compare; per strategy the median over repeats of
measured p50 step time, the plan's prediction, their ratio, and per category (forward+backward,
optimizer, exposed communication) measured vs predicted. Goal (issue 28): measured/predicted in
0.8-1.25 for every strategy and setting. Prints a markdown table (docs/plan.md "How close").

Setting `2:tiny:emulated` (root): two emulated nodes joined by a `--rate` link (`distval emulate`,
one rank each). `compare` does not run under an outer launcher, so there each strategy trains on
its own (`emulate -- train --json`), the bench runs across the nodes (`emulate -- comm bench`),
and the prediction is compare's own (`predicted_step`) with the step costs of a local 2-rank
compare on this host (the same ranks' work, measured on one rank).

    python benchmarks/plan_accuracy.py                       # 2 and 3 ranks, tiny and small
    python benchmarks/plan_accuracy.py --settings 2:tiny --repeats 1 --steps 20
    python benchmarks/plan_accuracy.py --settings 2:tiny:emulated --rate 1gbit

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


def emulated(model: str, steps: int, rate: str, folder: Path, tag: str) -> list[dict]:
    """The strategies trained across two emulated nodes, each row as compare's strategies table
    has it (measured columns from the steps, predicted ones from compare's own predicted_step)."""
    from distval.plan import presets
    from distval.plan.calibration import load, save_costs
    from distval.train.compare import predicted_step
    from distval.train.config import TrainConfig
    from distval.train.model import build_model

    one(2, model, steps, folder, f"{tag}-local")  # its bench file now holds the step costs
    costs = json.loads((folder / f"bench-{tag}-local.json").read_text())["tables"]["step_costs"]
    bench = folder / f"bench-{tag}.json"
    emulate = ("emulate", "--nodes", "2", "--nproc-per-node", "1", "--rate", rate, "--")
    distval(*emulate, "comm", "bench", "--ops", "all_reduce,all_gather,reduce_scatter", "-b", "1K", "-e", "16M",
            "-f", "4", "-n", "20", "-w", "5", "--json", str(bench))
    save_costs(str(bench), costs)
    tensors = sum(1 for p in build_model(presets.model(model), seed=0).parameters() if p.requires_grad)
    rows = []
    for name in STRATEGIES:
        out = folder / f"train-{tag}-{name}.json"
        distval(*emulate, "train", "--model", model, "--strategy", name, "--steps", str(steps), "--json", str(out))
        measured = json.loads(out.read_text())["tables"]["steps"]["rows"][1:]
        cost = next(c for c in load(str(bench)).costs if c.strategy == name)
        row = {"strategy": name, **{f"measured_{k}": statistics.median(r[col] for r in measured) for k, col in (
            ("optimizer_s", "optimizer_s"), ("exposed_comm_s", "comm_blocked_s"))}}
        row["step_time_p50_s"] = statistics.median(r["step_time_s"] for r in measured)
        counted = any(r["comm_calls"] for r in measured)  # fsdp2's collectives are torch's own
        row["measured_compute_s"] = statistics.median(r["step_time_s"] - r["comm_blocked_s"] - r["optimizer_s"]
                                                      for r in measured) if counted else None
        if not counted:
            row["measured_exposed_comm_s"] = None
        row.update(predicted_step(TrainConfig(model=model, strategy=name), name, 2, cost, str(bench), tensors))
        rows.append(row)
    return rows


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="2:tiny,3:tiny,2:small,3:small", help="ranks:model, comma-separated")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--keep", help="keep the bench and compare JSON files in this folder")
    p.add_argument("--rate", default="1gbit", help="the emulated link (tc rate)")
    args = p.parse_args()
    lines = ["| ranks | model | strategy | measured ms | plan ms | ratio | compute ms (meas/plan) | optimizer ms | "
             "exposed comm ms | largest error |", "|---|---|---|---|---|---|---|---|---|---|"]
    misses = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for setting in args.settings.split(","):
            nproc, model, *how = setting.split(":")
            if how == ["emulated"]:
                runs = [emulated(model, args.steps, args.rate, folder, f"emu-{model}-{i}") for i in range(args.repeats)]
                nproc = f"2 nodes, {args.rate}"
            else:
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
