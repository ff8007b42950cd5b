"""`distval drill`: real training jobs with injected faults; each must recover bitwise. The flags
are DrillConfig's knobs."""

from __future__ import annotations

from distval.cli.app import JsonOut, app, check_outputs, finish, make_console
from distval.cli.flags import config_flags
from distval.drill.config import DrillConfig


@app.command("drill")
@config_flags("cfg", DrillConfig)
def drill_cmd(cfg: DrillConfig, json: JsonOut = None) -> int:
    """Fault drills: kill -9, exception, SIGTERM, kill mid-save, corrupt file, full disk; each must recover bitwise."""
    from distval.drill import run_drills

    check_outputs({"--json": json})
    return finish(run_drills(cfg), json, make_console())
