"""`distval launch`: the user's own script on N workers per node, as torchrun would start it, with
the hang watchdog attached (one per node); a hang or a failure is named with the culprit and every
rank's stack."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer

from distval.cli.app import JsonOut, TraceDir, app, check_outputs, finish, make_console, option, trace_config
from distval.cli.flags import config_flags
from distval.health.config import HealthConfig
from distval.launch.config import LaunchOptions


@app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                         "allow_interspersed_args": False})
@config_flags("opts", LaunchOptions, only=("nproc", "max_restarts", "nnodes", "rdzv_endpoint", "timeout_s",
                                          "hang.floor_s", "hang.kill_after_s", "hang.factor", "hang.startup_s",
                                          "hang.busy_s", "metrics_port", "fr_dumps"),
              names={"nproc": ("--nproc-per-node", "--nproc")})
@config_flags("health", HealthConfig,
              only=("slow_ratio", "nan_every", "replicas_every", "window", "min_loss", "imbalance"))
def launch_cmd(
    ctx: typer.Context,
    opts: LaunchOptions,
    health: HealthConfig,
    script: Annotated[
        Path, typer.Argument(help="The training script (with -m: a module); everything after it is its own "
                             "arguments.", show_default=False)
    ],
    module: Annotated[bool, option("--module", "-m", help="Run SCRIPT as a module, as python -m does (e.g. "
                                                          "-m distval train: a distval job under this watchdog).")
                      ] = False,
    rdzv_id: Annotated[
        Optional[str], option("--rdzv-id", help="The job's id, the same on every node (as torchrun's).")
    ] = None,
    rdzv_backend: Annotated[str, option("--rdzv-backend", help="Rendezvous backend: c10d (the only one).")] = "c10d",
    trace: Annotated[Optional[str], option(
        "--trace", help="Record the script's optimizer steps with torch.profiler: SKIP:N skips SKIP steps, then "
        "records N; one Kineto trace per rank, analysed at the end (docs/trace.md).")] = None,
    trace_dir: TraceDir = Path("distval-report/traces"),
    json: JsonOut = None,
) -> int:
    """Run your own torch.distributed script under distval's watchdog: hangs, dead and stopped ranks named
    in seconds; stragglers, NaN/Inf, replica drift and memory watched. Across nodes: the same command on
    each, with --nnodes and --rdzv-endpoint."""
    from distval.launch.execute import check_script, run_script

    check_script(str(script), module, rdzv_backend)
    if run_id := rdzv_id or ("distval-launch" if opts.nnodes > 1 else None):
        opts = dataclasses.replace(opts, run_id=run_id)
    check_outputs({"--json": json})
    if opts.fr_dumps is None and json is not None:
        opts = dataclasses.replace(opts, fr_dumps=str(json.with_suffix(".frdumps")))
    traced = trace_config(trace, 10**9, trace_dir, script.stem if not module else str(script))
    return finish(run_script(str(script), list(ctx.args), opts, module=module, trace=traced, health=health), json,
                  make_console())
