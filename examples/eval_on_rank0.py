"""A training script as people write them (nanoGPT's shape): its own DDP loop, a metric
all_reduced by hand, and rank 0 alone evaluating and saving a checkpoint every EVAL_EVERY
iterations while the other ranks go on into the next step's all_reduce and wait.

    distval launch --nproc 2 examples/eval_on_rank0.py ITERS EVAL_EVERY EVAL_SECONDS [stop|spin]

`stop`: rank 1 stops itself (SIGSTOP) 3 iterations after the first evaluation; `spin`: it loops
in Python forever there. distval names the evaluation live and lets the job go on; it ends the
job at once for the stopped rank, and past --hang-kill-after for the spinning one.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

iters, eval_every, eval_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
fault = sys.argv[4] if len(sys.argv) > 4 else ""
dist.init_process_group("gloo")
rank = dist.get_rank()
master_process = rank == 0
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses, started = [], time.time()
    while time.time() - started < eval_s:
        x = torch.randn(256, 64)
        losses.append(model.module(x).pow(2).mean().item())
    model.train()
    return sum(losses) / len(losses)


for it in range(iters):
    if it % eval_every == 0 and it > 0 and master_process:
        val = estimate_loss()
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "eval_on_rank0.pt")
        torch.save({"model": model.module.state_dict(), "iter": it}, path)
        print(f"iter {it}: val loss {val:.4f}, saved", flush=True)
    if fault and rank == 1 and it == eval_every + 3:
        if fault == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fault == "spin":
            while True:
                sum(range(100))
    loss = model(torch.randn(32, 64)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    metric = loss.detach().clone()
    dist.all_reduce(metric)
    time.sleep(0.01)
if master_process:
    print("done", flush=True)
dist.destroy_process_group()
