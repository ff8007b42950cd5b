"""Does the α–β fit survive a noisy host? Quick sweeps beside a bursty neighbour, refitted two ways.

`distval run --quick` fits each op's α–β from a five-size sweep (1 KiB-4 MiB, ×8), and the plan is
calibrated from those fits; on a loaded host a size's median can land far off its neighbours. This
runs `distval comm bench` of all_reduce, all_gather and reduce_scatter with each preset in turn
(`--presets`: iterations after warm-ups), beside a neighbour process that is busy 30-80 ms and idle
100-250 ms (about a quarter of a core; `--quiet` for none), and for every op's sweep counts the
fits least squares alone leaves without a positive slope and the fits `comm/fit.py` (least
squares, then Theil–Sen) still cannot make, with the median and lowest R².

    python benchmarks/fit_noise.py                         # 12 rounds of 5-after-1 and 10-after-2
    python benchmarks/fit_noise.py --rounds 36 --quiet

About 6.5 s a round on the 2-core host; nothing else should run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import Process
from pathlib import Path

import numpy as np

from distval.comm.fit import fit_alpha_beta, least_squares

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def neighbour() -> None:
    """Busy 30-80 ms (spinning on the clock), idle 100-250 ms, for ever: about a quarter of a core."""
    while True:
        end = time.perf_counter() + random.uniform(0.03, 0.08)
        while time.perf_counter() < end:
            continue
        time.sleep(random.uniform(0.1, 0.25))


def sweeps(report: Path) -> dict[str, tuple[list[float], list[float]]]:
    rows = json.loads(report.read_text())["tables"]["bench"]["rows"]
    out = {}
    for op in OPS:
        mine = [r for r in rows if r["op"] == op]
        oop = [r for r in mine if not r["inplace"]] or mine  # all_reduce is timed in place only
        out[op] = ([r["bytes"] for r in oop], [r["time_us_p50"] * 1e-6 for r in oop])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--presets", default="5/1,10/2", help="iterations/warm-ups, comma-separated")
    p.add_argument("--quiet", action="store_true", help="no neighbour")
    args = p.parse_args()
    presets = [tuple(int(x) for x in p.split("/")) for p in args.presets.split(",")]
    noise = None if args.quiet else Process(target=neighbour, daemon=True)
    if noise:
        noise.start()
    tally = {pre: {"fits": 0, "ls_none": 0, "none": 0, "r2": []} for pre in presets}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            for iters, warmup in presets:  # in turn: host drift hits both alike
                out = Path(tmp) / f"{iters}-{warmup}-{k}.json"
                subprocess.run([sys.executable, "-m", "distval", "comm", "bench", "--nproc", "2",
                                "--ops", ",".join(OPS), "-b", "1K", "-e", "4M", "-f", "8", "-n", str(iters),
                                "-w", str(warmup), "--no-call-cost", "--json", str(out)],
                               check=True, capture_output=True)
                t = tally[(iters, warmup)]
                for sizes, times in sweeps(out).values():
                    t["fits"] += 1
                    t["ls_none"] += least_squares(np.array(sizes), np.array(times))[1] <= 0
                    fit = fit_alpha_beta(sizes, times)
                    if fit is None:
                        t["none"] += 1
                    else:
                        t["r2"].append(fit.r2)
    if noise:
        noise.terminate()
    print(f"{args.rounds} rounds, {'no neighbour' if args.quiet else 'a bursty neighbour (about 1/4 of a core)'}")
    print("| iterations/warm-ups | fits | least squares: no positive slope | no fit after Theil–Sen | R² median "
          "| R² min |")
    print("|---|---|---|---|---|---|")
    for (iters, warmup), t in tally.items():
        r2 = t["r2"] or [float("nan")]
        print(f"| {iters}/{warmup} | {t['fits']} | {t['ls_none']} | {t['none']} | {statistics.median(r2):.2f} | "
              f"{min(r2):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
