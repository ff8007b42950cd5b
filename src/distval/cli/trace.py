"""`distval trace analyze`: per-rank Kineto traces (ours or anyone's) -> where each step's time
goes, HTA's figures, collectives and late arrivals (docs/trace.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from distval.cli.app import JsonOut, check_outputs, finish, make_console, option, trace_app


@trace_app.command("analyze")
def analyze_cmd(
    paths: Annotated[list[Path], typer.Argument(
        help="A folder of per-rank traces (*.json, *.json.gz), or the files themselves.", show_default=False)],
    csv: Annotated[Optional[Path], option("--csv", help="Also write every table as <name>.csv in this folder.")] = None,
    json: JsonOut = None,
) -> int:
    """Break every rank's steps down (compute, overlap, exposed communication, waiting for peers,
    data, idle), with HTA's temporal and overlap figures, collectives and who arrives last."""
    from distval.results import output_dir
    from distval.trace.report import analyze, write_csv

    check_outputs({"--json": json})
    folder = output_dir(csv, "--csv") if csv else None
    report = analyze(paths)
    console = make_console()
    code = finish(report, json, console)
    if folder:
        for written in write_csv(report, folder):
            console.print(f"wrote {written}")
    return code
