"""`distval comm check` and `distval comm bench`: exact correctness and nccl-tests-style bandwidth
of every collective."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from distval.cli.app import JsonOut, check_outputs, comm_app, finish, make_console, option, split_list
from distval.cli.flags import config_flags
from distval.comm.names import BENCH_OPS, CHECK_OPS
from distval.launch.job import LAUNCH, LaunchOptions
from distval.results import atomic_write_text
from distval.units import parse_size

DTYPE_HELP = "Comma list of dtypes (float32,float64,float16,bfloat16,int32,int64,uint8,int8), or all."


@comm_app.command("check")
@config_flags("opts", LaunchOptions, only=LAUNCH)
def comm_check(
    opts: LaunchOptions,
    ops: Annotated[str, option("--ops", help=f"Comma list of {', '.join(CHECK_OPS)}, or all.")] = "all",
    dtypes: Annotated[str, option("-d", "--dtypes", help=DTYPE_HELP)] = "all",
    counts: Annotated[
        Optional[str],
        option("--counts", help="Comma list of element counts per rank to check (default 0,1,7,1000,65537)."),
    ] = None,
    check_iters: Annotated[
        int, option("-c", "--check-iters", help="Repeat every check N times with fresh inputs.")
    ] = 1,
    seed: Annotated[int, option("--seed", help="Seed of the input generator.")] = 0,
    json: JsonOut = None,
) -> int:
    """Exact correctness of every collective, dtype, reduce op and odd size; names the bad rank and index."""
    from distval.comm import check
    from distval.runner import run_check

    sizes = dict(check.SIZES) if counts is None else {c: _count(c) for c in split_list(counts)}
    cfg = check.CheckConfig(ops=split_list(ops), dtypes=split_list(dtypes), sizes=sizes, iters=check_iters, seed=seed)
    check_outputs({"--json": json})
    return finish(run_check(cfg, opts), json, make_console())


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--counts: {text!r} is not a whole number of elements") from None
    if value < 0:
        raise ValueError(f"--counts: {value} is negative")
    return value


@comm_app.command("bench")
@config_flags("opts", LaunchOptions, only=LAUNCH)
def comm_bench(
    opts: LaunchOptions,
    minbytes: Annotated[str, option("-b", "--minbytes", help="Smallest size in bytes (K/M/G binary).")] = "8",
    maxbytes: Annotated[str, option("-e", "--maxbytes", help="Largest size in bytes.")] = "128M",
    stepfactor: Annotated[float, option("-f", "--stepfactor", help="Multiply the size by this each step.")] = 2.0,
    stepbytes: Annotated[Optional[str], option(
        "-i", "--stepbytes", help="Add this many bytes each step instead of -f.")] = None,
    iters: Annotated[int, option("-n", "--iters", help="Timed iterations per size.")] = 20,
    warmup: Annotated[int, option("-w", "--warmup-iters", help="Untimed iterations per size.")] = 5,
    check: Annotated[int, option("-c", "--check", help="Correctness passes after timing (0: none).")] = 1,
    ops: Annotated[str, option("--ops", help=f"Comma list of {', '.join(BENCH_OPS)}, or all.")] = "all_reduce",
    dtype: Annotated[str, option("-d", "--datatype", help="Element type, e.g. float32, bfloat16, int8.")] = "float32",
    redop: Annotated[str, option("-o", "--op", help="Reduce op: sum, prod, min, max, avg.")] = "sum",
    root: Annotated[int, option("-r", "--root", help="Root rank of rooted collectives.")] = 0,
    inplace: Annotated[str, option("--inplace", help="both, in or out.")] = "both",
    timing: Annotated[str, option("--timing", help="blocking (barrier, one op, wait: a distribution per op), burst "
                                  "(-n ops back to back, time / n, as nccl-tests), or auto: burst on CUDA, blocking "
                                  "on CPU.")] = "auto",
    graph: Annotated[bool, option("-G", "--cuda-graph", help="Capture each burst in a CUDA graph and replay it "
                                  "(nccl-tests' -G; CUDA only).")] = False,
    bursts: Annotated[int, option("--bursts", help="Burst timing: timed bursts per size.")] = 5,
    csv: Annotated[Optional[Path], option("--csv", help="Write the sweep as CSV.")] = None,
    json: JsonOut = None,
) -> int:
    """nccl-tests-compatible sweep: algbw, busbw, in/out-of-place, p50/p95, #wrong, α–β fit per op."""
    from distval.comm import bench
    from distval.launch import planned_world_size
    from distval.runner import run_bench

    cfg = bench.BenchConfig(
        ops=split_list(ops), dtype=dtype, min_bytes=parse_size(minbytes, "-b"), max_bytes=parse_size(maxbytes, "-e"),
        factor=stepfactor, step_bytes=parse_size(stepbytes, "-i") if stepbytes else None, iters=iters, warmup=warmup,
        check_iters=check, redop=redop, root=root, inplace=inplace, timing=timing, graph=graph, bursts=bursts)
    if graph and opts.backend != "nccl":
        raise ValueError(bench.GRAPH_NEEDS_CUDA)
    world_size = planned_world_size(opts)
    if root >= world_size:
        raise ValueError(f"-r {root} is not a rank of a world of {world_size} (ranks 0..{world_size - 1})")
    check_outputs({"--json": json, "--csv": csv})
    report = run_bench(cfg, opts)
    console = make_console()
    code = finish(report, json, console)
    if csv and report is not None and report.table("bench") is not None:
        atomic_write_text(csv, bench.csv_text(report.table("bench")))
        console.print(f"wrote {csv}")
    return code
