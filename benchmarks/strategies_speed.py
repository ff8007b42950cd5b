"""Step time (and model state per rank) of each strategy on the `small` preset, side by side in one run.

All strategies train in the same worker processes one after the other (same machine state, one
start-up), each for --steps optimizer steps; the first two steps are warm-up and excluded.
Prints step time p50 (max over ranks), tokens/s, collectives per step, the bytes each rank sends,
the share of communication hidden behind compute, the model state the largest rank holds against
the strategy's formula, and bucket_ddp_async's step time relative to pytorch_ddp (goal: within
5%).

    python benchmarks/strategies_speed.py --nproc 2 --model small --steps 12
    python benchmarks/strategies_speed.py --strategies zero1,zero2,zero3,pytorch_zero1,fsdp2,pytorch_ddp
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

from distval import strategies
from distval.launch import LaunchOptions, run
from distval.rank import RankContext
from distval.strategies.base import StrategyConfig
from distval.train.config import TrainConfig
from distval.train.loop import train_rank


def all_strategies(ctx: RankContext, args: tuple[TrainConfig, list[str]]) -> dict:
    cfg, names = args
    return {name: train_rank(ctx, dataclasses.replace(cfg, strategy=name)) for name in names}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", default="small")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--strategies", default=",".join(strategies.DDP_FAMILY))
    a = p.parse_args()
    names = a.strategies.split(",")
    cfg = TrainConfig(model=a.model, steps=a.steps, micro_batch=a.micro_batch, grad_accum=a.grad_accum,
                      strategy_cfg=StrategyConfig(bucket_mb=a.bucket_mb), peak_flops=1e12)
    job = run(all_strategies, (cfg, names), LaunchOptions(nproc=a.nproc, timeout_s=300))
    res = job.results[0]
    print(
        f"{a.model}, {job.world_size} ranks ({job.backend}), micro-batch {a.micro_batch}, accumulation {a.grad_accum}, "
        f"{a.steps} steps (first 2 excluded), bucket cap {a.bucket_mb:g} MB"
    )
    print(f"{'strategy':<18} {'step p50 ms':>12} {'tokens/s':>10} {'calls/step':>11} {'wire MB':>8} {'hidden':>7} "
          f"{'state MiB':>10} {'formula':>8}")
    p50 = {}
    for name in names:
        r = res[name]
        steps = r["steps"][2:]
        p50[name] = statistics.median(s["step_time_s"] for s in steps)
        comm = sum(s["comm_time_s"] for s in steps)
        blocked = sum(s["comm_blocked_s"] for s in steps)
        hidden = "—" if comm == 0 else f"{max(0.0, 1 - blocked / comm):.0%}"
        print(f"{name:<18} {p50[name] * 1e3:>12.1f} {statistics.median(s['tokens_per_s'] for s in steps):>10,.0f} "
              f"{statistics.median(s['comm_calls'] for s in steps):>11g} "
              f"{statistics.median(s['comm_wire_bytes'] for s in steps) / 1e6:>8.1f} {hidden:>7} "
              f"{steps[-1]['model_state_bytes'] / 2**20:>10.1f} {r['expected_model_state_bytes'] / 2**20:>8.1f}")
    if "bucket_ddp_async" in p50 and "pytorch_ddp" in p50:
        ratio = p50["bucket_ddp_async"] / p50["pytorch_ddp"]
        print(f"bucket_ddp_async / pytorch_ddp step time: {ratio:.3f} (goal <= 1.05)")
        return 0 if ratio <= 1.05 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
