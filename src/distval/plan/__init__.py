"""distval's planner: a cost model of a data-parallel training step (docs/plan.md).

    from distval.plan import PlanConfig, evaluate, build_report
    result = evaluate(PlanConfig(model="gpt2-large", world_size=2, link="1GbE", device="H100"))
    result.comm_time_s, result.compute_time_s, result.step_time_s

Later commands put these predictions next to what they measure.
"""

from distval.plan.config import PlanConfig
from distval.plan.memory import memory_rows
from distval.plan.model import Inputs, StepResult, evaluate, resolve
from distval.plan.report import build_report, sweep_report

__all__ = ["PlanConfig", "Inputs", "StepResult", "evaluate", "resolve", "memory_rows", "build_report", "sweep_report"]
