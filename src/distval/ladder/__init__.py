"""`distval run`: the acceptance ladder (docs/ladder.md). The stages of a distributed training
stack, bottom layer first, each a typed result with a verdict, a headline and a hint; the climb
stops at the first broken layer unless told to keep going:

  doctor → check → bench → plan → compare → drills → trace → health

config.py  the stages, `--only`/`--skip`, the default and `--quick` presets
core.py    the climb (job A: doctor's probe, check and bench in one set of workers; a traced run
           shared by trace and health) and the report with its `ladder` table
"""

from distval.ladder.config import STAGES, RunConfig, select
from distval.ladder.core import LADDER_COLUMNS, Ladder, Progress, StageResult, run_ladder, write_outputs

__all__ = ["LADDER_COLUMNS", "STAGES", "Ladder", "Progress", "RunConfig", "StageResult", "run_ladder", "select",
           "write_outputs"]
