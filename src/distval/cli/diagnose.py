"""`distval diagnose DIR`: the culprit of a hung job from the Flight Recorder dumps its ranks left,
whatever launched it (docs/health.md "Post mortem: Flight Recorder dumps")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from distval.cli.app import JsonOut, app, check_outputs, finish, make_console, option


@app.command("diagnose")
def diagnose_cmd(
    paths: Annotated[list[Path], typer.Argument(
        help="A folder of per-rank Flight Recorder dumps (pickle or JSON, one per rank, named <prefix><rank>), or "
        "the files themselves; or a dump folder of torch.distributed.debug (its stacks_*.txt).", show_default=False)],
    html: Annotated[Optional[Path], option("--html", help="Also write a self-contained HTML summary.")] = None,
    json: JsonOut = None,
) -> int:
    """Name the rank that hung or broke a job from the dumps PyTorch's Flight Recorder wrote: the
    collective where the ranks diverge, who never entered it, who entered another op, size or
    dtype, each rank's last completed collective and the stack it issued from; from
    torch.distributed.debug's stacks, who is outside any collective, in another one, or did not
    answer. Exit 1 when the dumps show a hang or a mismatch."""
    from distval.health.postmortem import diagnose

    check_outputs({"--json": json, "--html": html})
    return finish(diagnose(paths), json, make_console(), html)
