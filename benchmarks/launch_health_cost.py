"""What the health monitor costs a launched script (`distval launch`: the step clock, the probe's
NaN/Inf and replica checks, memory, the heartbeat), against the same script under plain torchrun.

The script is a user's DDP loop (an MLP of --layers Linear(--width) layers, SGD) that times its
own optimizer steps (perf_counter around each iteration) and writes rank 0's median, the first
--warmup steps left out. Runs alternate (torchrun, distval launch with the defaults, distval
launch checking NaN every step, ...) --rounds times; printed: each variant's median step time
over the rounds and its ratio to torchrun's (goal: <= 1.02).

    python benchmarks/launch_health_cost.py --rounds 3 --steps 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = """\
import statistics, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
width, layers, steps, warmup, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    *[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(32, width)
times = []
for step in range(steps):
    t0 = time.perf_counter()
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
    times.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    open(out, "w").write(str(statistics.median(times[warmup:])))
dist.destroy_process_group()
"""

LAUNCH = [sys.executable, "-m", "distval", "launch", "--nproc", "2"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
VARIANTS = {  # name: (command, environment added)
    "torchrun": (TORCHRUN, {}),
    "torchrun, Flight Recorder on": (TORCHRUN, {"TORCH_FR_BUFFER_SIZE": "256"}),  # what distval's watchdog reads
    "distval launch, probe off": (LAUNCH + ["--check-nan-every", "0", "--check-replicas-every", "0"], {}),
    "distval launch (defaults)": (LAUNCH, {}),
    "distval launch, NaN every step": (LAUNCH + ["--check-nan-every", "1", "--check-replicas-every", "10"], {}),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    args = p.parse_args()
    medians: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        script, out = Path(tmp) / "user.py", Path(tmp) / "median"
        script.write_text(SCRIPT)
        for _ in range(args.rounds):
            for name, (cmd, env) in VARIANTS.items():
                subprocess.run([*cmd, str(script), str(args.width), str(args.layers), str(args.steps),
                                str(args.warmup), str(out)], check=True, capture_output=True, cwd=tmp,
                               env={**os.environ, **env})
                medians[name].append(float(out.read_text()))
    params = args.layers * (args.width * args.width + args.width)
    print(f"DDP MLP, {params / 1e6:.1f}M parameters, 2 Gloo ranks, {args.steps} steps ({args.warmup} left out), "
          f"{args.rounds} alternating rounds")
    base = statistics.median(medians["torchrun"])
    for name, values in medians.items():
        m = statistics.median(values)
        print(f"  {name:32s} {m * 1e3:8.2f} ms/step  x{m / base:.3f}   rounds: "
              + ", ".join(f"{v * 1e3:.2f}" for v in values))


if __name__ == "__main__":
    main()
