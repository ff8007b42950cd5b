"""distval's all_reduce busbw against a bare torch.distributed loop, side by side in one run.

Both sides time the same thing the same way: a barrier, then one blocking all_reduce of the same
buffer timed with perf_counter on every rank, the iteration's time being the max over ranks,
busbw from the p50 (nccl-tests' all_reduce factor 2(n-1)/n). The bare side calls dist.all_reduce
directly; the distval side issues the op exactly as `comm bench`'s timed loop does (the prepared
`Collective`, through the instrumented `Comm` layer), in a loop of this file's own so the two can
alternate op by op (and swap order every iteration): drift and noise from the rest of the machine
hit both alike. Local launch only (`--nproc`).

Gloo on a loaded 2-core host is very noisy (p5..p90 spans ~4x at 1 MiB), so small sizes get more
iterations, each ratio comes with a bootstrap 95% interval, and the wrapper's own cost per call
is also measured directly, on one-rank groups where the collective itself costs almost nothing:
the ratio it implies, t / (t + overhead), is the noise-free figure.

    python benchmarks/overhead_vs_bare.py --nproc 2 -b 1M -e 64M
    python benchmarks/overhead_vs_bare.py --nproc 2 -b 8 -e 64M --timing burst

`--timing burst` compares `comm bench`'s burst method (bench.burst_times: a barrier, then
--burst-ops back-to-back ops, per-op time = burst time / ops) with a bare burst loop of
dist.all_reduce timed the same way, burst for burst, alternating which side goes first.

Exit code 1 when, from 1 MiB up, the ratio implied by the measured per-call cost is below
--min-ratio, or a measured ratio's 95% interval lies wholly below it (on a quiet host, read the
point estimates too: the interval is wide where Gloo itself is noisy).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from distval.comm.bench import Clock, burst_times
from distval.comm.layer import Comm
from distval.comm.ops import Collective
from distval.device import synchronize
from distval.launch import LaunchOptions, run
from distval.rank import RankContext
from distval.units import format_size, parse_size


def iters_for(size: int, scale: float) -> int:
    return int(max(100, min(2000, scale * 2**31 / max(size, 1))))


def paired_times(ctx: RankContext, size: int, iters: int, warmup: int) -> torch.Tensor:
    count = size // 4
    coll = Collective(ctx.comm, "all_reduce", torch.float32, count, ctx.device, inplace=True)
    coll.fill(seed=1)
    x = coll.inp  # one buffer for both: Gloo's time depends on the buffer by up to +-25% here
    for _ in range(warmup):
        dist.all_reduce(x)
        coll()
    times = torch.empty(2, iters, dtype=torch.float64)
    for i in range(iters):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            ctx.comm.barrier()
            start = time.perf_counter()
            if side == 0:
                dist.all_reduce(x)
                synchronize(ctx.device)
            else:
                coll()
                synchronize(ctx.device)
            times[side, i] = time.perf_counter() - start
    return slowest(ctx, times)


def paired_bursts(ctx: RankContext, size: int, bursts: int, ops: int, warmup: int) -> torch.Tensor:
    """Per-op seconds of `bursts` pairs of bursts: [0] a bare loop of dist.all_reduce, [1]
    comm bench's burst method (bench.burst_times) over the prepared Collective."""
    coll = Collective(ctx.comm, "all_reduce", torch.float32, size // 4, ctx.device, inplace=True)
    coll.fill(seed=1)
    x = coll.inp
    for _ in range(warmup):
        dist.all_reduce(x)
        coll()
    clock = Clock(ctx.device)
    times = torch.empty(2, bursts, dtype=torch.float64)
    for i in range(bursts):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            if side == 0:
                ctx.control_comm.barrier()
                clock.start()
                for _ in range(ops):
                    dist.all_reduce(x)
                times[0, i] = clock.stop() / ops
            else:
                times[1, i] = burst_times(ctx, coll, ops, 1, clock=clock)[0]
    return slowest(ctx, times)


def slowest(ctx: RankContext, times: torch.Tensor) -> torch.Tensor:
    """Each iteration's time as its slowest rank's, reduced on the job's device (NCCL takes no CPU tensor)."""
    on_device = times.to(ctx.device)
    dist.all_reduce(on_device, op=dist.ReduceOp.MAX)
    return on_device.cpu()


def wrapper_overhead_s(ctx: RankContext, calls: int = 20000) -> float:
    """Median extra time of Comm.all_reduce over dist.all_reduce on a one-rank group."""
    groups = [dist.new_group([r]) for r in range(ctx.world_size)]  # every rank creates every group
    mine = groups[ctx.rank]
    comm = Comm(group=mine, name="self")
    t = torch.ones(1, device=ctx.device)
    diffs = np.empty(calls)
    for i in range(calls):
        start = time.perf_counter()
        dist.all_reduce(t, group=mine)
        mid = time.perf_counter()
        comm.all_reduce(t)
        diffs[i] = (time.perf_counter() - mid) - (mid - start)
    return float(np.median(diffs))


def rank_fn(ctx: RankContext, args: dict) -> dict:
    out = {"overhead_s": wrapper_overhead_s(ctx), "sizes": {}}
    for size in args["sizes"]:
        iters = iters_for(size, args["scale"])
        times = (paired_bursts(ctx, size, max(20, iters // args["burst_ops"]), args["burst_ops"], args["warmup"])
                 if args["timing"] == "burst" else paired_times(ctx, size, iters, args["warmup"]))
        out["sizes"][size] = {"bare": times[0].tolist(), "distval": times[1].tolist()}
    return out


def ratio_with_ci(
    bare: list[float], ours: list[float], rng: np.random.Generator, n_boot: int = 2000
) -> tuple[float, float, float]:
    """distval/bare busbw from p50 times, and a paired bootstrap 95% interval."""
    b, o = np.asarray(bare), np.asarray(ours)
    ratio = float(np.median(b) / np.median(o))
    idx = rng.integers(0, len(b), size=(n_boot, len(b)))
    boots = np.median(b[idx], axis=1) / np.median(o[idx], axis=1)
    return ratio, float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("-b", default="1M")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=float, default=2)
    p.add_argument("--scale", type=float, default=1.0, help="multiply the iteration counts")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-ratio", type=float, default=0.97)
    p.add_argument("--timing", choices=("blocking", "burst"), default="blocking")
    p.add_argument("--burst-ops", type=int, default=10, help="ops per burst (--timing burst)")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args()
    sizes, s = [], parse_size(a.b)
    while s <= parse_size(a.e):
        sizes.append(s)
        s = int(s * a.f)
    job = run(
        rank_fn, {"sizes": sizes, "warmup": a.warmup, "scale": a.scale, "timing": a.timing, "burst_ops": a.burst_ops},
        LaunchOptions(nproc=a.nproc, timeout_s=120)
    )
    res = job.results[0]
    overhead = max(r["overhead_s"] for r in job.results)
    factor = 2 * (job.world_size - 1) / job.world_size
    rng = np.random.default_rng(0)
    print(
        f"all_reduce float32, {job.world_size} ranks, backend {job.backend}, timing {a.timing}; "
        + ("paired iterations" if a.timing == "blocking" else f"paired bursts of {a.burst_ops} ops")
        + ", one buffer, order alternating"
    )
    print(f"distval's per-call cost (Comm over dist, one-rank group, median of 20000): {overhead * 1e6:.2f} us")
    print(f"{'size':>6} {'iters':>6} {'bare busbw':>11} {'distval':>9} {'ratio':>6} {'95% CI':>15} {'implied':>8}")
    rows, ok = [], True
    for size in sizes:
        r = res["sizes"][size]
        ratio, lo, hi = ratio_with_ci(r["bare"], r["distval"], rng)
        t_bare = float(np.median(r["bare"]))
        implied = t_bare / (t_bare + overhead)
        bare_bw = size / t_bare / 1e9 * factor
        rows.append(
            {
                "bytes": size,
                "iters": len(r["bare"]),
                "bare_busbw_gbps": bare_bw,
                "distval_busbw_gbps": bare_bw * ratio,
                "ratio": ratio,
                "ratio_ci95": [lo, hi],
                "implied_ratio": implied,
            }
        )
        if size >= 2**20 and (hi < a.min_ratio or implied < a.min_ratio):
            ok = False
        print(f"{format_size(size):>6} {len(r['bare']):>6} {bare_bw:>11.3f} {bare_bw * ratio:>9.3f} {ratio:>6.3f} "
              f"{f'[{lo:.3f}, {hi:.3f}]':>15} {implied:>8.4f}")
    print(f"busbw in GB/s (1e9). goal: ratio >= {a.min_ratio} from 1 MiB up -> {'met' if ok else 'NOT met'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"world_size": job.world_size, "overhead_us": overhead * 1e6, "rows": rows}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
