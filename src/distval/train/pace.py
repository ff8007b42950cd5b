"""The host's pace: how long the plain model's forward+backward takes on this rank now.

compare's prediction scales step costs measured on one rank alone (the reference's probes,
train/compare.py) to the ranks of each strategy's run. On a shared CPU host the rate a rank
computes at moves by more than the plan's ±20% between windows of a few seconds, and ranks that
outnumber the cores slow each other. So the same small workload is timed in both windows: on the
reference's rank beside its probes, and on every rank of each strategy's run at once right after
its steps. Their ratio, the run's slowdown, is what the one-rank costs are scaled by (in place of
the cores' share, `compare.core_share`, which is what `distval plan` assumes); docs/plan.md
"Step costs".

The workload: the model's forward and backward (no strategy, no collectives, no optimizer) on a
fixed batch of random tokens, for about `seconds` after `warmup` steps, at least `least` steps;
the median step.
"""

from __future__ import annotations

import statistics
import time

import torch

from distval import device as devices
from distval.plan.presets import ModelSpec
from distval.train.model import build_model

PACE_SECONDS, PACE_WARMUP, PACE_LEAST = 0.3, 2, 3


def pace_s(spec: ModelSpec, micro_batch: int, device: torch.device, seconds: float = PACE_SECONDS,
           warmup: int = PACE_WARMUP, least: int = PACE_LEAST) -> float:
    """The median forward+backward of `spec` on `micro_batch` random sequences, in seconds."""
    from distval.train.loop import loss_of

    model = build_model(spec, seed=0, device=device)
    tokens = torch.randint(spec.vocab_size, (micro_batch, spec.seq_len), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)
    times: list[float] = []
    began_all = time.perf_counter()
    while len(times) < warmup + least or time.perf_counter() - began_all < seconds:
        began = time.perf_counter()
        logits = model(tokens)
        loss_of(logits, {"tokens": tokens}).backward()
        devices.synchronize(device)
        times.append(time.perf_counter() - began)
        model.zero_grad(set_to_none=True)
    return statistics.median(times[warmup:])
