"""FSDP2's forward+backward on torch's fake process group of 2 against a real Gloo group of 2, with
torch.profiler's table of each (issue 28: 2-rank fsdp2's forward+backward is measured above the
plan, whose world-2 part comes from the fake group; docs/plan.md "How close", session 23).

    PYTHONPATH=src python benchmarks/fsdp2_fake_vs_real.py                                         # fake
    PYTHONPATH=src OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/fsdp2_fake_vs_real.py  # real

Prints the median of 60 unprofiled forward+backward passes (after 5), collectives included, the
part spent waiting in them (distval's layer's `blocked_s`) and the rest, then the profiler's top
ops by self CPU time over 10 more (rank 0's). Alternating the two commands a few times in one
sitting compares the real group's non-wait work with the fake one's (session 23: +3.5 ms a step at
the median of six pairs). The model is `tiny` under
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

STEPS = 60  # timed, after 5 of warm-up


def main() -> None:
    torch.set_num_threads(1)
    real = "RANK" in os.environ
    if real:
        dist.init_process_group("gloo")
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    spec = presets.model("tiny")
    comm = Comm()
    strategy = strategies.REGISTRY["fsdp2"](build_model(spec, seed=0), comm, StrategyConfig())
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len))

    def step() -> tuple[float, float]:
        """(forward+backward, the part of it spent waiting in distval's layer's collectives)"""
        issued, began = comm.issued, time.perf_counter()
        with strategy.micro_batch(is_last=True):
            strategy.model(tokens).float().square().mean().backward()
        strategy.model.zero_grad(set_to_none=True)
        took = time.perf_counter() - began
        calls = comm.issued - issued
        return took, sum(r.blocked_s for r in list(comm.records)[-calls:]) if calls else 0.0

    for _ in range(5):
        step()
    times = [step() for _ in range(STEPS)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step()
    if dist.get_rank() == 0:
        fb, waits = (statistics.median(t[i] for t in times) * 1e3 for i in (0, 1))
        less = statistics.median(t[0] - t[1] for t in times) * 1e3
        print(f"{'real' if real else 'fake'} group of 2: forward+backward median {fb:.2f} ms, waits {waits:.2f} ms, "
              f"forward+backward less waits {less:.2f} ms")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=50))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
