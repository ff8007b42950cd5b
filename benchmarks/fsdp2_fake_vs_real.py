"""FSDP2's step on torch's fake process group of 2 against a real Gloo group of 2, with
torch.profiler's table of each: what a real group costs FSDP2 beyond the fake one, which is why
compare times fsdp2's world-N work on a real local group (train/worldcost.py; docs/plan.md "Step
costs").

    PYTHONPATH=src python benchmarks/fsdp2_fake_vs_real.py                                         # fake
    PYTHONPATH=src OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/fsdp2_fake_vs_real.py  # real

Prints the median of 60 unprofiled steps (after 5): forward+backward, collectives included, the
part spent waiting in them (distval's layer's `blocked_s`) and the rest, and the optimizer phase
(the gradient norm with clipping, the update), then the profiler's top ops by self CPU time over 10
more (rank 0's). Alternating the two commands a few times in one sitting compares the real group's
work with the fake one's (docs/results/2026-11-27-fsdp2-world-n.md). The model is `tiny` under
distval's fsdp2 strategy, micro-batch 2, one thread, AdamW as on CPU, the loss as
train/worldcost.py takes it.
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
    optimizer = strategy.build_optimizer(torch.optim.AdamW, lr=3e-3, weight_decay=0.1, foreach=False)  # as on CPU
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len))

    def step() -> tuple[float, float, float, float]:
        """(forward+backward, the part of it spent waiting in distval's layer's collectives, the
        gradient norm with clipping, the update)"""
        issued, began = comm.issued, time.perf_counter()
        with strategy.micro_batch(is_last=True):
            strategy.model(tokens).float().square().mean().backward()
        took = time.perf_counter() - began
        calls = comm.issued - issued
        float(strategy.clip_grad_norm(1.0))
        clipped = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        waits = sum(r.blocked_s for r in list(comm.records)[-calls:]) if calls else 0.0
        return took, waits, clipped - began - took, time.perf_counter() - clipped

    for _ in range(5):
        step()
    times = [step() for _ in range(STEPS)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step()
    if dist.get_rank() == 0:
        fb, waits, clip, update = (statistics.median(t[i] for t in times) * 1e3 for i in range(4))
        less = statistics.median(t[0] - t[1] for t in times) * 1e3
        print(f"{'real' if real else 'fake'} group of 2: forward+backward median {fb:.2f} ms, waits {waits:.2f} ms, "
              f"forward+backward less waits {less:.2f} ms; optimizer phase: norm and clipping {clip:.2f} ms, "
              f"update {update:.2f} ms")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=50))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
