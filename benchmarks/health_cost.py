"""What the training health monitor costs per step (health/monitor.py), on `small` by default.

Per step every rank gives its figures to one all_gather (it replaced the step's two all_reduces,
so it is no extra collective); rank 0 runs the detectors; every K steps every rank checksums its
parameters and gathers the checksums. The loop times all of that outside the step and reports it
per step (`health_s`, replica checks included in the step they ran after). Printed: the mean
monitor time per step against the mean step time (goal: <= 3%), with K = --every.

    python benchmarks/health_cost.py --model small --steps 30 --every 10
"""

from __future__ import annotations

import argparse
import statistics

from distval.health.monitor import HealthConfig
from distval.launch import LaunchOptions, run
from distval.train.config import TrainConfig
from distval.train.loop import train_rank


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", default="small")
    p.add_argument("--strategy", default="pytorch_ddp")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=10)
    args = p.parse_args()
    cfg = TrainConfig(model=args.model, strategy=args.strategy, steps=args.steps, peak_flops=1e12,
                      health=HealthConfig(replicas_every=args.every))
    steps = run(train_rank, cfg, LaunchOptions(nproc=args.nproc, timeout_s=600, hang=None)).results[0]["steps"][2:]
    step_s = statistics.mean(s["step_time_s"] for s in steps)
    health_s = statistics.mean(s["health_s"] for s in steps)
    checks = [s["health_s"] for s in steps if (s["step"] + 1) % args.every == 0]
    print(f"{args.model}, {args.nproc} ranks, {args.strategy}, {len(steps)} steps (the first 2 left out), replica "
          f"check every {args.every}")
    print(f"  step time, mean           {step_s * 1e3:9.2f} ms")
    print(f"  monitor per step, mean    {health_s * 1e3:9.3f} ms   (detectors on rank 0; replica checks amortised)")
    if checks:
        print(f"  a step with a replica check: {statistics.median(checks) * 1e3:.2f} ms of monitor time (median)")
    print(f"  cost: {health_s / step_s:.2%} of the step time (goal <= 3%)")


if __name__ == "__main__":
    main()
