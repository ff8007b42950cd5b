"""`distval run`: the acceptance ladder (docs/ladder.md), one report in three forms: the terminal,
OUT/report.json and OUT/report.html."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated, Optional

from rich.console import Console
from rich.markup import escape

from distval.cli.app import (
    ExpectFile,
    JsonOut,
    app,
    check_outputs,
    finish,
    judged,
    load_expectations,
    make_console,
    option,
    split_list,
)
from distval.cli.flags import config_flags
from distval.ladder.config import RunConfig
from distval.launch.config import LAUNCH, LaunchOptions
from distval.results import output_dir

_STYLE = {"OK": "green", "WARN": "yellow", "FAIL": "red", "ERROR": "magenta", "SKIP": "dim"}


@app.command("run")
@config_flags("values", RunConfig, only=("out_dir", "keep_going", "model"), build=dict)  # built below: --quick picks
@config_flags("opts", LaunchOptions, only=LAUNCH)
def run_cmd(
    values: dict, opts: LaunchOptions,
    quick: Annotated[bool, option("--quick", help="A smoke run (about 2 minutes here): fewer sizes, iterations and "
                                  "steps; every stage still there.")] = False,
    only: Annotated[Optional[str], option("--only", help="Comma list of stages to run: doctor, check, bench, compare, "
                                          "plan, scale, drills, trace, health.")] = None,
    skip: Annotated[Optional[str], option("--skip", help="Comma list of stages to leave out.")] = None,
    expect: ExpectFile = None,
    json: JsonOut = None,
) -> int:
    """The acceptance ladder: doctor, comm check, comm bench, compare, plan, scale, drills, a traced run, its
    health."""
    from distval import ladder

    stages = ladder.select(split_list(only) if only else None, split_list(skip) if skip else None)
    make = RunConfig.quick_preset if quick else RunConfig
    cfg = make(stages=stages, **{path[-1]: value for path, value in values.items()})
    expectations = load_expectations(expect)
    check_outputs({"--json": json})
    out_dir = output_dir(Path(cfg.out_dir), "--out")
    console = make_console()
    report = judged(ladder.run_ladder(dataclasses.replace(cfg, out_dir=str(out_dir)), opts, _Progress(console)),
                    expectations)
    code = finish(report, json, console)
    if report is not None:
        paths = ladder.write_outputs(report, out_dir)
        console.print(f"wrote {paths['json']} and {paths['html']}")
    return code


class _Progress:
    """One line per stage as it ends; on a terminal, a spinner while it runs."""

    def __init__(self, console: Console):
        self.console = console
        self.status = None
        self.began = 0.0

    def start(self, index: int, total: int, name: str) -> None:
        self.began = time.monotonic()
        if self.console.is_terminal:
            self.status = self.console.status(f"[{index + 1}/{total}] {name} …")
            self.status.start()

    def end(self, index: int, total: int, result) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
        status = result.status.value
        hint = f"  → {result.hint}" if result.hint and status != "OK" else ""
        self.console.print(f"[{index + 1}/{total}] {result.name:<8} [{_STYLE[status]}]{status:<5}[/] "
                           f"{result.seconds:6.1f} s  {escape(result.headline + hint)}", highlight=False)
