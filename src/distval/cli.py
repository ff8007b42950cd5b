"""The `distval` command line: each command parses its flags, calls the library, renders.

Errors a user can cause (a bad flag, size, dtype, path) end in one line on stderr and exit code 2,
before anything is written; an environment that cannot run the job ends in exit code 3.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from distval import __version__
from distval.comm.names import BENCH_OPS, CHECK_OPS
from distval.doctor.command import register as register_doctor
from distval.drill import register as register_drill
from distval.emulate.command import register as register_emulate
from distval.plan import presets
from distval.plan.command import register as register_plan
from distval.report import terminal
from distval.results import (
    EXIT_CANNOT_RUN,
    EXIT_USAGE,
    CannotRun,
    Report,
    atomic_write_text,
    check_writable,
    output_dir,
    write_json,
)
from distval.slurm import register as register_slurm
from distval.units import parse_duration, parse_size

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Validate, benchmark, profile and harden distributed PyTorch training.")
comm_app = typer.Typer(no_args_is_help=True, help="Collective correctness and bandwidth.")
app.add_typer(comm_app, name="comm")
register_plan(app)
register_drill(app)
register_doctor(app)
register_emulate(app)
register_slurm(app)

# -- options shared by every command that launches ranks ------------------------------------------------
Nproc = Annotated[Optional[int], typer.Option("--nproc", help="Local workers to start (default: number of GPUs, else 2). Ignored under torchrun/Slurm.")]
Backend = Annotated[str, typer.Option("--backend", help="auto (nccl on CUDA, else gloo), gloo, nccl or mpi.")]
ExpectWorld = Annotated[Optional[int], typer.Option("--expect-world", help="Fail fast unless the world has exactly N ranks (catches every process running alone).")]
Timeout = Annotated[str, typer.Option("--timeout", help="Per-collective and rendezvous timeout, e.g. 60s.")]
Deadline = Annotated[Optional[str], typer.Option("--deadline", help="Stop the whole local job after this long, naming each rank's last status, e.g. 10m.")]
JsonOut = Annotated[Optional[Path], typer.Option("--json", help="Write the report as JSON (schema distval.report/1).")]


# Commands import torch-backed modules (launch, comm, train) inside their bodies, so `--help` and
# `distval plan` answer without paying for `import torch`.


def launch_options(nproc, backend, expect_world, timeout, deadline):
    from distval.launch import LaunchOptions

    return LaunchOptions(nproc=nproc, backend=backend, expect_world=expect_world,
                         timeout_s=parse_duration(timeout, "--timeout"),
                         deadline_s=parse_duration(deadline, "--deadline") if deadline else None)


def make_console() -> Console:
    """The terminal's width on a terminal; 132 columns into a pipe or file (rich would use 80)."""
    return Console() if sys.stdout.isatty() else Console(width=132)


def split_list(text: str) -> list[str]:
    return [x for x in (s.strip() for s in text.split(",")) if x]


def finish(report: Report | None, json_path: Path | None, console: Console, skip_tables=()) -> int:
    """Render on the rank that reports; write JSON; return the exit code (0 on other ranks)."""
    if report is None:
        return 0
    terminal.render(report, console, skip_tables=skip_tables)
    if json_path is not None:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")
    return report.exit_code()


@app.callback(invoke_without_command=True)
def _root(version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False) -> None:
    if version:
        print(f"distval {__version__}")
        raise typer.Exit(0)


@comm_app.command("check")
def comm_check(
    ops: Annotated[str, typer.Option("--ops", help=f"Comma list of {', '.join(CHECK_OPS)}, or all.")] = "all",
    dtypes: Annotated[str, typer.Option("-d", "--dtypes", help="Comma list of dtypes (float32,float64,float16,bfloat16,int32,int64,uint8,int8), or all.")] = "all",
    counts: Annotated[Optional[str], typer.Option("--counts", help="Comma list of element counts per rank to check (default 0,1,7,1000,65537).")] = None,
    check_iters: Annotated[int, typer.Option("-c", "--check-iters", help="Repeat every check N times with fresh inputs.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the input generator.")] = 0,
    nproc: Nproc = None, backend: Backend = "auto", expect_world: ExpectWorld = None, timeout: Timeout = "60s",
    deadline: Deadline = None, json: JsonOut = None,
) -> int:
    """Exact correctness of every collective, dtype, reduce op and odd size; names the bad rank and index."""
    from distval.comm import check as check_mod

    sizes = dict(check_mod.SIZES) if counts is None else {c: _count(c) for c in split_list(counts)}
    cfg = check_mod.CheckConfig(ops=split_list(ops), dtypes=split_list(dtypes), sizes=sizes, iters=check_iters, seed=seed)
    opts = launch_options(nproc, backend, expect_world, timeout, deadline)
    if json:
        check_writable(json, "--json")
    return finish(check_mod.run_check(cfg, opts), json, make_console())


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--counts: {text!r} is not a whole number of elements") from None
    if value < 0:
        raise ValueError(f"--counts: {value} is negative")
    return value


@comm_app.command("bench")
def comm_bench(
    minbytes: Annotated[str, typer.Option("-b", "--minbytes", help="Smallest size in bytes (K/M/G binary).")] = "8",
    maxbytes: Annotated[str, typer.Option("-e", "--maxbytes", help="Largest size in bytes.")] = "128M",
    stepfactor: Annotated[float, typer.Option("-f", "--stepfactor", help="Multiply the size by this each step.")] = 2.0,
    stepbytes: Annotated[Optional[str], typer.Option("-i", "--stepbytes", help="Add this many bytes each step instead of -f.")] = None,
    iters: Annotated[int, typer.Option("-n", "--iters", help="Timed iterations per size.")] = 20,
    warmup: Annotated[int, typer.Option("-w", "--warmup-iters", help="Untimed iterations per size.")] = 5,
    check: Annotated[int, typer.Option("-c", "--check", help="Correctness passes after timing (0: none).")] = 1,
    ops: Annotated[str, typer.Option("--ops", help=f"Comma list of {', '.join(BENCH_OPS)}, or all.")] = "all_reduce",
    dtype: Annotated[str, typer.Option("-d", "--datatype", help="Element type, e.g. float32, bfloat16, int8.")] = "float32",
    redop: Annotated[str, typer.Option("-o", "--op", help="Reduce op: sum, prod, min, max, avg.")] = "sum",
    root: Annotated[int, typer.Option("-r", "--root", help="Root rank of rooted collectives.")] = 0,
    inplace: Annotated[str, typer.Option("--inplace", help="both, in or out.")] = "both",
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Write the sweep as CSV.")] = None,
    nproc: Nproc = None, backend: Backend = "auto", expect_world: ExpectWorld = None, timeout: Timeout = "60s",
    deadline: Deadline = None, json: JsonOut = None,
) -> int:
    """nccl-tests-compatible sweep: algbw, busbw, in/out-of-place, p50/p95, #wrong, α–β fit per op."""
    from distval.comm import bench as bench_mod
    from distval.launch import planned_world_size

    cfg = bench_mod.BenchConfig(
        ops=split_list(ops), dtype=dtype, min_bytes=parse_size(minbytes, "-b"), max_bytes=parse_size(maxbytes, "-e"),
        factor=stepfactor, step_bytes=parse_size(stepbytes, "-i") if stepbytes else None, iters=iters, warmup=warmup,
        check_iters=check, redop=redop, root=root, inplace=inplace)
    opts = launch_options(nproc, backend, expect_world, timeout, deadline)
    world_size = planned_world_size(opts)
    if root >= world_size:
        raise ValueError(f"-r {root} is not a rank of a world of {world_size} (ranks 0..{world_size - 1})")
    for path, flag in ((json, "--json"), (csv, "--csv")):
        if path:
            check_writable(path, flag)
    report = bench_mod.run_bench(cfg, opts)
    console = make_console()
    if report is not None and report.table("bench") is not None:
        print(bench_mod.nccl_text(report.table("bench"), cfg, report.meta.get("world_size", 0), report.meta.get("copy_ceiling_gbps")))
        if csv:
            atomic_write_text(csv, bench_mod.csv_text(report.table("bench")))
            console.print(f"wrote {csv}")
    return finish(report, json, console, skip_tables=("bench",))


def _train_config(model, strategy, steps, micro_batch, grad_accum, global_batch, lr, warmup, clip, seed, precision,
                  data, task, bucket_mb, comm_hook, powersgd_rank, mixed_precision, ckpt=None):
    from distval.strategies.base import StrategyConfig
    from distval.train.loop import TrainConfig

    return TrainConfig(model=model, strategy=strategy, steps=steps, micro_batch=micro_batch, grad_accum=grad_accum,
                       global_batch=global_batch, lr=lr, warmup_steps=warmup, clip=clip, seed=seed, precision=precision,
                       data=data, task=task, strategy_cfg=StrategyConfig(bucket_mb=bucket_mb, comm_hook=comm_hook,
                                                              powersgd_rank=powersgd_rank,
                                                              mixed_precision=mixed_precision),
                       **(ckpt or {}))


def _check_training(cfg, opts, outputs: dict[str, Optional[Path]]) -> None:
    """Everything a user can get wrong, before any worker starts: batch split, data, outputs."""
    from distval.launch import planned_world_size
    from distval.train.data import validate_source

    cfg.check_world(planned_world_size(opts))
    validate_source(cfg.data_config(), presets.model(cfg.model).vocab_size)
    for flag, path in outputs.items():
        if path:
            check_writable(path, flag)


Model = Annotated[str, typer.Option("--model", help="Model preset: tiny, small, gpt2, smollm2-135m, ...")]
Steps = Annotated[int, typer.Option("--steps", help="Optimizer steps.")]
MicroBatch = Annotated[int, typer.Option("--micro-batch", help="Sequences per rank per micro-batch.")]
GradAccum = Annotated[int, typer.Option("--grad-accum", help="Micro-batches per optimizer step.")]
GlobalBatch = Annotated[Optional[int], typer.Option("--global-batch", help="Sequences per step; must equal micro-batch x ranks x grad-accum.")]
Lr = Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW, warm-up then cosine).")]
Warmup = Annotated[int, typer.Option("--warmup", help="Warm-up steps.")]
Clip = Annotated[float, typer.Option("--clip", help="Clip the global gradient norm to this (0: off).")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the model init and the data order.")]
Precision = Annotated[str, typer.Option("--precision", help="fp32 or bf16 (autocast).")]
Data = Annotated[str, typer.Option("--data", help="synthetic, a .txt/.jsonl/.csv/.parquet path, or hf:NAME (offline cache).")]
Task = Annotated[str, typer.Option("--task", help="lm (next token) or classify (label, text columns).")]
BucketMb = Annotated[float, typer.Option("--bucket-mb", help="Bucket cap in MiB (as torch's bucket_cap_mb) of bucket_ddp_async, pytorch_ddp, zero1 and zero2.")]
CommHook = Annotated[str, typer.Option("--comm-hook", help="pytorch_ddp: none, fp16, bf16 or powersgd.")]
PowerSGDRank = Annotated[int, typer.Option("--powersgd-rank", help="Rank of PowerSGD's approximation.")]
MixedPrecision = Annotated[str, typer.Option("--mixed-precision", help="fsdp2: none or bf16 (bf16 parameters for compute, fp32 gradient reduction).")]


@app.command("train")
def train_cmd(
    strategy: Annotated[str, typer.Option("--strategy", help="simple_ddp, simple_ddp_ga, simple_ddp_hook, simple_ddp_async, bucket_ddp_async, pytorch_ddp, zero1, zero2, zero3, pytorch_zero1, fsdp2.")] = "pytorch_ddp",
    model: Model = "tiny", steps: Steps = 20, micro_batch: MicroBatch = 2, grad_accum: GradAccum = 1,
    global_batch: GlobalBatch = None, lr: Lr = 3e-3, warmup: Warmup = 5, clip: Clip = 1.0, seed: Seed = 0,
    precision: Precision = "fp32", data: Data = "synthetic", task: Task = "lm", bucket_mb: BucketMb = 25.0, comm_hook: CommHook = "none",
    powersgd_rank: PowerSGDRank = 1, mixed_precision: MixedPrecision = "none",
    log_jsonl: Annotated[Optional[Path], typer.Option("--log-jsonl", help="Append one JSON line per step (rank 0).")] = None,
    tensorboard: Annotated[Optional[Path], typer.Option("--tensorboard", help="Write TensorBoard scalars to this folder.")] = None,
    ckpt_dir: Annotated[Optional[Path], typer.Option("--ckpt-dir", help="Save checkpoints in this existing folder (docs/checkpointing.md).")] = None,
    ckpt_every: Annotated[int, typer.Option("--ckpt-every", help="Save every N steps, and after the last.")] = 10,
    ckpt_keep: Annotated[int, typer.Option("--ckpt-keep", help="Keep the newest K checkpoints.")] = 3,
    ckpt_async: Annotated[bool, typer.Option("--ckpt-async/--no-ckpt-async", help="Write checkpoints in a background thread.")] = True,
    resume: Annotated[Optional[str], typer.Option("--resume", help="auto (newest valid checkpoint in --ckpt-dir, none: step 0) or a checkpoint folder.")] = None,
    max_restarts: Annotated[int, typer.Option("--max-restarts", help="Restart the workers up to N times after a failure, each time from the latest valid checkpoint (local; under torchrun give it to torchrun).")] = 0,
    nproc: Nproc = None, backend: Backend = "auto", expect_world: ExpectWorld = None, timeout: Timeout = "60s",
    deadline: Deadline = None, json: JsonOut = None,
) -> int:
    """Train the built-in decoder with one data-parallel strategy; per-step metrics; checkpoints, resume, restarts."""
    import dataclasses

    from distval.ckpt import command as ckpt_cmd
    from distval.launch import detect_mode, planned_world_size
    from distval.train.compare import run_train

    cfg = _train_config(model, strategy, steps, micro_batch, grad_accum, global_batch, lr, warmup, clip, seed, precision,
                        data, task, bucket_mb, comm_hook, powersgd_rank, mixed_precision,
                        ckpt={"ckpt_dir": str(ckpt_dir) if ckpt_dir else None, "ckpt_every": ckpt_every,
                              "ckpt_keep": ckpt_keep, "ckpt_async": ckpt_async, "resume": resume})
    opts = dataclasses.replace(launch_options(nproc, backend, expect_world, timeout, deadline), max_restarts=max_restarts)
    _check_training(cfg, opts, {"--json": json, "--log-jsonl": log_jsonl})
    ckpt_cmd.prepare(cfg, planned_world_size(opts), detect_mode())
    if tensorboard:
        from distval.train.metrics import check_tensorboard

        check_tensorboard()
    cfg.log_jsonl = str(log_jsonl.resolve()) if log_jsonl else None
    cfg.tensorboard = str(tensorboard.resolve()) if tensorboard else None
    from distval.train.progress import ProgressView

    report = run_train(cfg, opts, watchers=[ProgressView(cfg.steps, f"train {cfg.strategy}")])  # live, on stderr
    ckpt_cmd.annotate(report, cfg)
    return finish(report, json, make_console(), skip_tables=("steps",) if steps > 30 else ())


@app.command("compare")
def compare_cmd(
    strategies: Annotated[str, typer.Option("--strategies", help="Comma list of strategies (default: the DDP family).")] = "all",
    model: Model = "tiny", steps: Steps = 10, micro_batch: MicroBatch = 2, grad_accum: GradAccum = 1,
    global_batch: GlobalBatch = None, lr: Lr = 3e-3, warmup: Warmup = 5, clip: Clip = 1.0, seed: Seed = 0,
    precision: Precision = "fp32", data: Data = "synthetic", task: Task = "lm", bucket_mb: BucketMb = 25.0, comm_hook: CommHook = "none",
    powersgd_rank: PowerSGDRank = 1, mixed_precision: MixedPrecision = "none",
    calibration: Annotated[Optional[Path], typer.Option("--calibration", help="A `comm bench --json` file: adds the planner's predicted step time.")] = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Also write a self-contained HTML report (step-time plot).")] = None,
    nproc: Nproc = None, backend: Backend = "auto", timeout: Timeout = "60s", json: JsonOut = None,
) -> int:
    """Every strategy on the same workload: parity with one process, step time, memory, traffic."""
    from distval import strategies as strategy_mod
    from distval.train.compare import compact_table, run_compare

    names = strategy_mod.DDP_FAMILY if strategies == "all" else [strategy_mod.check_name(n) for n in split_list(strategies)]
    cfg = _train_config(model, names[0], steps, micro_batch, grad_accum, global_batch, lr, warmup, clip, seed, precision,
                        data, task, bucket_mb, comm_hook, powersgd_rank, mixed_precision)
    opts = launch_options(nproc, backend, None, timeout, None)
    _check_training(cfg, opts, {"--json": json, "--html": html})
    if calibration is not None:
        from distval.plan.calibration import load

        load(str(calibration))  # a file that is not a distval bench JSON: one line, exit 2, before training
    report = run_compare(cfg, names, opts, str(calibration) if calibration else None)
    console = make_console()
    code = finish(report, json, console, skip_tables=("strategies",))
    console.print(compact_table(report))
    if html:
        from distval.report.html import render_html

        atomic_write_text(html, render_html(report.to_dict()))
        console.print(f"wrote {html}")
    return code


@app.command("run")
def run_cmd(
    out: Annotated[Path, typer.Option("--out", help="Folder for report.json and report.html.")] = Path("distval-report"),
    quick: Annotated[bool, typer.Option("--quick", help="A smoke test in seconds: fewer sizes and iterations.")] = False,
    nproc: Nproc = None, backend: Backend = "auto", expect_world: ExpectWorld = None, timeout: Timeout = "60s",
    deadline: Deadline = None, json: JsonOut = None,
) -> int:
    """The acceptance ladder on this machine: comm check, then a comm bench sweep; one report."""
    from distval import ladder  # imports the HTML renderer only for this command

    cfg = ladder.RunConfig.quick(str(out)) if quick else ladder.RunConfig(out_dir=str(out))
    opts = launch_options(nproc, backend, expect_world, timeout, deadline)
    if json:
        check_writable(json, "--json")
    out_dir = output_dir(out, "--out")
    report = ladder.run_ladder(cfg, opts)
    console = make_console()
    code = finish(report, json, console, skip_tables=("bench", "check_matrix"))
    if report is not None:
        paths = ladder.write_outputs(report, out_dir)
        console.print(f"wrote {paths['json']} and {paths['html']}")
    return code


def main(argv: list[str] | None = None) -> None:
    try:
        code = app(args=argv, prog_name="distval", standalone_mode=False)
    except ValueError as e:
        _fail(str(e), EXIT_USAGE)
    except CannotRun as e:
        _fail(str(e), EXIT_CANNOT_RUN)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as e:
        # Usage errors of click (or the click Typer vendors, depending on its version) carry
        # exit_code 2 and a format_message(); Abort is Ctrl-C at a prompt.
        if type(e).__name__ == "NoArgsIsHelpError":  # `distval` or `distval comm` alone: show the help
            print(e.format_message())
            sys.exit(0)
        if getattr(e, "exit_code", None) == EXIT_USAGE and hasattr(e, "format_message"):
            _fail(e.format_message(), EXIT_USAGE)
        if type(e).__name__ == "Abort":
            _fail("interrupted", 130)
        raise
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    first = " ".join(message.strip().split("\n")[:1])
    print(f"distval: error: {first}", file=sys.stderr)
    sys.exit(code)
