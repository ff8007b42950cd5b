"""`distval train` and `distval compare`: one strategy trained with metrics, checkpoints and
restarts; every strategy on the same workload against a single-process reference."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Optional

from distval.cli.app import (
    STRATEGIES_HELP,
    Backend,
    Deadline,
    ExpectWorld,
    HangAfter,
    HangKillAfter,
    JsonOut,
    Nproc,
    Timeout,
    TraceDir,
    TraceSteps,
    app,
    bucket_sizes,
    check_outputs,
    check_training,
    finish,
    launch_options,
    make_console,
    option,
    split_list,
    trace_config,
    train_config,
    workload_options,
)
from distval.results import atomic_write_text


@app.command("train")
@workload_options()
def train_cmd(
    strategy: Annotated[str, option("--strategy", help=STRATEGIES_HELP)] = "pytorch_ddp",
    workload: Any = None,
    log_jsonl: Annotated[Optional[Path], option("--log-jsonl", help="Append one JSON line per step (rank 0).")] = None,
    tensorboard: Annotated[Optional[Path], option(
        "--tensorboard", help="Write TensorBoard scalars to this folder.")] = None,
    ckpt_dir: Annotated[Optional[Path], option(
        "--ckpt-dir", help="Save checkpoints in this folder, created if missing (docs/checkpointing.md).")] = None,
    ckpt_every: Annotated[int, option("--ckpt-every", help="Save every N steps, and after the last.")] = 10,
    ckpt_keep: Annotated[int, option("--ckpt-keep", help="Keep the newest K checkpoints.")] = 3,
    ckpt_async: Annotated[bool, option(
        "--ckpt-async/--no-ckpt-async", help="Write checkpoints in a background thread.")] = True,
    resume: Annotated[Optional[str], option(
        "--resume", help="auto (newest valid checkpoint in --ckpt-dir, none: step 0) or a checkpoint folder.")] = None,
    max_restarts: Annotated[int, option(
        "--max-restarts", help="Restart the workers up to N times after a failure, each time from the latest valid "
        "checkpoint (local; under torchrun give it to torchrun).")] = 0,
    straggler_ratio: Annotated[float, option(
        "--straggler-ratio", help="A rank whose compute time stays this many times its peers' median (over a "
        "50-step window) is a straggler (docs/health.md).")] = 1.15,
    check_replicas_every: Annotated[int, option(
        "--check-replicas-every", help="Compare every rank's parameters bit for bit every N steps (0: never).")] = 50,
    on_nan: Annotated[str, option(
        "--on-nan", help="warn: a non-finite loss or gradient is a FAIL in the report; stop: stop every rank before "
        "the update, naming the rank (nothing non-finite is saved).")] = "warn",
    metrics_readback: Annotated[str, option(
        "--metrics-readback", help="When a step's loss, gradient norm and times reach the host: late (one step on, "
        "so nothing in a step waits for the GPU), now (every step: a host sync on a GPU), auto (late on a GPU, now "
        "on CPU).")] = "auto",
    trace: TraceSteps = None, trace_dir: TraceDir = Path("distval-report/traces"),
    nproc: Nproc = None, backend: Backend = "auto", expect_world: ExpectWorld = None, timeout: Timeout = "60s",
    deadline: Deadline = None, hang_after: HangAfter = "8s", hang_kill_after: HangKillAfter = "10m",
    json: JsonOut = None,
) -> int:
    """Train the built-in decoder with one data-parallel strategy; per-step metrics; checkpoints, resume, restarts."""
    from distval.ckpt import command as ckpt_cmd
    from distval.ckpt.config import CheckpointConfig
    from distval.health.monitor import HealthConfig
    from distval.launch import detect_mode, planned_world_size
    from distval.train.compare import run_train
    from distval.train.metrics import MetricsConfig
    from distval.train.progress import ProgressView

    cfg = train_config(workload, strategy,
                       ckpt=CheckpointConfig(dir=str(ckpt_dir) if ckpt_dir else None, every=ckpt_every, keep=ckpt_keep,
                                             async_save=ckpt_async, resume=resume),
                       metrics=MetricsConfig(log_jsonl=str(log_jsonl) if log_jsonl else None,
                                             tensorboard=str(tensorboard) if tensorboard else None,
                                             readback=metrics_readback),
                       health=HealthConfig(slow_ratio=straggler_ratio, every=check_replicas_every, on_nan=on_nan))
    opts = launch_options(nproc, backend, expect_world, timeout, deadline, hang_after, hang_kill_after,
                          max_restarts=max_restarts)
    check_training(cfg, opts)
    check_outputs({"--json": json, "--log-jsonl": log_jsonl})
    cfg = dataclasses.replace(cfg, trace=trace_config(trace, cfg.steps, trace_dir, cfg.strategy))
    cfg = dataclasses.replace(cfg, ckpt=ckpt_cmd.prepare(cfg, planned_world_size(opts)), metrics=cfg.metrics.resolved())
    report = run_train(cfg, opts, watchers=[ProgressView(cfg.steps, f"train {cfg.strategy}")])  # live, on stderr
    ckpt_cmd.annotate(report, cfg.ckpt, ckpt_cmd.job_run_id(detect_mode(), opts.run_id))
    return finish(report, json, make_console())


@app.command("compare")
@workload_options(steps=10)
def compare_cmd(
    strategies: Annotated[
        str, option("--strategies", help="Comma list of strategies (default: the DDP family).")
    ] = "all",
    workload: Any = None,
    calibration: Annotated[
        Optional[Path],
        option("--calibration", help="A `comm bench --json` file: adds the planner's predicted step time."),
    ] = None,
    html: Annotated[
        Optional[Path], option("--html", help="Also write a self-contained HTML report (step-time plot).")
    ] = None,
    trace: TraceSteps = None,
    trace_dir: TraceDir = Path("distval-report/traces"),
    nproc: Nproc = None,
    backend: Backend = "auto",
    timeout: Timeout = "60s",
    json: JsonOut = None,
) -> int:
    """Every strategy on the same workload: parity with one process, step time, memory, traffic."""
    from distval import strategies as strategy_mod
    from distval.train.compare import compare_runs, run_compare

    names = (
        strategy_mod.DDP_FAMILY if strategies == "all" else [strategy_mod.check_name(n) for n in split_list(strategies)]
    )
    # the workload as the multi-process runs see it (dp runs as the one-process reference does)
    first = next((n for n in names if not strategy_mod.REGISTRY[n].single_process), "simple_ddp_ga")
    cfg = train_config(workload, first, sweep=True)
    sizes = bucket_sizes(workload["bucket_mb"])
    opts = launch_options(nproc, backend, None, timeout, None)
    check_training(cfg, opts)
    check_outputs({"--json": json, "--html": html})
    runs = compare_runs(names, sizes)
    traces = {label: trace_config(trace, cfg.steps, trace_dir, label) for label, _, _ in runs}
    if calibration is not None:
        from distval.plan.calibration import load

        load(str(calibration))  # a file that is not a distval bench JSON: one line, exit 2, before training
    report = run_compare(cfg, names, opts, str(calibration) if calibration else None, traces, sizes)
    console = make_console()
    code = finish(report, json, console)
    if html:
        from distval.report.html import render_html

        atomic_write_text(html, render_html(report.to_dict()))
        console.print(f"wrote {html}")
    return code
