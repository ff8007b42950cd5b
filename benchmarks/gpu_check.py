"""Every distval command on the GPU backend, one line per item: PASS, FAIL or SKIP with the figure.

Run by benchmarks/gpu_check.sh on a machine with one or more GPUs, with that machine's own torch
(no CPU pin). Items that need more GPUs than the machine has say SKIP and why. `--backend gloo`
runs the same items on CPU ranks: a dry run of this script itself where no GPU is at hand.

    bash benchmarks/gpu_check.sh                   # all GPUs, model small
    bash benchmarks/gpu_check.sh --only resume     # one item (comma-separated names)
    python benchmarks/gpu_check.py --backend gloo --nproc 2 --model tiny   # CPU dry run

Items: check, bench, timing (all_reduce latency by each timing method: blocking, burst, burst
from a CUDA graph; and comm bench's burst against a bare torch.distributed burst loop), harness
(distval train against a bare loop of the same model, eager and compiled), train (every
strategy), compare (every strategy and dp), plan (docs/plan.md "How close" on this machine: a bench
with its per-call cost, then compare --calibration of benchmarks/plan_accuracy.py's strategies:
measured against predicted step time per strategy, and the category carrying the error; FAIL
outside compare's 0.67-1.5x), resume (SIGKILL after the first checkpoint, restart, losses bitwise equal to
an uninterrupted run: a full-form and a sharded-form strategy), drill (needs 2 ranks), doctor, run.
Exit 0 when nothing FAILed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

STRATEGIES = ["simple_ddp", "simple_ddp_ga", "simple_ddp_hook", "simple_ddp_async", "bucket_ddp_async", "pytorch_ddp",
              "zero1", "zero2", "zero3", "pytorch_zero1", "fsdp2"]
RESUMED = ["pytorch_ddp", "zero2"]  # the full form (rank 0 writes) and the sharded DCP form (every rank)
ITEMS = ["check", "bench", "timing", "harness", "train", "compare", "plan", "resume", "drill", "doctor", "run"]
PLANNED = ["pytorch_ddp", "bucket_ddp_async", "simple_ddp", "zero1", "zero2", "zero3", "fsdp2"]  # plan_accuracy.py's


class Item(Exception):
    """The outcome of one item, raised from deep inside it: SKIP or FAIL with a reason."""

    def __init__(self, status: str, text: str):
        super().__init__(text)
        self.status, self.text = status, text


def distval(*args: str, out: Path, timeout: float = 600, env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    """Run `distval ARGS --json OUT`; returns (exit code, the report, the last stderr line)."""
    out.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "distval", *args, "--json", str(out)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    report = json.loads(out.read_text()) if out.exists() else {}
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    return proc.returncode, report, lines[-1] if lines else ""


def rows(report: dict, table: str) -> list[dict]:
    return report.get("tables", {}).get(table, {}).get("rows", [])


def counts(report: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in report.get("summary", {}).items() if n)


class Checker:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        self.common = ["--nproc", str(args.nproc), "--backend", args.backend]
        self.failed = 0

    def item(self, name: str, fn: Callable[[], str]) -> None:
        start = time.perf_counter()
        try:
            status, text = "PASS", fn()
        except Item as e:
            status, text = e.status, e.text
        except subprocess.TimeoutExpired as e:
            status, text = "FAIL", f"timed out after {e.timeout:.0f}s"
        self.failed += status == "FAIL"
        print(f"{status:<4}  {name:<28} {text}  ({time.perf_counter() - start:.0f}s)", flush=True)

    def run_ok(self, *args: str, name: str, **kw) -> dict:
        code, report, last = distval(*args, out=self.work / f"{name}.json", **kw)
        if code != 0:
            raise Item("FAIL", f"exit {code}: {last}")
        return report

    # -- the items --------------------------------------------------------------------------------

    def check(self) -> str:
        return counts(self.run_ok("comm", "check", *self.common, name="check"))

    def bench(self) -> str:
        report = self.run_ok("comm", "bench", *self.common, "-b", "8", "-e", "64M", "-f", "8", "-n", "20", "-w", "5",
                             name="bench")
        ar = [r for r in rows(report, "bench") if r["op"] == "all_reduce" and r["time_us_p50"] is not None]
        fit = next((r for r in rows(report, "alpha_beta") if r["op"] == "all_reduce"), None)
        if not ar or fit is None:
            raise Item("FAIL", "no all_reduce rows or fit in the report")
        small, large = ar[0], ar[-1]
        return (f"all_reduce {small['bytes']} B: {small['time_us_p50']:.1f} us, {large['bytes']} B: "
                f"{large['time_us_p50']:.1f} us, busbw {large['busbw_gbps']:.2f} GB/s; alpha {fit['alpha_us']:.1f} us, "
                f"beta {fit['beta_gbps']:.2f} GB/s; {counts(report)}")

    def timing(self) -> str:
        """all_reduce p50 per op at 8 B and 1 MiB by each method (blocking pays a host round trip per op
        that a burst timed between CUDA events does not), then the bench's burst against a bare loop."""
        methods = [("blocking", ["--timing", "blocking"]), ("burst", ["--timing", "burst"])]
        if self.args.backend == "nccl":
            methods.append(("graph", ["-G"]))
        parts = []
        for label, flags in methods:
            try:
                report = self.run_ok("comm", "bench", *self.common, "-b", "8", "-e", "1M", "-f", "131072", "-n",
                                     "200", "-w", "20", *flags, name=f"timing-{label}")
            except Item as e:
                import torch

                if label != "graph" or not torch.version.hip:
                    raise
                # hipGraph capture of RCCL collectives depends on the ROCm/RCCL release: say so, go on
                parts.append(f"graph SKIP on ROCm {torch.version.hip} (capture failed: {str(e)[-160:]})")
                continue
            ar = {r["bytes"]: r for r in rows(report, "bench") if r["op"] == "all_reduce"}
            parts.append(f"{label} " + ", ".join(f"{b} B {r['time_us_p50']:.1f} us" for b, r in sorted(ar.items())))
        proc = subprocess.run([sys.executable, "benchmarks/overhead_vs_bare.py", "--nproc", str(self.args.nproc),
                               "-b", "8", "-e", "64M", "-f", "8", "--timing", "burst", "--min-ratio", "0.95"],
                              capture_output=True, text=True, timeout=900)
        ratios = [line.split()[4] for line in proc.stdout.splitlines() if line[:6].strip()[:1].isdigit()]
        if not ratios:
            raise Item("FAIL", "; ".join(parts) + f"; overhead_vs_bare.py exit {proc.returncode}: {proc.stderr[-300:]}")
        parts.append(f"bench/bare burst busbw ratio per size (8 B..64 MiB): {', '.join(ratios)}")
        return "; ".join(parts)

    def harness(self) -> str:
        """The harness's overhead case: smollm2-135m bf16 micro-batch 8 on one GPU, harness against a bare loop."""
        out = []
        for label, flags in (("eager", []), ("eager, figures read every step", ["--readback", "now"]),
                             ("compiled", ["--compile"])):
            proc = subprocess.run([sys.executable, "benchmarks/harness_vs_bare.py", "--model", "smollm2-135m",
                                   "--precision", "bf16", "--micro-batch", "8", "--steps", "20", "--rounds", "2",
                                   *flags], capture_output=True, text=True, timeout=1800)
            last = [line for line in proc.stdout.splitlines() if line.strip()]
            if not any(line.startswith("ratio") for line in last):  # exit 1 is a goal not met; no ratio: it broke
                raise Item("FAIL", "; ".join(out) + f"; {label}: exit {proc.returncode}: {proc.stderr[-300:]}")
            out.append(f"{label}: " + " | ".join(last[-3:]))
        return "; ".join(out)

    def train(self, strategy: str) -> str:
        report = self.run_ok("train", *self.common, "--model", self.args.model, "--steps", "6", "--strategy", strategy,
                             name=f"train-{strategy}")
        steps = rows(report, "steps")
        p50 = statistics.median(s["step_time_s"] for s in steps[1:] or steps)  # the first step warms up
        return (
            f"loss {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}, step {p50 * 1e3:.1f} ms, "
            f"MFU {steps[-1]['mfu']:.1%}"
        )

    def compare(self) -> str:
        report = self.run_ok("compare", *self.common, "--model", self.args.model, "--steps", "6", "--strategies",
                             ",".join([*STRATEGIES, "dp"]), name="compare", timeout=1200)
        dp = next((c for c in report.get("checks", []) if c["name"].startswith("compare dp")), None)
        table = rows(report, "strategies")
        worst = max(table, key=lambda r: r["max_rel_param_diff"] or 0.0)
        bitwise = [r["strategy"] for r in table if r["bitwise_equal"]]
        return (f"{len(table)} strategies, {counts(report)}; worst parity {worst['max_rel_param_diff']:.1e} "
                f"({worst['strategy']}); bitwise equal to the reference: {', '.join(bitwise) or 'none'}"
                + (f"; dp: {dp['status']} {dp['summary']}" if dp else ""))

    def plan(self) -> str:
        if self.args.nproc < 2:
            raise Item("SKIP", "needs 2 ranks (one GPU each)")
        bench = self.work / "plan-bench.json"
        self.run_ok("comm", "bench", *self.common, "--ops", "all_reduce,all_gather,reduce_scatter", "-b", "1K",
                    "-e", "64M", "-f", "4", "-n", "20", "-w", "5", name="plan-bench")
        report = self.run_ok("compare", *self.common, "--model", self.args.model, "--steps", "20", "--strategies",
                             ",".join(PLANNED), "--calibration", str(bench), name="plan", timeout=1200)
        table = [r for r in rows(report, "strategies") if r["prediction_ratio"] is not None]
        if not table:
            raise Item("FAIL", "no strategy has a prediction")
        close = sum(0.8 <= r["prediction_ratio"] <= 1.25 for r in table)
        text = "; ".join(f"{r['strategy']} {r['step_time_p50_s'] * 1e3:.1f}/{r['predicted_step_time_s'] * 1e3:.1f} ms "
                         f"{r['prediction_ratio']:.2f}x" + (f" ({miss})" if (miss := r["prediction_miss"]) else "")
                         for r in table)
        if any(r["prediction_miss"] for r in table):
            raise Item("FAIL", f"outside 0.67-1.5x: {text}")
        return f"{close} of {len(table)} within 0.8-1.25x (measured/plan): {text}"

    def resume(self, strategy: str) -> str:
        """SIGKILL rank 0 at step 7 (after the synchronous checkpoint at 5: an async save still
        in flight when a rank dies is lost, and the restart would begin at step 0); the agent
        restarts the workers, they must resume from step 5, and every step's loss must equal the
        uninterrupted run's bit for bit."""
        base = ["train", *self.common, "--model", self.args.model, "--steps", "12", "--strategy", strategy,
                "--ckpt-every", "5", "--no-ckpt-async"]
        dirs = [self.work / f"ckpt-{strategy}-{run}" for run in "ab"]
        clean = self.run_ok(*base, "--ckpt-dir", str(dirs[0]), name=f"resume-{strategy}-a")
        killed = self.run_ok(*base, "--ckpt-dir", str(dirs[1]), "--max-restarts", "2",
                             "--resume", "auto", name=f"resume-{strategy}-b",
                             env={"DISTVAL_FAULT": "step=7,rank=0,action=kill"})
        attempts = rows(killed, "attempts")
        if len(attempts) < 2:
            raise Item("FAIL", f"the fault did not fire: {len(attempts)} attempt(s)")
        resumed = attempts[-1]
        if resumed["resumed_from_step"] != 5:
            raise Item("FAIL", f"attempt {resumed['attempt']} resumed from {resumed['resumed_from_step']}, not the "
                               f"checkpoint at step 5")
        a = [s["loss"] for s in rows(clean, "steps")]
        b = [s["loss"] for s in rows(killed, "steps")]
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            raise Item("FAIL", f"losses differ from step {first}: {a[first:first + 1]} vs {b[first:first + 1]}")
        return (f"killed at step 7, attempt {resumed['attempt']} resumed from step 5 (recovery "
                f"{resumed['recovery_s']:.1f}s); {len(a)} losses bitwise equal to an uninterrupted run")

    def drill(self) -> str:
        if self.args.nproc < 2:
            raise Item("SKIP", "the drills fault rank 1 of at least 2 ranks: needs 2 GPUs "
                               f"(this machine has {self.args.nproc}); the resume item covers SIGKILL on one")
        report = self.run_ok("drill", "--nproc", str(self.args.nproc), name="drill", timeout=1200)
        return "; ".join(f"{r['drill']} {r['status']}" for r in rows(report, "drills"))

    def doctor(self) -> str:
        code, report, last = distval("doctor", "--nproc", str(self.args.nproc), out=self.work / "doctor.json")
        bad = [c for c in report.get("checks", []) if c["status"] in ("FAIL", "ERROR")]
        if code not in (0, 1) or bad:
            raise Item("FAIL", f"exit {code}: " + ("; ".join(f"{c['name']}: {c['summary']}" for c in bad) or last))
        return counts(report)

    def run(self) -> str:
        return counts(self.run_ok("run", *self.common, "--out", str(self.work / "run"), name="run", timeout=1200))


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="nccl", help="nccl (default) or gloo (a CPU dry run of this script)")
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: every GPU)")
    p.add_argument("--model", default="small")
    p.add_argument("--only", default=",".join(ITEMS), help=f"comma-separated items of: {', '.join(ITEMS)}")
    args = p.parse_args()
    import torch

    n = gpus()
    from distval.device import collective_library, gpu_runtime, nccl_version

    if args.backend == "nccl" and n == 0:
        print("SKIP  all items: no GPU visible to this torch "
              f"({torch.__version__}, {gpu_runtime() or 'CPU build'}); use --backend gloo for a CPU dry run")
        return 0
    args.nproc = args.nproc or (n if args.backend == "nccl" else 2)
    only = set(args.only.split(","))
    if only - set(ITEMS):
        p.error(f"unknown item(s) {', '.join(sorted(only - set(ITEMS)))}; choose from {', '.join(ITEMS)}")
    devices = ", ".join(torch.cuda.get_device_name(i) for i in range(n)) if n else "none"
    print(f"# distval GPU check: torch {torch.__version__} ({gpu_runtime() or 'CPU build'}, {collective_library()} "
          f"{nccl_version() or '-'}), GPUs: {devices}; backend {args.backend}, "
          f"{args.nproc} rank(s), model {args.model}", flush=True)
    with tempfile.TemporaryDirectory(prefix="distval-gpu-check-") as d:
        c = Checker(args, Path(d))
        if "check" in only:
            c.item("comm check", c.check)
        if "bench" in only:
            c.item("comm bench", c.bench)
        if "timing" in only:
            c.item("comm bench timing", c.timing)
        if "harness" in only:
            c.item("harness vs bare loop", c.harness)
        if "train" in only:
            for s in STRATEGIES:
                c.item(f"train {s}", lambda s=s: c.train(s))
        if "compare" in only:
            c.item("compare (all strategies)", c.compare)
        if "plan" in only:
            c.item("plan against measured", c.plan)
        if "resume" in only:
            for s in RESUMED:
                c.item(f"resume {s} after SIGKILL", lambda s=s: c.resume(s))
        if "drill" in only:
            c.item("drill", c.drill)
        if "doctor" in only:
            c.item("doctor", c.doctor)
        if "run" in only:
            c.item("run", c.run)
    print(f"# {c.failed} FAIL")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
