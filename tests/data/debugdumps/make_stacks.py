"""A 3-rank Gloo job with torch.distributed.debug's periodic dumper on, one case per run (README.md)."""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.debug import start_debug_server

case, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
start_debug_server(port=25999, dump_dir=out, dump_interval=2.0, fetch_timeout=2.0)
t = torch.ones(4)
for _ in range(5):
    dist.all_reduce(t)


def evaluate():
    time.sleep(60)  # one rank alone, outside any collective


if case == "outside" and rank == 1:
    evaluate()
elif case == "mismatch" and rank == 2:
    dist.broadcast(t, src=0)
elif case == "stopped" and rank == 2:
    os.kill(os.getpid(), signal.SIGSTOP)
elif case == "ddp":  # rank 0 saves alone while the others wait in DDP's gradient all_reduce, inside backward
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    if rank == 0:
        evaluate()
    model(torch.randn(4, 8)).sum().backward()
else:
    dist.all_reduce(t)
