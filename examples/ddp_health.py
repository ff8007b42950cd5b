"""A plain DDP training loop, as users write them, with faults to show what `distval launch`
watches (docs/health.md): `python examples/ddp_health.py STEPS [FAULTS]` under a launcher.

FAULTS, comma-separated: nan (rank 1 sets a gradient element to NaN at step 33), drift (rank 1
nudges a parameter at step 60), leak (rank 0 keeps 4 MiB more every step), straggler (rank 1
sleeps 20 ms more per step from step 20), slow (every rank sleeps 5 ms per step: a clean run that
lasts).
"""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps, faults = int(sys.argv[1]), set(sys.argv[2].split(",")) if len(sys.argv) > 2 else set()
kept = []
for step in range(steps):
    opt.zero_grad()
    loss = model(torch.randn(16, 32)).square().mean()
    loss.backward()
    if "nan" in faults and rank == 1 and step == 33:
        model.module[2].weight.grad[0, 0] = float("nan")
    opt.step()
    if "drift" in faults and rank == 1 and step == 60:
        with torch.no_grad():
            model.module[0].bias[3] += 1e-3
    if "leak" in faults and rank == 0:
        kept.append(torch.ones(4 << 20, dtype=torch.uint8))  # 4 MiB a step, never freed
    metric = loss.detach().clone()
    dist.all_reduce(metric)  # a metric all-reduced by hand, as scripts do
    if "slow" in faults or ("straggler" in faults and rank == 1 and step >= 20):
        time.sleep(0.005 if "slow" in faults else 0.02)
if rank == 0:
    print(f"done: {steps} steps, mean loss {metric.item() / dist.get_world_size():.4f}")
dist.destroy_process_group()
