"""Where does fsdp2's step go on CPU ranks, against what the plan counts? (docs/plan.md "How close")

The harness splits fsdp2's step like any strategy's since its all-gathers and reduce-scatters go
through the layer (FSDP2's custom collectives, session 20), but as one total of waits; a trace's
split of a CPU rank is blurred by the profiler's own cost. Two measurements without the profiler:

1. **Blocking collectives.** `distval train --strategy fsdp2` with torch.distributed's
   `all_gather_single` and `reduce_scatter_single` (the calls FSDP2 makes) wrapped in a timer by a
   `sitecustomize` module put on the workers' path. On CPU every one of them blocks the training
   thread, so its wall time is what the step pays for it: per step the all-gathers' and
   reduce-scatters' count and time (mean over steps and ranks), next to the step time and the
   optimizer phase (which holds the wait for the gradient norm's all_reduce, a functional
   collective not wrapped here).
2. **FSDP2's own work at world N.** FSDP2 skips its all-gather path (copy-in, the call, copy-out)
   when its group has one rank, so the one-rank step the plan's step costs come from
   (`compare`'s reference rank) never runs it. `python -m distval.train.fakeworld`, which compare
   runs for its step costs, runs the model under FSDP2 on a fake process group (torch's testing
   backend: collectives return at once, nothing moves) of world 1 and of world N, alternately: the
   forward+backward time FSDP2 adds at N with no communication at all.

With `--calibration bench.json` (a `comm bench --json` into which `compare --calibration` saved
fsdp2's step costs) the plan's own figures for the same step are printed beside them.

    python benchmarks/fsdp2_split.py                        # 2 tiny ranks, 40 steps
    python benchmarks/fsdp2_split.py --nproc 3 --calibration bench.json

About a minute on the 2-core host; nothing else should run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TIMED = ("all_gather_single", "reduce_scatter_single")
HOOK = f'''
import atexit, json, os, time
import torch.distributed as dist

_calls = {{name: [] for name in {TIMED!r}}}


def _timed(name):
    call = getattr(dist, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = call(*args, **kwargs)
        group = kwargs.get("group")
        if group is None or group == dist.group.WORLD:  # FSDP2's; distval's bookkeeping has a group of its own
            output = kwargs.get("output", args[0] if args else None)
            _calls[name].append([getattr(output, "numel", lambda: 0)(), time.perf_counter() - start])
        return out
    return timed


for _name in _calls:
    setattr(dist, _name, _timed(_name))


@atexit.register
def _dump():
    if any(_calls.values()):
        with open(os.path.join(os.environ["FSDP2_SPLIT_OUT"], f"{{os.getpid()}}.json"), "w") as f:
            json.dump(_calls, f)
'''


def blocking(nproc: int, model: str, steps: int, tmp: Path) -> dict[Any, float]:
    """Per step: the blocking all-gathers and reduce-scatters by output size (count, seconds), the
    step and the optimizer phase."""
    hook, calls = tmp / "hook", tmp / "calls"
    hook.mkdir()
    calls.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    report = tmp / "train.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
           "FSDP2_SPLIT_OUT": str(calls)}
    done = subprocess.run([sys.executable, "-m", "distval", "train", "--nproc", str(nproc), "--model", model,
                           "--strategy", "fsdp2", "--steps", str(steps), "--json", str(report)],
                          capture_output=True, text=True, env=env)
    ranks = [json.loads(p.read_text()) for p in calls.iterdir()]
    if done.returncode != 0 or len(ranks) != nproc:
        sys.exit(f"distval train failed ({done.returncode}, {len(ranks)} ranks timed):\n{done.stderr[-2000:]}")
    rows = json.loads(report.read_text())["tables"]["steps"]["rows"][5:]
    out = {"step_p50": statistics.median(r["step_time_s"] for r in rows),
           "step_mean": statistics.fmean(r["step_time_s"] for r in rows),
           "optimizer_p50": statistics.median(r["optimizer_s"] for r in rows),
           "optimizer_mean": statistics.fmean(r["optimizer_s"] for r in rows)}
    for name in TIMED:  # every step, the warm-up's too: the mean over all steps and ranks, per output size
        for numel in sorted({n for r in ranks for n, _ in r[name]}):
            per_rank = [[t for n, t in r[name] if n == numel] for r in ranks]
            out[(name, numel, "calls")] = statistics.fmean(len(t) for t in per_rank) / steps
            out[(name, numel, "s")] = statistics.fmean(sum(t) for t in per_rank) / steps
    return out


def fake_world(nproc: int, model: str, micro_batch: int) -> dict[str, dict[str, float]]:
    """`python -m distval.train.fakeworld` (what compare adds to fsdp2's step cost): fsdp2's
    forward+backward on a fake group of 1 and of `nproc` ranks, and the share of the parameters held."""
    done = subprocess.run([sys.executable, "-m", "distval.train.fakeworld", "--strategy", "fsdp2", "--model", model,
                           "--micro-batch", str(micro_batch), "--world", str(nproc), "--threads", "1"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the fake-group run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def planned(calibration: str, nproc: int, model: str, micro_batch: int) -> dict[str, float] | None:
    """The plan's fsdp step on `nproc` ranks from the calibration file (its fsdp2 step costs), as
    compare predicts it: per-op communication, compute and the optimizer phase, in seconds."""
    import dataclasses

    from distval.plan import PlanConfig, evaluate, resolve
    from distval.plan.calibration import load
    from distval.plan.schedule import COMM
    from distval.train.compare import at_rank_speed

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
        b = blocking(args.nproc, args.model, args.steps, Path(tmp))
    print(f"fsdp2, {args.nproc} {args.model} ranks, {args.steps} steps, no profiler (ms per step)")
    print(f"  step                  p50 {ms(b['step_p50'])}   mean {ms(b['step_mean'])}")
    print(f"  optimizer phase       p50 {ms(b['optimizer_p50'])}   mean {ms(b['optimizer_mean'])}")
    blocked = 0.0
    for key in [k for k in b if isinstance(k, tuple) and k[2] == "calls"]:
        name, numel, _ = key
        seconds = b[(name, numel, "s")]
        blocked += seconds
        print(f"  {name:21s} of {numel:8d} elements: {b[key]:.1f} calls blocking {ms(seconds)} "
              f"({ms(seconds / b[key])} a call)")
    rest = b["step_mean"] - b["optimizer_mean"] - blocked
    print(f"  the rest (forward+backward, FSDP2's own work, mean)  {ms(rest)}")

    fake = fake_world(args.nproc, args.model, args.micro_batch)
    print("FSDP2 alone in one process on a fake group (no communication: distval.train.fakeworld)")
    for world, seconds in fake["fb_s"].items():
        print(f"  world {world}: forward+backward {ms(seconds)}, the rank holding {fake['held'][world]:.2f} "
              "of the parameters")

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
