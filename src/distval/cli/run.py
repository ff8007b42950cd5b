"""`distval run`: the acceptance ladder on this machine, one report (JSON and HTML)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from distval.cli.app import (
    Backend,
    Deadline,
    ExpectWorld,
    HangAfter,
    JsonOut,
    Nproc,
    Timeout,
    app,
    check_outputs,
    finish,
    launch_options,
    make_console,
    option,
)
from distval.results import output_dir


@app.command("run")
def run_cmd(
    out: Annotated[Path, option("--out", help="Folder for report.json and report.html.")] = Path("distval-report"),
    quick: Annotated[bool, option("--quick", help="A smoke test in seconds: fewer sizes and iterations.")] = False,
    nproc: Nproc = None, backend: Backend = "auto", expect_world: ExpectWorld = None, timeout: Timeout = "60s",
    deadline: Deadline = None, hang_after: HangAfter = "8s", json: JsonOut = None,
) -> int:
    """The acceptance ladder on this machine: comm check, then a comm bench sweep; one report."""
    from distval import ladder  # imports the HTML renderer only for this command

    cfg = ladder.RunConfig.quick(str(out)) if quick else ladder.RunConfig(out_dir=str(out))
    opts = launch_options(nproc, backend, expect_world, timeout, deadline, hang_after)
    check_outputs({"--json": json})
    out_dir = output_dir(out, "--out")
    report = ladder.run_ladder(cfg, opts)
    console = make_console()
    code = finish(report, json, console)
    if report is not None:
        paths = ladder.write_outputs(report, out_dir)
        console.print(f"wrote {paths['json']} and {paths['html']}")
    return code
