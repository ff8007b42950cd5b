"""The launcher's own CPU on a small host: `distval launch --nproc 2` of a user's DDP loop with
short steps (examples/ddp_health.py, ~8 ms steps: the most steps per second for the launcher to
read) on this machine's cores, and torchrun's agent on the same job for reference.

The launching process is sampled from /proc/<pid>/stat (utime + stime of every thread of it:
the agent, the watchdog loop, the lost-time sampler, the log tails; its children, the ranks,
excluded) over the steady part of the run: from `--skip` seconds after the start to the end of
the run. Printed per launcher: every run's share of one core and the median; goal for distval:
at most 2% of a core.

    python benchmarks/launcher_cpu.py --runs 5 --seconds 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "ddp_health.py"
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * TICK_S
    except (OSError, ValueError, IndexError):
        return None


def one_run(launcher: str, steps: int, skip_s: float, out: Path) -> tuple[float, float]:
    """(the launcher's CPU share of one core over the steady part, that part's seconds)."""
    if launcher == "distval":
        cmd = [sys.executable, "-m", "distval", "launch", "--nproc", "2", "--json", str(out), str(SCRIPT),
               str(steps), "slow"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT), str(steps), "slow"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(skip_s)
    first, t0 = cpu_s(proc.pid), time.monotonic()
    last, t1 = first, t0
    while proc.poll() is None:  # the last reading before it ends (its exit's reports excluded)
        time.sleep(0.5)
        now = cpu_s(proc.pid)
        if now is not None and proc.poll() is None:
            last, t1 = now, time.monotonic()
    if proc.returncode != 0:
        raise SystemExit(f"{launcher} run failed (exit {proc.returncode}): {' '.join(cmd)}")
    if first is None or t1 - t0 < 5:
        raise SystemExit(f"the {launcher} run was too short to measure; raise --seconds")
    return (last - first) / (t1 - t0), t1 - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=30.0, help="about how long each run trains")
    parser.add_argument("--skip", type=float, default=8.0, help="seconds of start-up left out")
    parser.add_argument("--launchers", default="distval,torchrun")
    args = parser.parse_args()
    steps = int(args.seconds / 0.008)
    shares: dict[str, list[float]] = {name: [] for name in args.launchers.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for name in shares:  # alternated: the host's state is the same for both
                share, seconds = one_run(name, steps, args.skip, Path(tmp) / f"{i}.json")
                shares[name].append(share)
                print(f"run {i + 1} {name}: {share:.2%} of a core over {seconds:.0f} s", flush=True)
    print(f"\nlauncher CPU, share of one core ({os.cpu_count()} cores, 2 ranks, {args.runs} runs)")
    for name, xs in shares.items():
        print(f"  {name:9s} median {statistics.median(xs):.2%}  max {max(xs):.2%}  runs: "
              + ", ".join(f"{x:.2%}" for x in xs))


if __name__ == "__main__":
    main()
