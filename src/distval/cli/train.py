"""`distval train` and `distval compare`: one strategy trained with metrics, checkpoints and
restarts; every strategy on the same workload against a single-process reference."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

from distval import knobs
from distval.cli.app import (
    ExpectFile,
    JsonOut,
    TraceDir,
    TraceSteps,
    app,
    check_outputs,
    check_training,
    finish,
    judged,
    load_expectations,
    make_console,
    option,
    split_list,
    trace_config,
)
from distval.cli.flags import config_flags
from distval.launch.config import LAUNCH, LaunchOptions
from distval.strategies.config import BUCKET_HELP, bucket_sizes
from distval.train.config import TrainConfig

# the training workload: the knobs `train` and `compare` share, in --help's order
WORKLOAD = ("model", "steps", "micro_batch", "grad_accum", "global_batch", "optim.lr", "optim.warmup_steps",
            "optim.clip", "seed", "precision", "compile", "data", "task", "strategy_cfg.bucket_mb",
            "strategy_cfg.comm_hook", "strategy_cfg.powersgd_rank", "strategy_cfg.mixed_precision")
RUN = ("ckpt.dir", "ckpt.every", "ckpt.keep", "ckpt.async_save", "ckpt.resume", "metrics.log_jsonl",
       "metrics.tensorboard", "metrics.readback", "health.slow_ratio", "health.replicas_every", "health.on_nan",
       "health.window", "health.min_loss", "health.spike", "health.imbalance")


@app.command("train")
@config_flags("cfg", TrainConfig, only=("strategy", *WORKLOAD, *RUN), defaults={"strategy": "pytorch_ddp"})
@config_flags("opts", LaunchOptions, only=(*LAUNCH[:5], "max_restarts", *LAUNCH[5:]))
def train_cmd(
    cfg: TrainConfig, opts: LaunchOptions,
    trace: TraceSteps = None, trace_dir: TraceDir = Path("distval-report/traces"),
    expect: ExpectFile = None,
    json: JsonOut = None,
) -> int:
    """Train the built-in decoder with one data-parallel strategy; per-step metrics; checkpoints, resume, restarts."""
    from distval.ckpt import command as ckpt_cmd
    from distval.launch import detect_mode, planned_world_size
    from distval.train.progress import ProgressView
    from distval.train.run import run_train

    check_training(cfg, opts)
    expectations = load_expectations(expect)
    check_outputs({"--json": json, "--log-jsonl": Path(cfg.metrics.log_jsonl) if cfg.metrics.log_jsonl else None})
    cfg = dataclasses.replace(cfg, trace=trace_config(trace, cfg.steps, trace_dir, cfg.strategy))
    cfg = dataclasses.replace(cfg, ckpt=ckpt_cmd.prepare(cfg, planned_world_size(opts)), metrics=cfg.metrics.resolved())
    report = run_train(cfg, opts, watchers=[ProgressView(cfg.steps, f"train {cfg.strategy}")])  # live, on stderr
    ckpt_cmd.annotate(report, cfg.ckpt, ckpt_cmd.job_run_id(detect_mode(), opts.run_id))
    return finish(judged(report, expectations), json, make_console())


@app.command("compare")
@config_flags("workload", TrainConfig, only=WORKLOAD, skip=("strategy_cfg.bucket_mb",), defaults={"steps": 10},
              build=dict)  # built below, once the strategy is known
@config_flags("opts", LaunchOptions, only=("nproc", "backend", "timeout_s"))
def compare_cmd(
    workload: dict, opts: LaunchOptions,
    strategies: Annotated[
        str, option("--strategies", help="Comma list of strategies (default: the DDP family).")
    ] = "all",
    bucket_mb: Annotated[str, option("--bucket-mb", help=BUCKET_HELP)] = "25",
    calibration: Annotated[
        Optional[Path],
        option("--calibration", help="A `comm bench --json` file: adds the planner's predicted step time "
               "(the step costs measured on one rank are saved into it)."),
    ] = None,
    html: Annotated[
        Optional[Path], option("--html", help="Also write a self-contained HTML report (step-time plot).")
    ] = None,
    trace: TraceSteps = None,
    trace_dir: TraceDir = Path("distval-report/traces"),
    json: JsonOut = None,
) -> int:
    """Every strategy on the same workload: parity with one process, step time, memory, traffic."""
    from distval import strategies as strategy_mod
    from distval.launch import detect_mode
    from distval.train.compare import compare_runs, run_compare

    if (mode := detect_mode()) != "local":  # each rank would start a reference job and the strategies' own
        raise ValueError(f"compare starts local jobs of its own (a one-process reference, then each strategy): run "
                         f"it on one node without an outer launcher (found {mode}); across nodes, train each "
                         f"strategy under it (`distval train --strategy NAME`)")

    names = (
        strategy_mod.DDP_FAMILY if strategies == "all" else [strategy_mod.check_name(n) for n in split_list(strategies)]
    )
    sizes = bucket_sizes(bucket_mb)
    # the workload as the multi-process runs see it (dp runs as the one-process reference does)
    first = next((n for n in names if not strategy_mod.REGISTRY[n].single_process), "simple_ddp_ga")
    cfg = knobs.build(TrainConfig, {**workload, ("strategy",): first, ("strategy_cfg", "bucket_mb"): sizes[0]})
    check_training(cfg, opts)
    check_outputs({"--json": json, "--html": html})
    runs = compare_runs(names, sizes)
    traces = {label: trace_config(trace, cfg.steps, trace_dir, label) for label, _, _ in runs}
    if calibration is not None:
        from distval.plan.calibration import load

        load(str(calibration))  # a file that is not a distval bench JSON: one line, exit 2, before training
    report = run_compare(cfg, names, opts, str(calibration) if calibration else None, traces, sizes)
    console = make_console()
    return finish(report, json, console, html)
