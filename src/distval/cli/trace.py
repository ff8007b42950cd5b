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
    html: Annotated[Optional[Path], option("--html", help="Also write a self-contained HTML summary.")] = None,
    merged: Annotated[Optional[Path], option(
        "--merged", help="Also write one trace of every rank (.json or .json.gz) for Perfetto: ranks as processes, "
        "clocks aligned on the collectives' ends.")] = None,
    json: JsonOut = None,
) -> int:
    """Break every rank's steps down (compute, overlap, exposed communication, waiting for peers,
    data, idle), with HTA's temporal and overlap figures, collectives and who arrives last."""
    from distval.results import output_dir
    from distval.trace.report import analyze, write_csv

    check_outputs({"--json": json, "--html": html, "--merged": merged})
    folder = output_dir(csv, "--csv") if csv else None
    report = analyze(paths, merged)
    console = make_console()
    code = finish(report, json, console, html)
    if merged:
        console.print(f"wrote {merged}")
    if folder:
        for written in write_csv(report, folder):
            console.print(f"wrote {written}")
    return code


@trace_app.command("diff")
def diff_cmd(
    a: Annotated[Path, typer.Argument(help="Run A: a folder of per-rank traces (or one trace file).",
                                      show_default=False)],
    b: Annotated[Path, typer.Argument(help="Run B, compared with A.", show_default=False)],
    json: JsonOut = None,
) -> int:
    """Two runs side by side: per category of the step and per kernel or op, with a permutation
    test over steps (is the difference more than the steps' own spread?)."""
    from distval.trace.diff import diff

    check_outputs({"--json": json})
    return finish(diff([a], [b]), json, make_console())
