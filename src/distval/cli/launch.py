"""`distval launch`: the user's own script on N local workers, as torchrun would start it, with
the hang watchdog attached; a hang or a failure is named with the culprit and every rank's stack."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from distval.cli.app import (
    HangAfter,
    JsonOut,
    Timeout,
    app,
    check_outputs,
    finish,
    launch_options,
    make_console,
    option,
)


@app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                         "allow_interspersed_args": False})
def launch_cmd(
    ctx: typer.Context,
    script: Annotated[
        Path, typer.Argument(help="The training script; everything after it is its own arguments.", show_default=False)
    ],
    nproc_per_node: Annotated[
        Optional[int],
        option(
            "--nproc-per-node", "--nproc", help="Workers to start (as torchrun's; default: number of GPUs, else 2)."
        ),
    ] = None,
    max_restarts: Annotated[
        int,
        option(
            "--max-restarts",
            help="Restart every worker up to N times after a failure (as torchrun's); a hang ends the job.",
        ),
    ] = 0,
    timeout: Timeout = "60s",
    hang_after: HangAfter = "8s",
    json: JsonOut = None,
) -> int:
    """Run your own torch.distributed script under distval's watchdog: hangs, dead and stopped ranks named
    in seconds."""
    from distval.launch import detect_mode
    from distval.runner import run_script

    if not script.is_file():
        raise ValueError(f"{script}: no such script; give the path of the Python file torchrun would run")
    if detect_mode() != "local":
        raise ValueError("distval launch starts the workers itself: run it instead of torchrun, not under it")
    opts = launch_options(nproc_per_node, "auto", None, timeout, None, hang_after, max_restarts=max_restarts)
    check_outputs({"--json": json})
    return finish(run_script(str(script), list(ctx.args), opts), json, make_console())
