"""`distval comm check` and `distval comm bench`: exact correctness and nccl-tests-style bandwidth
of every collective. The flags are CheckConfig's, BenchConfig's and LaunchOptions' knobs."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Optional

from distval.cli.app import (
    ExpectFile,
    JsonOut,
    check_outputs,
    comm_app,
    finish,
    judged,
    load_expectations,
    make_console,
    option,
)
from distval.cli.flags import config_flags
from distval.comm.config import BenchConfig, CheckConfig
from distval.launch.config import LAUNCH, LaunchOptions
from distval.results import atomic_write_text
from distval.scale.config import PairsConfig


@comm_app.command("check")
@config_flags("cfg", CheckConfig)
@config_flags("opts", LaunchOptions, only=LAUNCH)
def comm_check(cfg: CheckConfig, opts: LaunchOptions, json: JsonOut = None) -> int:
    """Exact correctness of every collective, dtype, reduce op and odd size; names the bad rank and index."""
    from distval.comm import check
    from distval.launch.execute import execute

    check_outputs({"--json": json})
    report = execute("comm check", check.check_rank, cfg, opts, functools.partial(check.build_report, cfg=cfg))
    return finish(report, json, make_console())


@comm_app.command("bench")
@config_flags("cfg", BenchConfig)
@config_flags("opts", LaunchOptions, only=LAUNCH)
def comm_bench(
    cfg: BenchConfig, opts: LaunchOptions,
    csv: Annotated[Optional[Path], option("--csv", help="Write the sweep as CSV.")] = None,
    expect: ExpectFile = None,
    json: JsonOut = None,
) -> int:
    """nccl-tests-compatible sweep: algbw, busbw, in/out-of-place, p50/p95, #wrong, α–β fit per op."""
    from distval.comm import bench
    from distval.launch import planned_world_size
    from distval.launch.execute import execute

    cfg.check_job(opts.backend, planned_world_size(opts))
    expectations = load_expectations(expect)
    check_outputs({"--json": json, "--csv": csv})
    report = execute("comm bench", bench.bench_rank, cfg, opts, functools.partial(bench.build_report, cfg=cfg))
    console = make_console()
    code = finish(judged(report, expectations), json, console)
    if csv and report is not None and report.table("bench") is not None:
        atomic_write_text(csv, bench.csv_text(report.table("bench")))
        console.print(f"wrote {csv}")
    return code


@comm_app.command("pairs")
@config_flags("cfg", PairsConfig)
@config_flags("opts", LaunchOptions, only=LAUNCH)
def comm_pairs(cfg: PairsConfig, opts: LaunchOptions, expect: ExpectFile = None, json: JsonOut = None) -> int:
    """Bandwidth between every pair of nodes and of ranks in a node (round-robin), each node's all_reduce and a
    compute probe: the slow node, link or rank named."""
    from distval.launch.execute import execute
    from distval.scale import pairs

    expectations = load_expectations(expect)
    check_outputs({"--json": json})
    report = execute("comm pairs", pairs.pairs_rank, cfg, opts, functools.partial(pairs.build_report, cfg=cfg))
    return finish(judged(report, expectations), json, make_console())
