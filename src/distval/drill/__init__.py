"""`distval drill`: real training jobs with injected faults (health/faults.py), each asserting that
the job detects the fault, recovers from its last checkpoint and ends bitwise where an
uninterrupted run ends. The drills of the hang, straggler and NaN issues join here."""

from distval.drill.drills import DRILLS, DrillConfig, run_drills

__all__ = ["DRILLS", "DrillConfig", "run_drills"]
