"""`distval plan`: the cost model of a training step, from flags (no ranks are started, torch is
not imported). The flags are PlanConfig's knobs."""

from __future__ import annotations

from typing import Annotated, Optional

from distval.cli.app import JsonOut, app, check_outputs, finish, make_console, option
from distval.cli.flags import config_flags
from distval.plan.config import PlanConfig


@app.command("plan")
@config_flags("cfg", PlanConfig)
def plan(
    cfg: PlanConfig,
    sweep: Annotated[Optional[str], option(
        "--sweep", help="NAME=v1,v2,...: one row per value of one input, e.g. link=1GbE,10GbE or world=2,8,64.")
    ] = None,
    json: JsonOut = None,
) -> int:
    """Cost model of a training step: comm/compute time, memory per rank per strategy, scaling, levers."""
    from distval.plan import report as plan_report
    from distval.results import write_json

    check_outputs({"--json": json})
    report = plan_report.sweep_report(cfg, sweep) if sweep else plan_report.build_report(cfg)
    console = make_console()
    code = finish(plan_report.readable(report), None, console)  # the terminal copy shows GB
    if json:
        write_json(report, json)
        console.print(f"wrote {json}")
    return code
