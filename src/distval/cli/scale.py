"""`distval scale`: training throughput at a ladder of world sizes next to the planner's prediction.
The flags are the training workload's (as `distval train`), ScaleConfig's and LaunchOptions'."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

from distval.cli.app import (
    ExpectFile,
    JsonOut,
    app,
    check_outputs,
    check_training,
    finish,
    judged,
    load_expectations,
    make_console,
    option,
)
from distval.cli.flags import config_flags
from distval.cli.train import WORKLOAD
from distval.launch.config import LAUNCH, LaunchOptions
from distval.scale.config import ScaleConfig
from distval.train.config import TrainConfig


@app.command("scale")
@config_flags("cfg", TrainConfig, only=("strategy", *WORKLOAD), defaults={"strategy": "pytorch_ddp", "steps": 50})
@config_flags("scale", ScaleConfig)
@config_flags("opts", LaunchOptions, only=LAUNCH)
def scale_cmd(
    cfg: TrainConfig, scale: ScaleConfig, opts: LaunchOptions,
    calibration: Annotated[Optional[Path], option(
        "--calibration", help="A `comm bench --json` file to plan with instead of benching (its step costs used "
        "where it has the strategy's; else measured on the one-rank point and saved into it, as compare "
        "does).")] = None,
    html: Annotated[Optional[Path], option("--html", help="Also write a self-contained HTML report (the scaling "
                                           "chart).")] = None,
    expect: ExpectFile = None,
    json: JsonOut = None,
) -> int:
    """Measured scaling: tokens/s and efficiency at 1, 2, 4, ... ranks, next to the planner's prediction."""
    from distval.launch import detect_mode, planned_world_size
    from distval.scale import run

    expectations = load_expectations(expect)
    check_outputs({"--json": json, "--html": html})
    if calibration is not None:
        from distval.plan.calibration import load

        load(str(calibration))  # not a bench report: one line, exit 2, before anything runs
    if scale.from_reports:
        report = run.join_points(cfg, scale)
    elif (mode := detect_mode()) != "local":
        if scale.worlds is not None or scale.strong:
            raise ValueError(f"under {mode} this job is one point of the ladder: drop --worlds/--strong, run one job "
                             "per world size (for strong scaling, each with the --micro-batch that keeps the global "
                             "batch) and join them with `distval scale --join p1.json,p2.json,...`")
        check_training(cfg, opts)
        report = run.run_point(cfg, scale, opts)
    else:
        top = planned_world_size(opts)
        for world in scale.ladder(top):  # every point's batch and world, before the first launch
            check_training(run.at_world(cfg, scale, world, scale.ladder(top)[-1]),
                           dataclasses.replace(opts, nproc=world))
        report = run.run_scale(cfg, scale, opts, str(calibration) if calibration else None,
                               progress=lambda world: print(f"distval scale: {world} rank(s)", flush=True))
    console = make_console()
    return finish(judged(report, expectations), json, console, html)
