"""`distval run`: the acceptance ladder (docs/ladder.md). The stages of a distributed training
stack, bottom layer first, each a typed result with a verdict, a headline and a hint; the climb
stops at the first broken layer unless told to keep going:

  doctor → check → bench → plan → compare → drills → trace → health

config.py  the stages, `--only`/`--skip`, the default and `--quick` presets
core.py    the climb (job A: doctor's probe, check and bench in one set of workers; a traced run
           shared by trace and health) and the report with its `ladder` table
"""

from __future__ import annotations

from typing import Any

from distval.ladder.config import STAGES, RunConfig, select

_CORE = ("LADDER_COLUMNS", "Ladder", "Progress", "StageResult", "run_ladder", "write_outputs")


def __getattr__(name: str) -> Any:
    """The climb (core.py, torch) is imported when first used: the command line reads RunConfig's
    flags without it."""
    if name in _CORE:
        from distval.ladder import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["LADDER_COLUMNS", "STAGES", "Ladder", "Progress", "RunConfig", "StageResult", "run_ladder", "select",
           "write_outputs"]
