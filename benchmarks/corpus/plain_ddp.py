"""A healthy training script in the plainest style (nanoGPT's shape): its own loop over a DDP
model, the loss all-reduced by hand every step, rank 0 alone evaluating every 50 steps and saving
a checkpoint every 100 (the others wait in a barrier after the save).

    torchrun --nproc-per-node 2 plain_ddp.py --steps 600 --step-ms 50
    distval launch --nproc 2 plain_ddp.py --steps 600 --step-ms 50

The step lasts about --step-ms of real compute: the batch is sized from a forward and backward
timed on this host (the mean over the ranks, so every rank trains the same batch). Gloo on CPU,
seeded, no downloads; the ranks come from the environment torchrun sets.
"""
import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN_DIM, HIDDEN, OUT_DIM = 64, 256, 16
EVAL_EVERY, SAVE_EVERY, EVAL_BATCHES = 50, 100, 3


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-ms", type=float, default=50.0, help="the step's length, from its compute (5 to 500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=tempfile.gettempdir(), help="where rank 0 saves its checkpoint")
    return p.parse_args()


def make_model():
    return nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
                         nn.Linear(HIDDEN, OUT_DIM))


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
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
    rank, world_size = dist.get_rank(), dist.get_world_size()
    master_process = rank == 0
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    teacher = nn.Linear(IN_DIM, OUT_DIM)  # the function to learn
    model = make_model()

    def work(n):
        x = torch.randn(n, IN_DIM)
        nn.functional.mse_loss(model(x), torch.tanh(teacher(x))).backward()

    batch = batch_for(work, args.step_ms, world_size)
    model.zero_grad(set_to_none=True)
    model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    data = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)  # each rank its own samples
    val_x = torch.randn(EVAL_BATCHES * batch, IN_DIM, generator=torch.Generator().manual_seed(args.seed))
    with torch.no_grad():
        val_y = torch.tanh(teacher(val_x))
    ckpt = os.path.join(args.out_dir, f"plain_ddp_{os.environ.get('MASTER_PORT', '0')}.pt")
    if master_process:
        print(f"plain_ddp: {world_size} ranks, batch {batch} per rank, {args.steps} steps", flush=True)

    @torch.no_grad()
    def estimate_loss():
        model.eval()
        losses = [nn.functional.mse_loss(model.module(x), y).item()
                  for x, y in zip(val_x.split(batch), val_y.split(batch))]
        model.train()
        return sum(losses) / len(losses)

    started = time.perf_counter()
    for step in range(args.steps):
        if step > 0 and step % EVAL_EVERY == 0 and master_process:
            print(f"step {step}: val loss {estimate_loss():.4f}", flush=True)
        x = torch.randn(batch, IN_DIM, generator=data)
        with torch.no_grad():
            y = torch.tanh(teacher(x))
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        metrics = torch.stack([loss.detach(), model.module[0].weight.grad.norm()])
        dist.all_reduce(metrics)  # train loss and a gradient norm for the log, averaged by hand
        metrics /= world_size
        if step > 0 and step % SAVE_EVERY == 0:
            if master_process:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                           ckpt)
            dist.barrier()  # nobody runs ahead of a checkpoint being written
    if master_process:
        elapsed = time.perf_counter() - started
        print(f"done: {args.steps} steps, {1e3 * elapsed / args.steps:.1f} ms/step, "
              f"train loss {metrics[0].item():.4f}", flush=True)
        if os.path.exists(ckpt):
            os.remove(ckpt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
