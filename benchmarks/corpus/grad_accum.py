"""A healthy DDP training script with gradient accumulation: each step runs --accum micro-batches,
the first accum-1 under `model.no_sync()` (no gradient all-reduce), the last one synchronising;
the loss all-reduced for the log every 10 steps, rank 0 printing.

    torchrun --nproc-per-node 2 grad_accum.py --steps 600 --step-ms 50 --accum 4
    distval launch --nproc 2 grad_accum.py --steps 600 --step-ms 50 --accum 4

The step (all its micro-batches) lasts about --step-ms of real compute: the batch is sized from a
forward and backward timed on this host (the mean over the ranks, so every rank trains the same
batch). Gloo on CPU, seeded, no downloads; the ranks come from the environment torchrun sets.
"""
import argparse
import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN_DIM, HIDDEN, OUT_DIM = 64, 256, 16
LOG_EVERY = 10


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-ms", type=float, default=50.0, help="the step's length, from its compute (5 to 500)")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def batch_for(work, step_ms, world_size):
    """The per-rank batch for which `work(batch)` (a forward and backward) takes about `step_ms`
    here: timed at a guess, the guess scaled by the target over the time, three times; the time is
    the mean over the ranks, so every rank trains the same batch (a rank-dependent one would make a
    straggler)."""
    batch = 64
    for _ in range(3):
        work(batch)  # warm-up at this size
        start = time.perf_counter()
        work(batch)
        work(batch)
        took = torch.tensor((time.perf_counter() - start) / 2)
        dist.all_reduce(took)  # SUM then divide
        ratio = step_ms / 1e3 / (took.item() / world_size)
        batch = max(8, min(65536, round(batch * min(ratio, 50.0))))
    return batch


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    teacher = nn.Linear(IN_DIM, OUT_DIM)
    model = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, OUT_DIM))

    def work(n):
        x = torch.randn(n, IN_DIM)
        nn.functional.mse_loss(model(x), torch.tanh(teacher(x))).backward()

    micro = max(1, batch_for(work, args.step_ms, world_size) // args.accum)  # the step's batch in accum parts
    model.zero_grad(set_to_none=True)
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)
    if rank == 0:
        print(f"grad_accum: {world_size} ranks, {args.accum} micro-batches of {micro} per rank, {args.steps} steps",
              flush=True)
    started = time.perf_counter()
    running = torch.zeros(())
    for step in range(args.steps):
        for i in range(args.accum):
            # the gradient is all-reduced only at the last micro-batch; the others accumulate locally
            sync = contextlib.nullcontext() if i == args.accum - 1 else model.no_sync()
            x = torch.randn(micro, IN_DIM, generator=data)
            with torch.no_grad():
                y = torch.tanh(teacher(x))
            with sync:
                loss = nn.functional.mse_loss(model(x), y) / args.accum
                loss.backward()
            running += loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % LOG_EVERY == 0:
            dist.all_reduce(running)
            if rank == 0 and (step + 1) % (LOG_EVERY * 10) == 0:
                print(f"step {step + 1}: train loss {running.item() / world_size / LOG_EVERY:.4f}", flush=True)
            running.zero_()
    if rank == 0:
        elapsed = time.perf_counter() - started
        print(f"done: {args.steps} steps, {1e3 * elapsed / args.steps:.1f} ms/step", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
