"""Does the planner predict the step time of every strategy? `comm bench` → `compare --calibration`.

Per setting (ranks × model): a `comm bench` of all_reduce, all_gather and reduce_scatter (1K-16M,
x4, with its per-call cost) saved as JSON, then `distval compare --calibration` of the strategies
below, whose reference rank also measures each strategy's own costs on one rank (the plan's step
costs, saved into the bench file). Repeated `--repeats` times, each repeat a fresh bench and
compare. The prediction is compare's own (`train/compare.py` `predicted_step`), recomputed here from
the kept files, so `--replay DIR` reprints the table of a run with the planner as it is now, and
`--replay DIR1,DIR2,...` pools the repeats of several sittings (the host's speed moves from one hour
to the next: three repeats of one sitting leave one pair or so of 21 outside the band, a different
one each sitting). Per strategy the median over repeats of measured p50 step time, the prediction,
their ratio (and the repeats' lowest and highest ratio: a miss whose repeats straddle the band is
the host's draw), and per category (forward+backward, optimizer, exposed communication) measured vs
predicted. Goal: measured/predicted in 0.8-1.25 for every strategy and setting. Prints a
markdown table (docs/plan.md "How close").

Setting `2:tiny:emulated` (root): two emulated nodes joined by a `--rate` link (`distval emulate`,
one rank each). `compare` does not run under an outer launcher, so there each strategy trains on
its own (`emulate -- train --json`), the bench runs across the nodes (`emulate -- comm bench`),
and the step costs are those of a local 2-rank compare on this host (the same ranks' work,
measured on one rank).

    python benchmarks/plan_accuracy.py --keep runs/             # 2 and 3 ranks, tiny and small
    python benchmarks/plan_accuracy.py --settings 2:tiny --repeats 1 --steps 20
    python benchmarks/plan_accuracy.py --settings 2:tiny:emulated --rate 1gbit
    python benchmarks/plan_accuracy.py --replay runs/            # the table again, nothing run
    python benchmarks/plan_accuracy.py --replay runs1/,runs2/,runs3/   # three sittings' repeats pooled

Long (1-5 minutes per setting and repeat on the 2-core host); nothing else should run.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STRATEGIES = ("pytorch_ddp", "bucket_ddp_async", "simple_ddp", "zero1", "zero2", "zero3", "fsdp2")
CATEGORIES = (("compute", "measured_compute_s", "predicted_compute_s"),
              ("optimizer", "measured_optimizer_s", "predicted_optimizer_s"),
              ("exposed comm", "measured_exposed_comm_s", "predicted_exposed_comm_s"))
BENCH = ("comm", "bench", "--ops", "all_reduce,all_gather,reduce_scatter", "-b", "1K", "-e", "16M", "-f", "4",
         "-n", "20", "-w", "5")


def distval(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "distval", *args], capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: a WARN or FAIL in the report, still a report
        sys.exit(f"distval {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")


# -- measuring: files named by tag ({nproc}-{model}-{i}, or emu_{rate}-{model}-{i}) ----------------------


def measure_local(nproc: int, model: str, steps: int, folder: Path, tag: str) -> None:
    bench = folder / f"bench-{tag}.json"
    distval(*BENCH, "--nproc", str(nproc), "--json", str(bench))
    distval("compare", "--nproc", str(nproc), "--model", model, "--steps", str(steps), "--strategies",
            ",".join(STRATEGIES), "--calibration", str(bench), "--json", str(folder / f"compare-{tag}.json"))


def measure_emulated(model: str, steps: int, rate: str, folder: Path, tag: str) -> None:
    from distval.plan.calibration import save_costs

    measure_local(2, model, steps, folder, f"{tag}_local")  # its bench file now holds the step costs
    costs = json.loads((folder / f"bench-{tag}_local.json").read_text())["tables"]["step_costs"]
    emulate = ("emulate", "--nodes", "2", "--nproc-per-node", "1", "--rate", rate, "--")
    bench = folder / f"bench-{tag}.json"
    distval(*emulate, *BENCH, "--json", str(bench))
    save_costs(str(bench), costs)
    for name in STRATEGIES:
        distval(*emulate, "train", "--model", model, "--strategy", name, "--steps", str(steps), "--json",
                str(folder / f"train-{tag}-{name}.json"))


# -- predicting, from the files -----------------------------------------------------------------------


def measured_rows(folder: Path, tag: str) -> list[dict]:
    """Per strategy the measured columns of compare's strategies table (emulated: from each
    training run's steps, as compare computes them)."""
    from distval.train.stepcosts import forward_backward_s

    if not tag.startswith("emu_"):
        return json.loads((folder / f"compare-{tag}.json").read_text())["tables"]["strategies"]["rows"]
    rows = []
    for name in STRATEGIES:
        steps = json.loads((folder / f"train-{tag}-{name}.json").read_text())["tables"]["steps"]["rows"][1:]
        counted = any(s["comm_calls"] for s in steps)  # none counted (fsdp2 on torch < 2.8): not split

        def median(f):
            return statistics.median(f(s) for s in steps)
        rows.append({"strategy": name, "step_time_p50_s": median(lambda s: s["step_time_s"]),
                     "measured_optimizer_s": median(lambda s: s["optimizer_s"]),
                     "measured_exposed_comm_s": median(lambda s: s["comm_blocked_s"]) if counted else None,
                     "measured_compute_s": median(forward_backward_s) if counted else None})
    return rows


def predicted_rows(folder: Path, tag: str) -> list[dict]:
    from distval.plan import presets
    from distval.plan.calibration import load
    from distval.train.compare import predicted_step
    from distval.train.config import TrainConfig
    from distval.train.model import build_model

    where, model, _ = tag.split("-")
    nproc = 2 if where.startswith("emu_") else int(where)
    bench = str(folder / f"bench-{tag}.json")
    costs = {c.strategy: c for c in load(bench).costs}
    tensors = sum(1 for p in build_model(presets.model(model), seed=0).parameters() if p.requires_grad)
    rows = []
    for row in measured_rows(folder, tag):
        name = row["strategy"]
        rows.append({**row, **predicted_step(TrainConfig(model=model, strategy=name), name, nproc, costs[name], bench,
                                             tensors)})
    return rows


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def table_lines(setting: str, model: str, runs: list[list[dict]]) -> tuple[list[str], int]:
    """One markdown row per strategy (medians over the runs) and how many miss 0.8-1.25."""
    lines, misses = [], 0
    for name in STRATEGIES:
        rows = [r for run in runs for r in run if r["strategy"] == name]
        if not rows:
            continue

        def med(key: str) -> float | None:
            values = [r[key] for r in rows if r.get(key) is not None]
            return statistics.median(values) if values else None

        ratios = [r["step_time_p50_s"] / r["predicted_step_time_s"] for r in rows]
        ratio = statistics.median(ratios)
        errors = {label: abs(med(m) - med(pr)) for label, m, pr in CATEGORIES
                  if med(m) is not None and med(pr) is not None}
        if med("measured_compute_s") is None:  # fsdp2: forward+backward and its collectives are one figure
            rest = med("step_time_p50_s") - med("measured_optimizer_s")
            errors["compute+comm (unsplit)"] = abs(rest - med("predicted_step_time_s") + med("predicted_optimizer_s"))
        ok = 0.8 <= ratio <= 1.25
        misses += not ok
        cats = " | ".join(f"{ms(med(m))} / {ms(med(pr))}" for _, m, pr in CATEGORIES)
        mark = "" if ok else "**"
        lines.append(f"| {setting} | {model} | {name} | {ms(med('step_time_p50_s'))} | "
                     f"{ms(med('predicted_step_time_s'))} | {mark}{ratio:.2f}{mark} | "
                     f"{min(ratios):.2f}-{max(ratios):.2f} | {cats} | {max(errors, key=errors.__getitem__)} |")
    return lines, misses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="2:tiny,3:tiny,2:small,3:small",
                   help="ranks:model or 2:model:emulated, comma-separated")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--keep", help="keep the bench, compare and train JSON files in this folder")
    p.add_argument("--rate", default="1gbit", help="the emulated link (tc rate)")
    p.add_argument("--replay", help="--keep folders, comma-separated: predict their runs again and print the table, "
                   "each setting's repeats of all the folders pooled; nothing runs")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs: list[tuple[Path, str]] = []  # (folder, tag) of every repeat
        if args.replay:
            for folder in map(Path, args.replay.split(",")):
                runs += sorted((folder, m.group(1)) for f in folder.glob("bench-*.json")
                               if (m := re.fullmatch(r"bench-([^-_]+(?:_[^-]+)?-[^-]+-\d+)\.json", f.name)))
        else:
            folder = Path(args.keep or tmp)
            folder.mkdir(parents=True, exist_ok=True)
            for setting in args.settings.split(","):
                nproc, model, *how = setting.split(":")
                for i in range(args.repeats):
                    if how == ["emulated"]:
                        runs.append((folder, f"emu_{args.rate}-{model}-{i}"))
                        measure_emulated(model, args.steps, args.rate, folder, runs[-1][1])
                    else:
                        runs.append((folder, f"{nproc}-{model}-{i}"))
                        measure_local(int(nproc), model, args.steps, folder, runs[-1][1])
        groups: dict[tuple[str, str], list[list[dict]]] = {}
        for folder, tag in runs:
            where, model, _ = tag.split("-")
            groups.setdefault((where, model), []).append(predicted_rows(folder, tag))
        lines = ["| ranks | model | strategy | measured ms | plan ms | ratio | repeats | compute ms (meas / plan) | "
                 "optimizer ms | exposed comm ms | largest error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        misses = 0
        for (where, model), runs in groups.items():
            setting = f"2 nodes, {where[4:]}" if where.startswith("emu_") else where
            more, missed = table_lines(setting, model, runs)
            lines += more
            misses += missed
    print("\n".join(lines))
    print(f"\n{misses} strategy/setting pairs outside 0.8-1.25 (medians over each setting's repeats)")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
