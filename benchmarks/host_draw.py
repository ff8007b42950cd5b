"""How much does this host's own speed move between the moments a plan is calibrated and a run is measured?

The plan's forward+backward comes from the plain model timed on one rank a minute before the
strategies train (compare's step costs). No model carries what the host does between those
moments, so its draw bounds what any prediction can reach. This times the plain `--model`'s
forward+backward with one intra-op thread, pinned to one core (`--cpu`), in back-to-back windows
of `--window` steps (a `tiny` compare run is 30) for `--seconds`, and prints the windows'
medians: their spread, and the share of windows outside 0.8-1.25 of the median of all of them,
which is the share of single runs a model that predicted the host's median exactly would still
miss, and, for the median of three runs, what those shares make it (three independent windows).

    python benchmarks/host_draw.py                     # tiny, 30-step windows, 120 s, core 0
    python benchmarks/host_draw.py --pair              # the same on two cores at once (2 ranks)

Nothing else should run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

BAND = (0.8, 1.25)


def windows(model: str, micro_batch: int, window: int, seconds: float) -> list[float]:
    """Median forward+backward (s) of each back-to-back window of `window` steps, for `seconds`."""
    import torch

    from distval.plan import presets
    from distval.train.model import build_model

    torch.set_num_threads(1)
    spec = presets.model(model)
    net = build_model(spec, seed=0)
    tokens = torch.randint(0, spec.vocab_size, (micro_batch, spec.seq_len))

    def step() -> float:
        began = time.perf_counter()
        net(tokens).float().square().mean().backward()
        net.zero_grad(set_to_none=True)
        return time.perf_counter() - began

    for _ in range(5):
        step()
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        out.append(statistics.median(step() for _ in range(window)))
    return out


def outside_of_three(p: float) -> float:
    """The chance that the median of three independent runs lies beyond a bound each run passes with p."""
    return 3 * p * p * (1 - p) + p ** 3


def summary(label: str, medians: list[float]) -> str:
    centre = statistics.median(medians)
    ratios = sorted(m / centre for m in medians)
    high = sum(r > BAND[1] for r in ratios) / len(ratios)
    low = sum(r < BAND[0] for r in ratios) / len(ratios)
    q = statistics.quantiles(ratios, n=10)
    return (f"| {label} | {len(ratios)} | {centre * 1e3:.2f} | {ratios[0]:.2f} | {q[0]:.2f} | {q[-1]:.2f} | "
            f"{ratios[-1]:.2f} | {ratios[-1] / ratios[0]:.2f} | {100 * (high + low):.0f}% | "
            f"{100 * (outside_of_three(high) + outside_of_three(low)):.0f}% |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--window", type=int, default=30)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--cpu", type=int, default=0)
    p.add_argument("--pair", action="store_true", help="also time on the next core at once (two ranks' cores)")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a pinned worker: print its medians
    args = p.parse_args()
    if args.one:
        os.sched_setaffinity(0, {args.cpu})
        print(" ".join(f"{m:.6f}" for m in windows(args.model, args.micro_batch, args.window, args.seconds)))
        return 0
    cpus = [args.cpu, *([(args.cpu + 1) % (os.cpu_count() or 1)] if args.pair else [])]
    common = ["--model", args.model, "--micro-batch", str(args.micro_batch), "--window", str(args.window),
              "--seconds", str(args.seconds), "--one"]
    workers = [subprocess.Popen([sys.executable, __file__, *common, "--cpu", str(cpu)], stdout=subprocess.PIPE,
                                text=True) for cpu in cpus]
    results = [w.communicate()[0].split() for w in workers]
    print(f"{args.model}, micro-batch {args.micro_batch}, one thread, windows of {args.window} steps over "
          f"{args.seconds:.0f} s{', two cores at once' if args.pair else ''}; ratio = a window's median / the "
          f"median of all\n")
    print("| core | windows | median ms | min | p10 | p90 | max | max/min | single run outside 0.8-1.25 "
          "| median of 3 outside |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cpu, out in zip(cpus, results):
        print(summary(str(cpu), [float(x) for x in out]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
