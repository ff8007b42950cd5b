"""A healthy DDP training script that evaluates on every rank: every 50 steps each rank runs its
shard of the validation set, the sums are all-reduced, rank 0 alone logs; the training loss is
all-reduced for the log every 25 steps.

    torchrun --nproc-per-node 2 eval_every_rank.py --steps 600 --step-ms 50
    distval launch --nproc 2 eval_every_rank.py --steps 600 --step-ms 50

The step lasts about --step-ms of real compute: the batch is sized from a forward and backward
timed on this host (the mean over the ranks, so every rank trains the same batch). Gloo on CPU,
seeded, no downloads; the ranks come from the environment torchrun sets.
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN_DIM, HIDDEN, OUT_DIM = 64, 256, 16
EVAL_EVERY, LOG_EVERY, EVAL_BATCHES = 50, 25, 4


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-ms", type=float, default=50.0, help="the step's length, from its compute (5 to 500)")
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
    model = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.Tanh(), nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, HIDDEN),
                          nn.Tanh(), nn.Linear(HIDDEN, OUT_DIM))

    def work(n):
        x = torch.randn(n, IN_DIM)
        nn.functional.mse_loss(model(x), torch.tanh(teacher(x))).backward()

    batch = batch_for(work, args.step_ms, world_size)
    model.zero_grad(set_to_none=True)
    model = DDP(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)
    # one validation set, the same on every rank; each rank evaluates every world_size-th sample
    val_x = torch.randn(EVAL_BATCHES * batch * world_size, IN_DIM, generator=torch.Generator().manual_seed(args.seed))
    with torch.no_grad():
        val_y = torch.tanh(teacher(val_x))
    val_x, val_y = val_x[rank::world_size], val_y[rank::world_size]
    if rank == 0:
        print(f"eval_every_rank: {world_size} ranks, batch {batch} per rank, {args.steps} steps", flush=True)

    @torch.no_grad()
    def evaluate():
        model.eval()
        sums = torch.zeros(3)  # squared error, absolute error, elements
        for x, y in zip(val_x.split(batch), val_y.split(batch)):
            error = model(x) - y
            sums += torch.stack([error.square().sum(), error.abs().sum(), torch.tensor(float(error.numel()))])
        model.train()
        dist.all_reduce(sums)
        return (sums[:2] / sums[2]).tolist()

    started = time.perf_counter()
    running = torch.zeros(())
    for step in range(1, args.steps + 1):
        x = torch.randn(batch, IN_DIM, generator=data)
        with torch.no_grad():
            y = torch.tanh(teacher(x))
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        running += loss.detach()
        if step % LOG_EVERY == 0:
            dist.all_reduce(running)
            if rank == 0 and step % (LOG_EVERY * 4) == 0:
                print(f"step {step}: train loss {running.item() / world_size / LOG_EVERY:.4f}", flush=True)
            running.zero_()
        if step % EVAL_EVERY == 0:
            mse, mae = evaluate()
            if rank == 0:
                print(f"step {step}: val mse {mse:.4f}, mae {mae:.4f}", flush=True)
    if rank == 0:
        print(f"done: {args.steps} steps, {1e3 * (time.perf_counter() - started) / args.steps:.1f} ms/step",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
