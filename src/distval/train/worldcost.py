"""A strategy's own work at world N, measured on a real local group of N (docs/plan.md "Step costs").

compare's reference rank times each strategy at world 1. A strategy that skips work there
(`Strategy.skips_work_at_world_1`: FSDP2 leaves out its whole all-gather path, copy-in, the call
and copy-out, when its group has one rank, and DTensor's redistributions in the gradient norm)
never shows that time in its one-rank step costs. This starts N local processes (Gloo, `threads`
intra-op threads each) that time the model under the strategy, in rounds, alternately on torch's
fake process group of one rank (its testing backend: nothing moves) and on a real group of all N:

    python -m distval.train.worldcost --strategy fsdp2 --model tiny --micro-batch 2 --world 2 --threads 1

and prints one JSON line {"fb_s": {"1": s, "N": s}, "optimizer_s": {"1": s, "N": s}, "norm_s": s,
"held": {"1": 1.0, "N": ~1/N}}: medians over the ranks of each rank's median forward+backward
(less its waits in distval's layer, as the harness splits a step) and optimizer phase (gradient
norm, clipping, update), the real group's 4-byte all_reduce (the gradient norm's, which the plan
predicts apart), and the share of the parameters a rank held. The differences are the work the
strategy adds at N beyond its one-rank step (`world_cost`), which compare adds to its step costs.
A fake group of N in one process misses part of it (docs/results/2026-11-27-fsdp2-world-n.md). All N
ranks take both turns at once, so where their threads outnumber the cores both sides share them
alike.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from distval.comm.config import NORM_BYTES

ROUNDS, WARMUP = 3, 3  # world 1 and N alternately, ROUNDS times; each turn's first WARMUP steps not timed
# timed steps a turn: about TURN_S of them, within these bounds; a model whose FEWEST_STEPS take longer
# (`small`: 0.9 s a step) takes one round (rank 0's first turn sets the count for all)
TURN_S, FEWEST_STEPS, MOST_STEPS = 0.5, 5, 12
STORE_TIMEOUT_S = 60


@dataclass(frozen=True)
class WorldCost:
    """What a strategy adds at world N over its one-rank step (seconds, at least 0)."""

    fb_s: float  # per micro-batch, forward+backward less the waits in distval's layer
    optimizer_s: float  # the optimizer phase, less the gradient norm's all_reduce (the plan's own term)


def world_cost(strategy: str, model: str, micro_batch: int, world: int, threads: int,
               mixed_precision: str = "none", timeout_s: float = 300.0) -> WorldCost | None:
    """The work the strategy adds at `world` local ranks over one; None where it could not be timed
    (torch's fake process group missing on an older torch, a failed or timed-out rank)."""
    args = ["--strategy", strategy, "--model", model, "--micro-batch", str(micro_batch), "--world", str(world),
            "--threads", str(threads), "--mixed-precision", mixed_precision]
    try:
        done = subprocess.run([sys.executable, "-m", "distval.train.worldcost", *args], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    doc = json.loads(done.stdout.splitlines()[-1])
    fb, opt, n = doc["fb_s"], doc["optimizer_s"], str(world)
    return WorldCost(max(0.0, fb[n] - fb["1"]), max(0.0, opt[n] - opt["1"] - doc["norm_s"]))


def measure(strategy_name: str, model: str, micro_batch: int, mixed_precision: str, group: dict[str, Any],
            steps: int) -> dict[str, Any]:
    """This process under the strategy on the process group `group` names (init_process_group's
    arguments), `steps` timed: median forward+backward less its waits, optimizer phase and 4-byte
    all_reduce (None on one rank), and the share of the parameters this rank holds."""
    import torch
    import torch.distributed as dist

    from distval import strategies
    from distval.comm.layer import Comm
    from distval.plan import presets
    from distval.strategies.config import StrategyConfig
    from distval.train.config import OptimConfig
    from distval.train.loop import optimizer_impl
    from distval.train.model import build_model

    dist.init_process_group(**group, timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
    try:
        spec, optim = presets.model(model), OptimConfig()
        net = build_model(spec, seed=0)
        whole = sum(p.numel() for p in net.parameters())
        comm = Comm()
        strategy = strategies.REGISTRY[strategy_name](net, comm, StrategyConfig(mixed_precision=mixed_precision))
        optimizer = strategy.build_optimizer(torch.optim.AdamW, lr=optim.lr, weight_decay=optim.weight_decay,
                                             **optimizer_impl(torch.device("cpu"), strategy))
        held = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in strategy.model.parameters())
        tokens = torch.randint(0, spec.vocab_size, (micro_batch, spec.seq_len))
        fb, opt, norm = [], [], []
        world = dist.get_world_size()
        for i in range(WARMUP + steps):
            if world > 1:
                dist.barrier()  # the ranks start each step together, as the harness's do
            waited, start = comm.blocked_so_far(), time.perf_counter()
            with strategy.micro_batch(is_last=True):
                strategy.model(tokens).float().square().mean().backward()
            done = time.perf_counter()
            waited = comm.blocked_so_far() - waited
            float(strategy.clip_grad_norm(optim.clip))  # read on the host, as the harness reads the norm
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            updated = time.perf_counter()
            if world > 1:
                one = torch.ones(NORM_BYTES // 4)  # the gradient norm's fp32 all_reduce
                began = time.perf_counter()
                dist.all_reduce(one)
                norm.append(time.perf_counter() - began)
            if i >= WARMUP:
                fb.append(done - start - waited)
                opt.append(updated - done)
        return {"fb_s": statistics.median(fb), "optimizer_s": statistics.median(opt),
                "norm_s": statistics.median(norm[WARMUP:]) if norm else None, "held": held / whole}
    finally:
        dist.destroy_process_group()


def run_rank(args: argparse.Namespace, rank: int, store: Any) -> dict[str, dict[str, list[float]]]:
    """ROUNDS rounds of: the fake group of one, then the real group of `args.world` over `store`.
    The first turn times FEWEST_STEPS; from it rank 0 sets every later turn's count and the number
    of rounds (the ranks of the real group must take as many steps)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    got: dict[str, dict[str, list[float]]] = {}
    steps, rounds, r = FEWEST_STEPS, ROUNDS, 0
    while r < rounds:
        turns = {"1": {"backend": "fake", "store": FakeStore(), "rank": 0, "world_size": 1},
                 str(args.world): {"backend": "gloo", "store": dist.PrefixStore(f"round{r}", store), "rank": rank,
                                   "world_size": args.world}}
        for world, group in turns.items():
            for key, value in measure(args.strategy, args.model, args.micro_batch, args.mixed_precision, group,
                                      steps).items():
                got.setdefault(world, {}).setdefault(key, []).append(value)
            if r == 0 and world == "1":
                if rank == 0:
                    step_s = got["1"]["fb_s"][0] + got["1"]["optimizer_s"][0]
                    plan = (max(FEWEST_STEPS, min(MOST_STEPS, math.ceil(TURN_S / step_s))),
                            ROUNDS if step_s * FEWEST_STEPS <= TURN_S else 1)
                    store.set("plan", json.dumps(plan))
                steps, rounds = json.loads(store.get("plan"))
        r += 1
    return got


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--mixed-precision", default="none")
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)  # the other ranks: started by rank 0
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    if args.threads:
        torch.set_num_threads(args.threads)
    store = dist.TCPStore("127.0.0.1", args.port, args.world, is_master=args.rank == 0, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
    others = [] if args.rank else [
        subprocess.Popen([sys.executable, "-m", "distval.train.worldcost", *(argv or sys.argv[1:]), "--rank", str(r),
                          "--port", str(store.port)], stdout=subprocess.DEVNULL)
        for r in range(1, args.world)]
    try:
        store.set(f"rank{args.rank}", json.dumps(run_rank(args, args.rank, store)))
        if args.rank:  # its figures are in the store: leave without torch's teardown of the process
            os._exit(0)  # groups and store, which can abort ("terminate called without an active exception", 1 in 8)
        ranks = [json.loads(store.get(f"rank{r}")) for r in range(args.world)]
        for proc in others:
            proc.wait(timeout=STORE_TIMEOUT_S)  # each leaves once its figures are in
    finally:
        for proc in others:
            if proc.poll() is None:
                proc.kill()

    def median(world: str, key: str) -> float:  # over the ranks, of each rank's median over the rounds
        return statistics.median(statistics.median(rank[world][key]) for rank in ranks)

    worlds = ("1", str(args.world))
    print(json.dumps({"fb_s": {w: median(w, "fb_s") for w in worlds},
                      "optimizer_s": {w: median(w, "optimizer_s") for w in worlds},
                      "norm_s": median(worlds[1], "norm_s"), "held": {w: median(w, "held") for w in worlds}}),
          flush=True)
    os._exit(0)  # as the other ranks


if __name__ == "__main__":
    main()
