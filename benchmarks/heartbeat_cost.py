"""What the hang watchdog costs and how fast it names a hang.

1. Cost: `train_rank` on the `small` preset with the heartbeat and the Flight Recorder on
   (distval's default) and off (`--hang-after off`), alternating runs in fresh workers; the
   median step time of each (first two steps excluded) and their ratio (goal: <= 1% slower).
2. Time to verdict: `distval train --model tiny` with a stopped, a spinning and a skipping rank,
   a rank killed inside a collective and one all_reduce issued in another shape (--hang-after at
   its default, 8 s); per fault the seconds from the last progress (a mismatch: from its
   collective) to the verdict, stacks included (details.diagnosed_s; a killed rank is named by
   the launcher that saw it die, without that figure), and the wall time of the whole job.

    python benchmarks/heartbeat_cost.py --nproc 2 --model small --steps 20 --repeats 3
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

from distval.health.config import HangPolicy
from distval.launch import LaunchOptions, run
from distval.train.config import TrainConfig
from distval.train.loop import train_rank

FAULTS = {"stopped rank": "step=25,rank=1,action=stop", "spinning rank": "step=25,rank=1,action=spin",
          "skipped collective": "op=all_reduce,rank=1,action=skip,nth=600",
          "killed in collective": "step=25,rank=1,action=kill_in_op",
          "reshaped all_reduce": "step=25,rank=1,action=reshape"}


def step_time(cfg: TrainConfig, nproc: int, watchdog: bool) -> float:
    opts = LaunchOptions(nproc=nproc, timeout_s=300, hang=HangPolicy() if watchdog else None)
    steps = run(train_rank, cfg, opts).results[0]["steps"][2:]
    return statistics.median(s["step_time_s"] for s in steps)


def cost(args: argparse.Namespace) -> None:
    cfg = TrainConfig(model=args.model, strategy=args.strategy, steps=args.steps, peak_flops=1e12)
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.repeats):
        for watchdog in (False, True):
            times[watchdog].append(step_time(cfg, args.nproc, watchdog))
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"{args.model}, {args.nproc} ranks, {args.strategy}, {args.steps} steps x {args.repeats} runs each, alternating"
    )
    print(
        f"  step time p50, heartbeat off  {off * 1e3:8.1f} ms   "
        f"runs: {', '.join(f'{t * 1e3:.1f}' for t in times[False])}"
    )
    print(
        f"  step time p50, heartbeat on   {on * 1e3:8.1f} ms   "
        f"runs: {', '.join(f'{t * 1e3:.1f}' for t in times[True])}"
    )
    print(f"  cost: {(on / off - 1):+.2%} of the step time (goal <= 1%)")


def verdicts(args: argparse.Namespace) -> None:
    print(f"time to verdict, distval train --model tiny --nproc {args.nproc}, --hang-after 8s (default)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTVAL_FAULT", "RANK", "MASTER_"))}
    with tempfile.TemporaryDirectory() as tmp:
        for name, fault in FAULTS.items():
            out = os.path.join(tmp, "t.json")
            started = time.monotonic()
            subprocess.run([sys.executable, "-m", "distval", "train", "--nproc", str(args.nproc), "--model", "tiny",
                            "--strategy", "simple_ddp", "--steps", "3000", "--json", out],
                           env={**env, "DISTVAL_FAULT": fault}, capture_output=True, timeout=300)
            wall = time.monotonic() - started
            check = next(c for c in json.load(open(out))["checks"] if c["status"] in ("ERROR", "FAIL"))
            how = check["details"].get("hang") or check["summary"].split("failed: ")[-1][:30]
            print(f"  {name:<20} rank {check['where'].get('rank')} named ({how}), "
                  f"{check['details'].get('diagnosed_s', '-')} s from the fault's last progress (a mismatch: its "
                  f"collective) to the verdict; job {wall:.1f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", default="small")
    p.add_argument("--strategy", default="pytorch_ddp")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-verdicts", action="store_true")
    args = p.parse_args()
    cost(args)
    if not args.skip_verdicts:
        verdicts(args)


if __name__ == "__main__":
    main()
