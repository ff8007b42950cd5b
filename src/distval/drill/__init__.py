"""`distval drill`: real training jobs with injected faults (health/faults.py), each asserting that
the job detects the fault, recovers from its last checkpoint and ends bitwise where an
uninterrupted run ends, or that it names the hang, the straggler or the non-finite loss it was
given (drill/drills.py `DRILLS`)."""

from distval.drill.config import DRILLS, DrillConfig
from distval.drill.drills import run_drills

__all__ = ["DRILLS", "DrillConfig", "run_drills"]
