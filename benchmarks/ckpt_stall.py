"""Checkpoint cost on the `small` preset, side by side in one run: how long training stalls for an
async save against a synchronous save, and how long recovery takes after a rank is killed.

Stall: in the same worker processes (after one warm-up run), interleaved `--repeats` times, three
otherwise identical runs of `--steps` steps: no checkpoints, sync saves every `--every` steps,
async saves every `--every` steps. Per save (medians over repeats):
  sync save time          the time the training thread spends in save(): snapshot, serialize,
                          SHA-256, write + fsync, agreement, commit
  async stall, blocking   the time the training thread spends in save(): the snapshot copy (and
                          waiting for a previous save still in flight)
  async stall, total      blocking + how much longer the steps of the async run took than the
                          steps of the run without checkpoints (the background writer competes
                          for the same cores), per save; the last save (after the last step) is
                          excluded as it slows no step
Goal: async stall ≤ 15% of the sync save time.

Recovery: `--kills` jobs with --max-restarts 1 where rank 1 is SIGKILLed at the start of step
`--kill-step`; recovery = from that step's start in the failed attempt (the kill) to the end of the
first step of the restarted attempt (detection, stopping and restarting every worker, rendezvous,
loading the checkpoint, one step). Median over kills.

    python benchmarks/ckpt_stall.py --model small --nproc 2 --steps 12 --every 3 --repeats 3 --kills 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch.distributed as dist

from distval.ckpt.checkpointer import run_id
from distval.ckpt.config import CheckpointConfig
from distval.launch import LaunchOptions, run
from distval.rank import RankContext
from distval.train.config import TrainConfig
from distval.train.loop import train_rank


def timed_runs(ctx: RankContext, args: tuple[TrainConfig, int, str]) -> dict:
    cfg, repeats, root = args
    train_rank(ctx, dataclasses.replace(cfg, steps=2))  # warm-up: allocator, threads, first-step costs
    out: dict[str, list] = {"none": [], "sync": [], "async": []}
    for rep in range(repeats):
        for mode in ("none", "sync", "async"):
            ckpt = Path(root) / f"{mode}-{rep}"
            if ctx.rank == 0 and mode != "none":
                ckpt.mkdir()
            dist.barrier(group=ctx.control)
            one = dataclasses.replace(cfg, ckpt=dataclasses.replace(
                cfg.ckpt, dir=None if mode == "none" else str(ckpt), async_save=mode == "async"))
            result = train_rank(ctx, one)
            saves = []
            if ctx.rank == 0 and mode != "none":
                saves = json.loads(one.ckpt.journal_path(run_id()).read_text())["saves"]
                shutil.rmtree(ckpt)
            out[mode].append({"step_s": [s["step_time_s"] for s in result["steps"]], "saves": saves})
    return out


def stall(args: argparse.Namespace, root: Path) -> None:
    cfg = TrainConfig(model=args.model, strategy=args.strategy, steps=args.steps,
                      ckpt=CheckpointConfig(every=args.every, keep=2), peak_flops=1e12)
    res = run(timed_runs, (cfg, args.repeats, str(root)), LaunchOptions(nproc=args.nproc, timeout_s=600)).results[0]
    num_saves = len(res["sync"][0]["saves"])
    mid_saves = len([s for s in res["sync"][0]["saves"] if s["step"] < args.steps])  # saves followed by steps
    print(f"{args.model}, {args.nproc} ranks, {args.strategy}, {args.steps} steps, a save every {args.every} "
          f"({num_saves} saves per run), {args.repeats} repeats interleaved after a warm-up run")
    steps = {m: [sum(r["step_s"][1:]) for r in rows] for m, rows in res.items()}
    for m in steps:
        print(f"  sum of step times {m:<6} " + "  ".join(f"{w:7.2f}s" for w in steps[m]))
    sync_save = [statistics.median(s["stall_s"] for s in r["saves"]) for r in res["sync"]]
    blocking = [statistics.median(s["stall_s"] for s in r["saves"]) for r in res["async"]]
    written = [statistics.median(s["write_s"] for s in r["saves"]) for r in res["async"]]
    slower = [(a - n) / mid_saves for a, n in zip(steps["async"], steps["none"])]
    total = [b + x for b, x in zip(blocking, slower)]
    noise = (max(steps["none"]) - min(steps["none"])) / mid_saves  # identical runs differ by this much per save
    sync_med, block_med, total_med = (statistics.median(x) for x in (sync_save, blocking, total))
    print(f"  sync save time per save          {sync_med * 1e3:8.1f} ms (median)")
    print(f"  async stall per save, blocking   {block_med * 1e3:8.1f} ms = {block_med / sync_med:6.1%} of a sync save "
          f"(the background write took {statistics.median(written) * 1e3:.0f} ms)")
    print(f"  async stall per save, total      {total_med * 1e3:8.1f} ms = {total_med / sync_med:6.1%} of a sync save "
          f"(goal <= 15%; steps slowed by {statistics.median(slower) * 1e3:+.1f} ms per save)")
    print(f"  noise: the step-time sums of the identical runs without checkpoints spread over {noise * 1e3:.0f} ms "
          f"per save; a slowdown below that is not resolved on this machine")


def recovery(args: argparse.Namespace, root: Path) -> None:
    times = []
    for i in range(args.kills):
        ckpt = root / f"kill-{i}"
        ckpt.mkdir()
        cfg = TrainConfig(model=args.model, strategy=args.strategy, steps=args.kill_step + 2, peak_flops=1e12,
                          ckpt=CheckpointConfig(dir=str(ckpt), every=args.every, async_save=False, resume="auto"))
        os.environ["DISTVAL_FAULT"] = f"step={args.kill_step},rank=1,action=kill"  # spawned workers inherit it
        try:
            run(train_rank, cfg, LaunchOptions(nproc=args.nproc, timeout_s=120, max_restarts=1, run_id=f"kill-{i}"))
        finally:
            os.environ.pop("DISTVAL_FAULT")
        a0, a1 = json.loads((ckpt / "runs" / f"kill-{i}.json").read_text())["attempts"][:2]
        times.append(a1["first_step_time"] - a0["last_step_time"])
        print(f"  kill {i}: rank 1 killed at step {a0['last_step']}, resumed from step {a1['resumed_from_step']}, "
              f"first resumed step done {times[-1]:.2f}s later")
    print(f"  recovery after a kill (median of {len(times)}): {statistics.median(times):.2f}s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", default="small")
    p.add_argument("--strategy", default="pytorch_ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kills", type=int, default=2)
    p.add_argument("--kill-step", type=int, default=4)
    p.add_argument("--dir", default=None, help="where checkpoints go (default: a temporary folder)")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="distval-ckpt-bench-", dir=args.dir))
    try:
        stall(args, root)
        if args.kills:
            recovery(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
