"""`distval run`: the acceptance ladder on this machine (or across nodes under torchrun/Slurm),
one report. Stages run in order inside one set of workers, so the job pays for start-up once:

  1. comm check   every collective, dtype and size class, exact
  2. comm bench   a small sweep of the collectives training uses, with α–β fits

Later issues add stages (plan, train, compare, drill). The report goes to OUT/report.json and a
self-contained OUT/report.html.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distval import meta
from distval.comm import bench, check
from distval.launch import JobResult, LaunchOptions
from distval.rank import RankContext
from distval.report.html import render_html
from distval.results import Report, atomic_write_text, write_json
from distval.runner import execute

DEFAULT_BENCH_OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]


@dataclass
class RunConfig:
    out_dir: str = "distval-report"
    check: check.CheckConfig = field(default_factory=check.CheckConfig)
    bench: bench.BenchConfig = field(default_factory=lambda: bench.BenchConfig(
        ops=list(DEFAULT_BENCH_OPS), min_bytes=1024, max_bytes=16 * 2**20, factor=4, iters=20, warmup=5))

    @classmethod
    def quick(cls, out_dir: str) -> RunConfig:
        """A smoke-test ladder in a few seconds: fewer sizes and iterations, same coverage of ops."""
        return cls(out_dir=out_dir,
                   check=check.CheckConfig(sizes={"one": 1, "odd": 7, "non_pow2": 1000}),
                   bench=bench.BenchConfig(ops=list(DEFAULT_BENCH_OPS), min_bytes=1024, max_bytes=2**20, factor=8,
                                           iters=5, warmup=1))


def run_rank(ctx: RankContext, cfg: RunConfig) -> dict[str, Any]:
    return {"check": check.check_rank(ctx, cfg.check), "bench": bench.bench_rank(ctx, cfg.bench)}


def build_report(job: JobResult, cfg: RunConfig) -> Report:
    check_report = check.build_report(_stage(job, "check"), cfg.check)
    bench_report = bench.build_report(_stage(job, "bench"), cfg.bench)
    report = Report("run", meta=meta.collect(job, cfg, copy_ceiling_gbps=bench_report.meta["copy_ceiling_gbps"],
                                             stages=["comm check", "comm bench"], timing=bench_report.meta["timing"]))
    report.checks = check_report.checks + bench_report.checks
    report.tables = check_report.tables + bench_report.tables
    return report


def _stage(job: JobResult, key: str) -> JobResult:
    return JobResult(job.mode, job.backend, job.world_size, [r[key] for r in job.results], job.ranks)


def run_ladder(cfg: RunConfig, opts: LaunchOptions) -> Report | None:
    return execute("run", run_rank, cfg, opts, lambda job: build_report(job, cfg))


def write_outputs(report: Report, out_dir: Path) -> dict[str, Path]:
    paths = {"json": out_dir / "report.json", "html": out_dir / "report.html"}
    write_json(report, paths["json"])
    atomic_write_text(paths["html"], render_html(report.to_dict()))
    return paths
