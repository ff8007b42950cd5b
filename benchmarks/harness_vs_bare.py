"""`distval train` against a bare training loop of the same model, side by side in one process.

One worker by default (a world of one; `--nproc N`: N ranks, the bare loop a user's DDP, or
`fully_shard` per block and on the root for `--strategy fsdp2`, each step the slowest rank's as
the harness's): the same decoder (distval's), the same synthetic batches, the same AdamW
implementation the harness picks for the device (fused on CUDA, single-tensor on CPU), bf16
autocast with --precision bf16, torch.compile of the forward on both sides with --compile. The
bare loop is what a user writes: forward, loss, backward, clip, step, zero_grad, timed per step to
the device's completion. The harness is `train_rank` itself (strategy --strategy, default
pytorch_ddp as `distval train`), with its per-step bookkeeping, health monitor and metrics. Rounds
alternate bare, harness, bare, harness... so drift hits both; the first --warmup steps of each
round are dropped. Prints median step times and the ratio bare / harness (goal: >= 0.95).

    python benchmarks/harness_vs_bare.py --model small --steps 20 --rounds 3
    python benchmarks/harness_vs_bare.py --model tiny --strategy fsdp2 --nproc 2 --steps 30
    python benchmarks/harness_vs_bare.py --model smollm2-135m --precision bf16 --micro-batch 8   # on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from distval import device as devices
from distval import strategies
from distval.launch import LaunchOptions, run
from distval.plan import presets
from distval.rank import RankContext
from distval.train import data as data_mod
from distval.train.config import TrainConfig
from distval.train.loop import loss_of, optimizer_impl, train_rank
from distval.train.metrics import MetricsConfig
from distval.train.model import build_model


def bare_steps(ctx: RankContext, cfg: TrainConfig) -> list[float]:
    """A hand-written loop: the step times (s), each to the device's completion."""
    spec = presets.model(cfg.model)
    loader = data_mod.build_loader(cfg.data_config(), spec, micro_batch=cfg.micro_batch, grad_accum=cfg.grad_accum,
                                   rank=ctx.rank, world_size=ctx.world_size, seed=cfg.seed)
    model = build_model(spec, seed=cfg.seed, device=ctx.device)
    if cfg.compile:
        model.compile()
    if ctx.world_size > 1:  # what a user writes: DDP, or fully_shard per block and on the root
        if cfg.strategy == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for unit in [*model.blocks, model]:
                fully_shard(unit)
        else:
            model = torch.nn.parallel.DistributedDataParallel(model)
    impl = optimizer_impl(ctx.device, strategies.REGISTRY[cfg.strategy if ctx.world_size > 1 else "simple_ddp"])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, **impl)
    times = []
    for _ in range(cfg.steps):
        ctx.control_comm.barrier()  # as the harness: start together
        start = time.perf_counter()
        for _ in range(cfg.grad_accum):
            batch = {k: t.to(ctx.device) for k, t in next(loader).items()}
            with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
                logits = model(batch["tokens"])
            (loss_of(logits, batch) / cfg.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        devices.synchronize(ctx.device)
        times.append(time.perf_counter() - start)
    return times


def rank_fn(ctx: RankContext, args: tuple[TrainConfig, int, int]) -> dict:
    cfg, rounds, warmup = args
    out: dict[str, list[float]] = {"bare": [], "harness": []}
    for _ in range(rounds):
        out["bare"] += bare_steps(ctx, cfg)[warmup:]
        out["harness"] += [s["step_time_s"] for s in train_rank(ctx, cfg)["steps"]][warmup:]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="small")
    p.add_argument("--strategy", default="pytorch_ddp")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--compile", action="store_true")
    p.add_argument("--readback", default="auto", choices=("auto", "now", "late"),
                   help="the harness's --metrics-readback (on a GPU: late by default; now reads every step)")
    p.add_argument("--min-ratio", type=float, default=0.95)
    a = p.parse_args()
    cfg = TrainConfig(model=a.model, strategy=a.strategy, steps=a.steps, micro_batch=a.micro_batch,
                      precision=a.precision, compile=a.compile, metrics=MetricsConfig(readback=a.readback))
    job = run(rank_fn, (cfg, a.rounds, a.warmup), LaunchOptions(nproc=a.nproc, timeout_s=600))
    res = job.results[0]  # the harness's step is the slowest rank's: so is the bare loop's
    bare_steps_s = [max(steps) for steps in zip(*(r["bare"] for r in job.results))]
    bare, harness = statistics.median(bare_steps_s), statistics.median(res["harness"])
    ratio = bare / harness
    print(f"{a.model}, {a.precision}{', compiled' if a.compile else ''}, micro-batch {a.micro_batch}, "
          f"{a.nproc} rank(s) ({job.backend}), {a.rounds} alternating rounds of {a.steps} steps "
          f"({a.warmup} warm-up dropped each)")
    print(f"bare loop  step p50 {bare * 1e3:8.2f} ms  ({len(res['bare'])} steps)")
    print(f"harness    step p50 {harness * 1e3:8.2f} ms  ({len(res['harness'])} steps, {a.strategy}, "
          f"readback {a.readback})")
    ok = ratio >= a.min_ratio
    print(f"ratio bare/harness {ratio:.3f}; goal >= {a.min_ratio} -> {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
