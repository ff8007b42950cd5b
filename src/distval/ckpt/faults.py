"""Test- and drill-only faults at a training step, read from DISTVAL_STEP_FAULT.

    DISTVAL_STEP_FAULT="step=7,rank=1,action=kill[,attempt=0]"

at the start of step `step` on rank `rank`, in restart attempt `attempt` (TORCHELASTIC_RESTART_COUNT;
default 0, the first attempt only; -1: every attempt, a fault that comes back after each restart):
    kill          SIGKILL this rank (a lost process: OOM killer, dead host)
    raise         raise RuntimeError on this rank (a crashing rank)
    sigterm       SIGTERM this rank (a preemption notice to one worker)
    sigterm_job   SIGTERM this rank's whole process group: the launcher and every worker (a job preempted)
    kill_in_save  SIGKILL this rank halfway through writing its files of the next checkpoint save
The comm-level hook (DISTVAL_FAULT in comm/layer.py) faults individual collectives instead.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

ACTIONS = ("kill", "raise", "sigterm", "sigterm_job", "kill_in_save")
ENV = "DISTVAL_STEP_FAULT"


def attempt_number() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


@dataclass(frozen=True)
class StepFault:
    step: int
    rank: int
    action: str = "kill"
    attempt: int = 0

    @classmethod
    def from_env(cls, value: str | None = None) -> StepFault | None:
        value = os.environ.get(ENV) if value is None else value
        if not value:
            return None
        fields: dict[str, object] = {}
        for part in value.split(","):
            key, _, val = part.partition("=")
            fields[key.strip()] = val.strip() if key.strip() == "action" else int(val)
        spec = cls(**fields)  # type: ignore[arg-type]
        if spec.action not in ACTIONS:
            raise ValueError(f"{ENV} action {spec.action!r}; choose from {', '.join(ACTIONS)}")
        return spec

    def armed(self, rank: int) -> bool:
        return rank == self.rank and self.attempt in (-1, attempt_number())

    def at_step(self, step: int, rank: int) -> None:
        if step != self.step or not self.armed(rank):
            return
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.action == "raise":
            raise RuntimeError(f"{ENV}: injected failure at step {step} on rank {rank}")
        elif self.action == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        elif self.action == "sigterm_job":
            os.killpg(os.getpgrp(), signal.SIGTERM)

    def in_save(self, step: int, rank: int) -> bool:
        """True when this save (the first one at or after `step`) must be killed mid-write."""
        return self.action == "kill_in_save" and step >= self.step and self.armed(rank)
