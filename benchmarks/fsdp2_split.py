"""Where does fsdp2's step go on CPU ranks, against what the plan counts? (docs/plan.md "How close")

Two measurements without the profiler (a trace's split of a CPU rank is blurred by the
profiler's own cost):

1. **The harness's split.** `distval train --strategy fsdp2`: FSDP2's all-gathers and
   reduce-scatters go through distval's layer (its custom collectives), so every step record holds
   their waits (on CPU each blocks the training thread) beside the step and the optimizer phase
   (which holds the wait for the gradient norm's all_reduce, DTensor's own); the rest is
   forward+backward with FSDP2's own work.
2. **FSDP2's own work at world N.** FSDP2 skips its all-gather path (copy-in, the call, copy-out)
   and DTensor's redistributions when its group has one rank, so the one-rank step the plan's step
   costs come from (`compare`'s reference rank) never runs them. `python -m
   distval.train.worldcost`, which compare runs for its step costs, times the model under FSDP2 on
   N local processes, alternately on a fake process group of one (torch's testing backend: nothing
   moves) and on a real Gloo group of N: the forward+backward (less its waits) and optimizer
   phase FSDP2 adds at N.

With `--calibration bench.json` (a `comm bench --json` into which `compare --calibration` saved
fsdp2's step costs) the plan's own figures for the same step are printed beside them.

    python benchmarks/fsdp2_split.py                        # 2 tiny ranks, 40 steps
    python benchmarks/fsdp2_split.py --nproc 3 --calibration bench.json

About a minute on the 2-core host; nothing else should run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def harness_split(nproc: int, model: str, steps: int, tmp: Path) -> dict[str, float]:
    """`distval train --strategy fsdp2`'s own split of a step (median after 5 steps): the step, the
    optimizer phase, the waits on the collectives the layer counts and the rest."""
    report = tmp / "train.json"
    done = subprocess.run([sys.executable, "-m", "distval", "train", "--nproc", str(nproc), "--model", model,
                           "--strategy", "fsdp2", "--steps", str(steps), "--json", str(report)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"distval train failed ({done.returncode}):\n{done.stderr[-2000:]}")
    rows = json.loads(report.read_text())["tables"]["steps"]["rows"][5:]

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)
    return {"step": median("step_time_s"), "optimizer": median("optimizer_s"), "waits": median("comm_blocked_s"),
            "calls": median("comm_calls"),
            "rest": statistics.median(r["step_time_s"] - r["optimizer_s"] - r["comm_blocked_s"] for r in rows)}


def at_world(nproc: int, model: str, micro_batch: int) -> dict[str, Any]:
    """`python -m distval.train.worldcost` (what compare adds to fsdp2's step costs): fsdp2's
    forward+backward less its waits and optimizer phase at world 1 and at `nproc` ranks, the real
    group's 4-byte all_reduce, and the share of the parameters held."""
    done = subprocess.run([sys.executable, "-m", "distval.train.worldcost", "--strategy", "fsdp2", "--model", model,
                           "--micro-batch", str(micro_batch), "--world", str(nproc), "--threads", "1"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the local-group run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def planned(calibration: str, nproc: int, model: str, micro_batch: int) -> dict[str, float] | None:
    """The plan's fsdp step on `nproc` ranks from the calibration file (its fsdp2 step costs), as
    compare predicts it: per-op communication, compute and the optimizer phase, in seconds."""
    import dataclasses

    from distval.plan import PlanConfig, evaluate, resolve
    from distval.plan.calibration import load
    from distval.plan.schedule import COMM
    from distval.train.stepcosts import at_rank_speed

    cost = load(calibration).cost("fsdp", "fsdp2")
    if cost is None:
        return None
    cost = at_rank_speed(cost, nproc)  # as compare.predicted_step: ranks outnumbering the cores
    plan = PlanConfig(model=model, micro_batch=micro_batch, world_size=nproc, peak_tflops=cost.peak_flops / 1e12,
                      mfu=cost.mfu, strategy="fsdp", calibration=calibration, overlap=False)
    result = evaluate(plan, dataclasses.replace(resolve(plan), cost=cost))
    out = {"step": result.step_time_s or 0.0, "compute": (result.compute_time_s or 0.0) - result.optimizer_time_s,
           "optimizer": result.optimizer_time_s}
    for p in result.phases:
        for t in p.tasks:
            if t.stream == COMM:
                out[t.op] = out.get(t.op, 0.0) + p.repeat * (t.duration_s or 0.0)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--calibration", help="a comm bench --json holding fsdp2's step costs (compare --calibration)")
    args = p.parse_args()

    ms = lambda s: f"{s * 1e3:6.2f}"  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        b = harness_split(args.nproc, args.model, args.steps, Path(tmp))
    print(f"fsdp2, {args.nproc} {args.model} ranks, {args.steps} steps, no profiler (ms per step, p50)")
    print(f"  step {ms(b['step'])}, optimizer phase {ms(b['optimizer'])}, waits on its {b['calls']:.0f} collectives "
          f"{ms(b['waits'])}, the rest (forward+backward, FSDP2's own work) {ms(b['rest'])}")
    world = at_world(args.nproc, args.model, args.micro_batch)
    print(f"FSDP2 on {args.nproc} local processes, a fake group of one and a real one of {args.nproc} "
          "(distval.train.worldcost)")
    for n, seconds in world["fb_s"].items():
        print(f"  world {n}: forward+backward less waits {ms(seconds)}, optimizer phase "
              f"{ms(world['optimizer_s'][n])}, the rank holding {world['held'][n]:.2f} of the parameters")
    print(f"  the real group's 4-byte all_reduce {ms(world['norm_s'])}")

    if args.calibration:
        plan = planned(args.calibration, args.nproc, args.model, args.micro_batch)
        if plan is None:
            print(f"{args.calibration}: no fsdp2 step costs (run compare --calibration with fsdp2 first)")
            return 1
        print(f"the plan from {args.calibration}: step {ms(plan['step'])}, forward+backward with FSDP2's one-rank "
              f"cost {ms(plan['compute'])}, optimizer step {ms(plan['optimizer'])}, the norm's all_reduce "
              f"{ms(plan.get('all_reduce', 0.0))}, all_gather {ms(plan.get('all_gather', 0.0))}, "
              f"reduce_scatter {ms(plan.get('reduce_scatter', 0.0))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
