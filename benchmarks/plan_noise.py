"""How much does one command's measured step move between runs? Strategies trained in turn, side by side.

`plan_accuracy.py` compares each strategy's measured p50 step with the plan's; on a small shared
host a run's p50 is itself a draw. This runs `distval train` of each strategy in turn (so host
drift hits them alike), `--repeats` times per run length, and prints each run's p50 step (all
steps, and without the first five) and per strategy and length the median over runs and the
spread (max/min p50). Two strategies that do the same work (pytorch_ddp and bucket_ddp_async on
`tiny`: one 460 KB bucket each) should measure the same; their spread is what no plan can
predict (docs/plan.md "How close").

    python benchmarks/plan_noise.py                                # 2 tiny ranks, 30 and 200 steps, 3 repeats
    python benchmarks/plan_noise.py --strategies zero2,zero3 --nproc 3 --steps 50

About 1.5 minutes with the defaults on the 2-core host; nothing else should run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def p50s(report: Path) -> tuple[float, float]:
    """A run's median step time, over all steps and without the first five."""
    steps = [row["step_time_s"] for row in json.loads(report.read_text())["tables"]["steps"]["rows"]]
    return statistics.median(steps), statistics.median(steps[5:] or steps)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default="pytorch_ddp,bucket_ddp_async")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", default="30,200", help="run lengths, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    names, lengths = args.strategies.split(","), [int(s) for s in args.steps.split(",")]
    runs: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for length in lengths:
                for name in names:
                    out = Path(tmp) / f"{name}-{length}-{i}.json"
                    done = subprocess.run([sys.executable, "-m", "distval", "train", "--nproc", str(args.nproc),
                                           "--model", args.model, "--strategy", name, "--steps", str(length),
                                           "--json", str(out)], capture_output=True, text=True)
                    if done.returncode != 0 or not out.exists():
                        sys.exit(f"distval train --strategy {name} failed ({done.returncode}):\n{done.stderr[-2000:]}")
                    whole, settled = p50s(out)
                    runs.setdefault((name, length), []).append(whole)
                    print(f"repeat {i}  {length:4d} steps  {name:18s} p50 {whole * 1e3:6.2f} ms "
                          f"(without the first 5: {settled * 1e3:6.2f})", flush=True)
    print()
    for (name, length), values in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{length:4d} steps  {name:18s} p50s {' '.join(f'{v * 1e3:.1f}' for v in values)} ms  "
              f"median {statistics.median(values) * 1e3:.2f}  spread {max(values) / min(values):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
