"""A healthy FSDP2 training script: `fully_shard` on each block of a small transformer and on the
root, its own loop, gradient clipping over the sharded gradients, the loss all-reduced by hand for
the log, every rank evaluating its shard of the validation set every 50 steps, and a sharded
checkpoint (torch.distributed.checkpoint) every 100.

    torchrun --nproc-per-node 2 fsdp2.py --steps 600 --step-ms 50
    distval launch --nproc 2 fsdp2.py --steps 600 --step-ms 50

The step lasts about --step-ms of real compute: the batch is sized from a forward and backward
timed on this host before sharding (the mean over the ranks, so every rank trains the same batch).
Gloo on CPU, seeded, no downloads; the ranks come from the environment torchrun sets.
"""
import argparse
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

SEQ, DIM, HEADS, OUT_DIM, NUM_BLOCKS = 16, 64, 4, 8, 2
EVAL_EVERY, SAVE_EVERY, EVAL_BATCHES = 50, 100, 2


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-ms", type=float, default=50.0, help="the step's length, from its compute (5 to 500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=tempfile.gettempdir(), help="where the sharded checkpoint goes")
    return p.parse_args()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(NUM_BLOCKS))
        self.head = nn.Linear(DIM, OUT_DIM)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))


def batch_for(work, step_ms, world_size):
    """The per-rank batch for which `work(batch)` (a forward and backward) takes about `step_ms`
    here: timed at a guess, the guess scaled by the target over the time, three times; the time is
    the mean over the ranks, so every rank trains the same batch (a rank-dependent one would make a
    straggler)."""
    batch = 16
    for _ in range(3):
        work(batch)  # warm-up at this size
        start = time.perf_counter()
        work(batch)
        work(batch)
        took = torch.tensor((time.perf_counter() - start) / 2)
        dist.all_reduce(took)  # SUM then divide
        ratio = step_ms / 1e3 / (took.item() / world_size)
        batch = max(2, min(8192, round(batch * min(ratio, 50.0))))
    return batch


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    teacher = nn.Linear(DIM, OUT_DIM)
    model = Model()

    def target(x):
        with torch.no_grad():
            return torch.tanh(teacher(x.mean(dim=1)))

    def work(n):
        x = torch.randn(n, SEQ, DIM)
        nn.functional.mse_loss(model(x), target(x)).backward()

    batch = batch_for(work, args.step_ms, world_size)
    model.zero_grad(set_to_none=True)
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)  # each block's parameters gathered for its forward, freed after
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    data = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)
    val = torch.Generator().manual_seed(args.seed * 1000 + 999 + rank)  # this rank's shard of the validation set
    val_x = torch.randn(EVAL_BATCHES * batch, SEQ, DIM, generator=val)
    val_y = target(val_x)
    ckpt = os.path.join(args.out_dir, f"fsdp2_{os.environ.get('MASTER_PORT', '0')}")
    if rank == 0:
        print(f"fsdp2: {world_size} ranks, batch {batch} per rank, {args.steps} steps", flush=True)

    @torch.no_grad()
    def evaluate():
        model.eval()
        total = torch.zeros(2)
        for x, y in zip(val_x.split(batch), val_y.split(batch)):
            total += torch.stack([nn.functional.mse_loss(model(x), y, reduction="sum"), torch.tensor(y.numel())])
        model.train()
        dist.all_reduce(total)
        return (total[0] / total[1]).item()

    started = time.perf_counter()
    for step in range(args.steps):
        if step > 0 and step % EVAL_EVERY == 0:
            val_loss = evaluate()
            if rank == 0:
                print(f"step {step}: val loss {val_loss:.4f}", flush=True)
        x = torch.randn(batch, SEQ, DIM, generator=data)
        loss = nn.functional.mse_loss(model(x), target(x))
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        metric = loss.detach().clone()
        dist.all_reduce(metric)
        metric /= world_size
        if step > 0 and step % SAVE_EVERY == 0:
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=ckpt)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # on every rank: it may communicate
    if rank == 0:
        elapsed = time.perf_counter() - started
        print(f"done: {args.steps} steps, {1e3 * elapsed / args.steps:.1f} ms/step, train loss "
              f"{metric.item():.4f}, grad norm {norm.item():.3f}", flush=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
