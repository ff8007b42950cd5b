"""A strategy's own work at world N, measured in one process (docs/plan.md "Step costs").

compare's reference rank times each strategy at world 1. A strategy that skips work there
(`Strategy.skips_work_at_world_1`: FSDP2 leaves out its whole all-gather path, copy-in, the call
and copy-out, when its group has one rank) never shows that time in its one-rank step cost. This
runs the model under the strategy on torch's fake process group (its testing backend: every
collective returns at once and moves nothing) of world 1 and of world N, alternately, in a fresh
process:

    python -m distval.train.fakeworld --strategy fsdp2 --model tiny --micro-batch 2 --world 2 --threads 1

and prints one JSON line {"fb_s": {"1": s, "N": s}, "held": {"1": 1.0, "N": ~1/N}}: the median
forward+backward at each, and the share of the parameters the one rank held there. The
difference is the forward+backward work the strategy adds at N with no communication at all;
compare adds it to the strategy's per-micro-batch overhead (`world_cost_s`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

ROUNDS, STEPS, WARMUP = 2, 10, 3  # world 1 and N alternately, ROUNDS times; per round STEPS timed after WARMUP


def world_cost_s(strategy: str, model: str, micro_batch: int, world: int, threads: int,
                 mixed_precision: str = "none", timeout_s: float = 300.0) -> float | None:
    """Seconds the strategy's forward+backward adds per micro-batch at `world` ranks over one (at
    least 0); None where torch's fake process group cannot run it (an older torch), or it failed."""
    args = ["--strategy", strategy, "--model", model, "--micro-batch", str(micro_batch), "--world", str(world),
            "--threads", str(threads), "--mixed-precision", mixed_precision]
    try:
        done = subprocess.run([sys.executable, "-m", "distval.train.fakeworld", *args], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    fb = json.loads(done.stdout.splitlines()[-1])["fb_s"]
    return max(0.0, fb[str(world)] - fb["1"])


def measure(strategy_name: str, model: str, micro_batch: int, world: int, mixed_precision: str
            ) -> tuple[float, float]:
    """This process: the median forward+backward of the model under the strategy on a fake group of
    `world`, and the share of the parameters this rank holds (1/world when it shards them)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    from distval import strategies
    from distval.comm.layer import Comm
    from distval.plan import presets
    from distval.strategies.config import StrategyConfig
    from distval.train.model import build_model

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        spec = presets.model(model)
        net = build_model(spec, seed=0)
        whole = sum(p.numel() for p in net.parameters())
        strategy = strategies.REGISTRY[strategy_name](net, Comm(), StrategyConfig(mixed_precision=mixed_precision))
        held = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in strategy.model.parameters())
        tokens = torch.randint(0, spec.vocab_size, (micro_batch, spec.seq_len))
        times = []
        for i in range(WARMUP + STEPS):
            start = time.perf_counter()
            with strategy.micro_batch(is_last=True):
                strategy.model(tokens).float().square().mean().backward()
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
            strategy.model.zero_grad(set_to_none=True)
        return statistics.median(times), held / whole
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--mixed-precision", default="none")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    fb: dict[int, list[float]] = {1: [], args.world: []}
    held: dict[int, float] = {}
    for _ in range(ROUNDS):
        for world in fb:
            seconds, held[world] = measure(args.strategy, args.model, args.micro_batch, world, args.mixed_precision)
            fb[world].append(seconds)
    print(json.dumps({"fb_s": {str(w): statistics.median(v) for w, v in fb.items()},
                      "held": {str(w): share for w, share in held.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
