"""Precision and recall of the straggler detector (health/monitor.py) in real `distval train`
jobs: one rank's compute stretched by 10%, 20%, 50%, 100% and 200% from step `--fault-step`
(the `slow` fault), and clean runs, on 2 and 3 ranks, several seeds.

Per slowdown: recall = runs whose slowed rank was named / runs; precision = findings naming the
slowed rank / all straggler findings (clean runs: every finding is a false positive); steps to
detection = the step the finding was raised at minus the fault step (median); the onset error =
the "since" step minus the fault step (median). Runs go one after the other (no timing overlap).

    python benchmarks/straggler_detection.py --models tiny --seeds 3 --steps 200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SLOWDOWNS = (0, 10, 20, 50, 100, 200)


def med(xs: list) -> str:
    return f"{statistics.median(xs):g}" if xs else "-"


def run(model: str, nproc: int, seed: int, steps: int, percent: int, fault_step: int, out: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTVAL_FAULT", "RANK", "MASTER_"))}
    if percent:
        env["DISTVAL_FAULT"] = f"step={fault_step},rank={nproc - 1},action=slow,percent={percent}"
    subprocess.run([sys.executable, "-m", "distval", "train", "--nproc", str(nproc), "--model", model, "--strategy",
                    "simple_ddp", "--steps", str(steps), "--seed", str(seed), "--check-replicas-every", "0", "--json",
                    out], env=env, capture_output=True, timeout=1800, check=False)
    doc = json.load(open(out))
    rows = [c for c in doc["checks"] if c["name"] == "health stragglers" and c["status"] == "WARN"]
    return [{"rank": c["where"]["rank"], "since": c["where"]["step"], "detected": c["details"].get("detected_step"),
             "slowdown": c["details"].get("slowdown")} for c in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny")
    p.add_argument("--worlds", default="2,3")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed+seeds-1")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--fault-step", type=int, default=50)
    args = p.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            print(f"{model}: {args.steps} steps, slowed rank = the last, from step {args.fault_step}; "
                  f"worlds {args.worlds}, seeds {args.first_seed}..{args.first_seed + args.seeds - 1}")
            print(f"  {'slowdown':>8} {'runs':>5} {'recall':>7} {'precision':>9} {'steps to detect':>16} "
                  f"{'onset error':>12} {'measured x':>11}")
            for percent in SLOWDOWNS:
                runs = found = true = named = 0
                delays, onsets, measured = [], [], []
                for nproc in map(int, args.worlds.split(",")):
                    for seed in range(args.first_seed, args.first_seed + args.seeds):
                        findings = run(model, nproc, seed, args.steps, percent, args.fault_step,
                                       os.path.join(tmp, "r.json"))
                        runs += 1
                        found += len(findings)
                        mine = [f for f in findings if f["rank"] == nproc - 1] if percent else []
                        true += len(mine)
                        named += bool(mine)
                        for f in mine[:1]:
                            delays.append(f["detected"] - args.fault_step)
                            onsets.append(f["since"] - args.fault_step)
                            measured.append(f["slowdown"])
                recall = f"{named / runs:.2f}" if percent else "-"
                precision = f"{true / found:.2f}" if found else ("1.00" if percent else "-")
                print(f"  {str(percent) + '%' if percent else 'clean':>8} {runs:>5} {recall:>7} {precision:>9} "
                      f"{med(delays):>16} {med(onsets):>12} {med(measured):>11}"
                      + (f"   false positives: {found}" if not percent else ""))
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
