"""FSDP2's forward+backward on torch's fake process group of 2 against a real Gloo group of 2, with
torch.profiler's table of each (issue 28: 2-rank fsdp2's forward+backward is measured above the
plan, whose world-2 part comes from the fake group; docs/plan.md "How close", session 23).

    PYTHONPATH=src python benchmarks/fsdp2_fake_vs_real.py                                         # fake
    PYTHONPATH=src OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/fsdp2_fake_vs_real.py  # real

Prints the median of 20 unprofiled forward+backward passes (after 5), collectives included, then
the profiler's top ops by self CPU time over 10 more (rank 0's). The model is `tiny` under
distval's fsdp2 strategy, micro-batch 2, one thread, the loss as train/fakeworld.py takes it.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from distval import strategies
from distval.comm.layer import Comm
from distval.plan import presets
from distval.strategies.config import StrategyConfig
from distval.train.model import build_model


def main() -> None:
    torch.set_num_threads(1)
    real = "RANK" in os.environ
    if real:
        dist.init_process_group("gloo")
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    spec = presets.model("tiny")
    strategy = strategies.REGISTRY["fsdp2"](build_model(spec, seed=0), Comm(), StrategyConfig())
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len))

    def step() -> float:
        began = time.perf_counter()
        with strategy.micro_batch(is_last=True):
            strategy.model(tokens).float().square().mean().backward()
        strategy.model.zero_grad(set_to_none=True)
        return time.perf_counter() - began

    for _ in range(5):
        step()
    times = [step() for _ in range(20)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step()
    if dist.get_rank() == 0:
        median = statistics.median(times) * 1e3
        print(f"{'real' if real else 'fake'} group of 2: forward+backward median {median:.2f} ms")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=50))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
