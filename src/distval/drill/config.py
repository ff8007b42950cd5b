"""What `distval drill` runs (`DrillConfig`): each knob a flag of the command; torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from distval.knobs import FieldError, comma_list, knob

DRILLS = ("kill9_rank", "exception_rank", "sigterm_job", "kill_during_save", "corrupt_file", "disk_full", "hang_rank",
          "skip_collective", "dead_rank_in_collective", "mismatch_shape", "slow_rank", "desync", "nan_rank")


@dataclass(frozen=True)
class DrillConfig:
    """What `distval drill` runs; each knob is a flag of the command (cli/flags.py)."""

    nproc: int = knob(2, help="Ranks of each drill job (at least 2).")
    model: str = knob("tiny", help="Model preset.")
    strategy: str = knob("simple_ddp", help="Strategy of the drilled training.")
    steps: int = knob(12, help="Steps of each run.")
    ckpt_every: int = knob(3, help="Checkpoint every N steps.")
    fault_step: int = knob(7, help="The step k the faults fire at.")
    timeout_s: float = 240.0  # each train run
    drills: tuple[str, ...] = knob(DRILLS, "--only", parse=comma_list,
                                   help=f"Comma list of drills ({', '.join(DRILLS)}).")

    def __post_init__(self) -> None:
        from distval import strategies
        from distval.plan import presets

        presets.model(self.model)
        strategies.check_name(self.strategy)
        if self.nproc < 2:
            raise FieldError("nproc", f"must be at least 2 for the drills (rank 1 is the one faulted; got "
                             f"{self.nproc})")
        if not 0 < self.fault_step < self.steps:
            raise FieldError("fault_step", f"must be between 1 and {{steps}} - 1 (got {self.fault_step})")
        if self.ckpt_every >= self.fault_step:
            raise FieldError("ckpt_every", f"{self.ckpt_every} must be below {{fault_step}} {self.fault_step}, so a "
                             "checkpoint exists before the fault")
        unknown = sorted(set(self.drills) - set(DRILLS))
        if unknown:
            raise ValueError(f"unknown drill(s) {', '.join(unknown)}; choose from {', '.join(DRILLS)}")
