"""`distval drill`: real training jobs with injected faults; each must recover bitwise."""

from __future__ import annotations

from typing import Annotated, Optional

from distval.cli.app import JsonOut, app, check_outputs, finish, make_console, option
from distval.drill import DRILLS, DrillConfig, run_drills


@app.command("drill")
def drill_cmd(
    nproc: Annotated[int, option("--nproc", help="Ranks of each drill job (at least 2).")] = 2,
    model: Annotated[str, option("--model", help="Model preset.")] = "tiny",
    strategy: Annotated[str, option("--strategy", help="Strategy of the drilled training.")] = "simple_ddp",
    steps: Annotated[int, option("--steps", help="Steps of each run.")] = 12,
    ckpt_every: Annotated[int, option("--ckpt-every", help="Checkpoint every N steps.")] = 3,
    fault_step: Annotated[int, option("--fault-step", help="The step k the faults fire at.")] = 7,
    only: Annotated[Optional[str], option("--only", help=f"Comma list of drills ({', '.join(DRILLS)}).")] = None,
    json: JsonOut = None,
) -> int:
    """Fault drills: kill -9, exception, SIGTERM, kill mid-save, corrupt file, full disk; each must recover bitwise."""
    from distval import strategies
    from distval.plan import presets

    presets.model(model)
    strategies.check_name(strategy)
    drills = tuple(x.strip() for x in only.split(",") if x.strip()) if only else DRILLS
    cfg = DrillConfig(nproc=nproc, model=model, strategy=strategy, steps=steps, ckpt_every=ckpt_every,
                      fault_step=fault_step, drills=drills)
    check_outputs({"--json": json})
    return finish(run_drills(cfg), json, make_console())
