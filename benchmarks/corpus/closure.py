"""A healthy training script in a framework's shape (Lightning's, roughly): a `Trainer` drives a
`Module`'s `training_step` through `optimizer.step(closure)`, and callbacks run at
`on_train_batch_end`:

- a logger that syncs a dict of scalar metrics every 10 steps (packed into one tensor, one
  all_reduce), rank 0 printing;
- a validation loop every 50 steps on every rank: its shard of the validation set, the
  predictions all_gathered (as a metric that needs every sample would) and a metric vector
  all_reduced;
- a checkpoint callback every 100 steps: rank 0 saves the state_dict, every rank waits in a
  barrier.

    torchrun --nproc-per-node 2 closure.py --steps 600 --step-ms 50
    distval launch --nproc 2 closure.py --steps 600 --step-ms 50

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

IN_DIM, HIDDEN, NUM_CLASSES = 32, 256, 10


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-ms", type=float, default=50.0, help="the step's length, from its compute (5 to 500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=tempfile.gettempdir(), help="where rank 0 saves its checkpoint")
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


class Classifier(nn.Module):
    """The user's module: a network, its training step and its optimizer."""

    def __init__(self, teacher):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                                 nn.Linear(HIDDEN, NUM_CLASSES))
        self.teacher = teacher  # labels come from a fixed random linear map

    def labels(self, x):
        with torch.no_grad():
            return self.teacher(x).argmax(dim=1)

    def forward(self, x):
        return self.net(x)

    def training_step(self, model, x):
        logits = model(x)
        y = self.labels(x)
        return nn.functional.cross_entropy(logits, y), {"acc": (logits.argmax(1) == y).float().mean()}

    def configure_optimizer(self, params):
        return torch.optim.AdamW(params, lr=1e-3)


class MetricLogger:
    """Syncs the mean of each logged scalar over the ranks every `every` steps: one all_reduce of
    the scalars packed into a tensor."""

    def __init__(self, every):
        self.every, self.sums, self.count = every, {}, 0

    def on_train_batch_end(self, trainer, step, metrics):
        for name, value in metrics.items():
            self.sums[name] = self.sums.get(name, 0.0) + value.detach()
        self.count += 1
        if (step + 1) % self.every:
            return
        names = sorted(self.sums)
        packed = torch.stack([self.sums[n] for n in names]) / self.count
        dist.all_reduce(packed)
        packed /= trainer.world_size
        if trainer.rank == 0 and (step + 1) % (self.every * 10) == 0:
            print(f"step {step + 1}: " + ", ".join(f"{n} {v:.4f}" for n, v in zip(names, packed.tolist())), flush=True)
        self.sums, self.count = {}, 0


class Validation:
    """Every `every` steps each rank runs its shard of the validation set; the predictions are
    all_gathered and a metric vector (loss sum, correct, count) all_reduced."""

    def __init__(self, every, x):
        self.every, self.x = every, x

    @torch.no_grad()
    def on_train_batch_end(self, trainer, step, metrics):
        if (step + 1) % self.every:
            return
        module = trainer.module
        module.eval()
        logits = module(self.x)
        y = module.labels(self.x)
        predictions = [torch.empty(len(self.x), dtype=torch.long) for _ in range(trainer.world_size)]
        dist.all_gather(predictions, logits.argmax(1))
        totals = torch.stack([nn.functional.cross_entropy(logits, y, reduction="sum"),
                              (logits.argmax(1) == y).sum().float(), torch.tensor(float(len(y)))])
        dist.all_reduce(totals)
        module.train()
        if trainer.rank == 0:
            classes = torch.cat(predictions).bincount(minlength=NUM_CLASSES)
            print(f"step {step + 1}: val loss {(totals[0] / totals[2]).item():.4f}, "
                  f"acc {(totals[1] / totals[2]).item():.3f}, classes predicted {int((classes > 0).sum())}",
                  flush=True)


class Checkpoint:
    """Every `every` steps rank 0 saves the state_dict; every rank waits for it in a barrier."""

    def __init__(self, every, path):
        self.every, self.path = every, path

    def on_train_batch_end(self, trainer, step, metrics):
        if (step + 1) % self.every:
            return
        if trainer.rank == 0:
            torch.save({"model": trainer.module.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                        "step": step + 1}, self.path)
        dist.barrier()


class Trainer:
    def __init__(self, module, callbacks, batch, seed):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.module, self.callbacks, self.batch = module, callbacks, batch
        self.model = DDP(module)
        self.optimizer = module.configure_optimizer(self.model.parameters())
        self.data = torch.Generator().manual_seed(seed * 1000 + self.rank + 1)

    def fit(self, steps):
        for step in range(steps):
            x = torch.randn(self.batch, IN_DIM, generator=self.data)
            metrics = {}

            def closure():
                self.optimizer.zero_grad(set_to_none=True)
                loss, extra = self.module.training_step(self.model, x)
                loss.backward()
                metrics.update(loss=loss.detach(), **extra)
                return loss

            self.optimizer.step(closure)
            for callback in self.callbacks:
                callback.on_train_batch_end(self, step, metrics)


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    module = Classifier(nn.Linear(IN_DIM, NUM_CLASSES).requires_grad_(False))

    def work(n):
        loss, _ = module.training_step(module, torch.randn(n, IN_DIM))
        loss.backward()

    batch = batch_for(work, args.step_ms, world_size)
    module.zero_grad(set_to_none=True)
    val_x = torch.randn(2 * batch, IN_DIM, generator=torch.Generator().manual_seed(args.seed * 1000 + 999 + rank))
    path = os.path.join(args.out_dir, f"closure_{os.environ.get('MASTER_PORT', '0')}.pt")
    callbacks = [MetricLogger(10), Validation(50, val_x), Checkpoint(100, path)]
    trainer = Trainer(module, callbacks, batch, args.seed)
    if rank == 0:
        print(f"closure: {world_size} ranks, batch {batch} per rank, {args.steps} steps", flush=True)
    started = time.perf_counter()
    trainer.fit(args.steps)
    if rank == 0:
        print(f"done: {args.steps} steps, {1e3 * (time.perf_counter() - started) / args.steps:.1f} ms/step",
              flush=True)
        if os.path.exists(path):
            os.remove(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
