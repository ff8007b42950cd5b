"""A healthy training script that steps its optimizer through a wrapper object (the shape of
Accelerate's `accelerator.backward` / GradScaler's `scaler.step(optimizer)`): the wrapper clips
the gradients with clip_grad_norm_ and skips a step whose norm is not finite; a warm-up-then-cosine
LR scheduler; an epoch loop over a DistributedSampler of an in-memory TensorDataset with a
DataLoader (num_workers=0) and set_epoch each epoch; the epoch's loss all-reduced at its end.

    torchrun --nproc-per-node 2 wrapper.py --steps 600 --step-ms 50
    distval launch --nproc 2 wrapper.py --steps 600 --step-ms 50

The step lasts about --step-ms of real compute: the batch is sized from a forward and backward
timed on this host (the mean over the ranks, so every rank trains the same batch). Gloo on CPU,
seeded, no downloads; the ranks come from the environment torchrun sets.
"""
import argparse
import math
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

IN_DIM, HIDDEN, OUT_DIM = 64, 256, 16
MAX_SAMPLES = 200_000  # the in-memory dataset's cap (every rank holds all of it, as a real one does)


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


class Stepper:
    """What a training wrapper does around the optimizer: backward, clip, step (skipped when the
    gradient norm is not finite, as GradScaler skips an overflowed step), scheduler."""

    def __init__(self, max_norm):
        self.max_norm, self.skipped, self.last_norm = max_norm, 0, 0.0

    def backward(self, loss):
        loss.backward()

    def step(self, optimizer, scheduler=None):
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = nn.utils.clip_grad_norm_(params, self.max_norm)
        self.last_norm = norm.item()
        if math.isfinite(self.last_norm):
            optimizer.step()
        else:
            self.skipped += 1
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    teacher = nn.Linear(IN_DIM, OUT_DIM)
    model = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.SiLU(), nn.Linear(HIDDEN, HIDDEN), nn.SiLU(),
                          nn.Linear(HIDDEN, OUT_DIM))

    probe = TensorDataset(torch.randn(65536, IN_DIM), torch.zeros(65536, OUT_DIM))

    def work(n):  # a batch through a DataLoader as well: here collating it costs as much as the model
        x, y = next(iter(DataLoader(probe, batch_size=n)))
        nn.functional.mse_loss(model(x), y).backward()

    batch = batch_for(work, args.step_ms, world_size)
    model.zero_grad(set_to_none=True)
    # the same dataset on every rank (seeded); the sampler gives each rank its part of each epoch
    batches_per_epoch = max(2, min(20, MAX_SAMPLES // (batch * world_size)))
    inputs = torch.randn(batches_per_epoch * batch * world_size, IN_DIM,
                         generator=torch.Generator().manual_seed(args.seed))
    with torch.no_grad():
        dataset = TensorDataset(inputs, torch.tanh(teacher(inputs)))
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=0, drop_last=True)
    model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    warmup = max(1, args.steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s / args.steps, 1.0)))))
    stepper = Stepper(max_norm=1.0)
    epochs = math.ceil(args.steps / len(loader))
    if rank == 0:
        print(f"wrapper: {world_size} ranks, batch {batch} per rank, {len(loader)} batches per epoch, "
              f"{epochs} epochs ({args.steps} steps)", flush=True)
    started, step = time.perf_counter(), 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        epoch_loss = torch.zeros(2)
        for x, y in loader:
            if step == args.steps:
                break
            loss = nn.functional.mse_loss(model(x), y)
            stepper.backward(loss)
            stepper.step(optimizer, scheduler)
            epoch_loss += torch.stack([loss.detach(), torch.tensor(1.0)])
            step += 1
        dist.all_reduce(epoch_loss)
        if rank == 0 and (epoch + 1) % max(1, epochs // 10) == 0:
            print(f"epoch {epoch + 1}: loss {(epoch_loss[0] / epoch_loss[1]).item():.4f}, "
                  f"lr {scheduler.get_last_lr()[0]:.2e}, grad norm {stepper.last_norm:.3f}", flush=True)
    if rank == 0:
        print(f"done: {step} steps, {1e3 * (time.perf_counter() - started) / max(step, 1):.1f} ms/step, "
              f"{stepper.skipped} skipped", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
