"""How much N ranks on fewer cores slow each other's compute, by the length of their bursts.

The planner slows every local rank's compute by the cores' share when the ranks' threads outnumber
the cores (3 ranks on 2: ×1.5; docs/plan.md "Step costs", `at_rank_speed`). zero3 on `tiny` at 3
ranks was measured below that (docs/results/2026-11-27-host-pace.md, "zero3 at 3 ranks"): its
compute comes in bursts of a millisecond or two between blocking collectives. This times the same
burst, a fixed count of 64×64 matmuls, on N ranks that meet in a 4-byte all_reduce after each
burst (as a strategy's ranks meet in its collectives), against the same burst on one rank alone,
for bursts of 0.5 to 20 ms; per burst length the median burst on the median rank and on the slowest rank, and the
median wait in the all_reduce, each over the one-rank figures.

    python benchmarks/burst_share.py                 # 3 ranks, one thread each
    python benchmarks/burst_share.py --nproc 2

About a minute; nothing else should run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

from distval.launch import LaunchOptions, run

BURSTS_MS = (0.5, 1, 2, 5, 10, 20)
REPS = 60  # bursts timed per length, after 5


def bursts(matmuls: int, reps: int, sync: bool) -> tuple[list[float], list[float]]:
    """(each burst's seconds, each wait's seconds) of `reps` bursts of `matmuls` matmuls."""
    a, b, one = torch.randn(64, 64), torch.randn(64, 64), torch.ones(1)
    took, waited = [], []
    for i in range(reps + 5):
        began = time.perf_counter()
        for _ in range(matmuls):
            torch.mm(a, b)
        done = time.perf_counter()
        if sync:
            dist.all_reduce(one)
        if i >= 5:
            took.append(done - began)
            waited.append(time.perf_counter() - done)
    return took, waited


def per_ms() -> int:
    """Matmuls in a millisecond on this rank alone."""
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(200):
            torch.mm(a, b)
        best = min(best, time.perf_counter() - began)
    return max(1, round(200 / (best * 1e3)))


def rank_fn(ctx, counts: list[int]) -> dict[int, tuple[float, float]]:
    torch.set_num_threads(1)
    out = {}
    for count in counts:
        dist.barrier()
        took, waited = bursts(count, REPS, sync=ctx.world_size > 1)
        out[count] = (statistics.median(took), statistics.median(waited))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    rate = per_ms()
    counts = [max(1, round(ms * rate)) for ms in BURSTS_MS]
    # one rank alone is a job of its own too: the launcher's agent beside it, as beside the N ranks
    alone = {c: took for c, (took, _) in run(rank_fn, counts, LaunchOptions(nproc=1, timeout_s=600)).results[0].items()}
    job = run(rank_fn, counts, LaunchOptions(nproc=args.nproc, timeout_s=600))
    print(f"{args.nproc} ranks, one thread each, meeting in a 4-byte all_reduce after each burst; ratios to one "
          "rank alone")
    print(" burst ms alone | median rank  slowest rank | wait ms (median rank)")
    for ms, c in zip(BURSTS_MS, counts):
        ranks = sorted(r[c][0] for r in job.results)
        wait = statistics.median(r[c][1] for r in job.results)
        print(f"{ms:9.1f} {alone[c] * 1e3:6.2f} | {statistics.median(ranks) / alone[c]:11.2f} "
              f"{ranks[-1] / alone[c]:13.2f} | {wait * 1e3:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
