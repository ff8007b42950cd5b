"""What `distval run` climbs: the stages in order, and the two presets (the default run and
`--quick`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from distval.comm.config import BenchConfig, CheckConfig
from distval.doctor.config import DoctorConfig
from distval.knobs import knob
from distval.plan import presets

STAGES = ("doctor", "check", "bench", "compare", "plan", "scale", "drills", "trace", "health")
IN_JOB_A = ("doctor", "check", "bench")  # one set of workers for the three
LOCAL_ONLY = ("compare", "scale", "drills")  # start local jobs of their own: not under an outer launcher
COMPARE_STRATEGIES = ("pytorch_ddp", "bucket_ddp_async", "zero2", "fsdp2")
DRILLS = ("kill9_rank", "hang_rank", "corrupt_file", "slow_rank")
TRACED_STRATEGY = "pytorch_ddp"
SCALED_STRATEGY = "pytorch_ddp"  # a strategy compare measured: its step costs are in bench.json
# the ops the ladder's bench step sweeps: a subset of comm.names.BENCH_OPS
LADDER_BENCH_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def select(only: list[str] | None, skip: list[str] | None) -> tuple[str, ...]:
    """The stages `--only` and `--skip` leave, in ladder order (one line, exit 2, for a name
    that is not a stage)."""
    for flag, names in (("--only", only), ("--skip", skip)):
        unknown = [n for n in names or [] if n not in STAGES]
        if unknown:
            raise ValueError(f"{flag} {','.join(unknown)}: not a stage; the stages are {', '.join(STAGES)}")
    chosen = tuple(s for s in STAGES if (not only or s in only) and s not in (skip or []))
    if not chosen:
        raise ValueError("--only/--skip leave no stage to run")
    return chosen


@dataclass(frozen=True)
class RunConfig:
    """What `distval run` climbs; its knobs are flags of the command (cli/flags.py)."""

    out_dir: str = knob("distval-report", "--out", help="Folder for report.json, report.html, bench.json and the "
                        "traces (created when missing).")
    stages: tuple[str, ...] = STAGES
    keep_going: bool = knob(False, help="Climb on past a failing stage.")
    quick: bool = False
    model: str = knob("tiny", help="Model preset of the plan, compare, drills and traced run.")
    doctor: DoctorConfig = field(default_factory=DoctorConfig)
    check: CheckConfig = field(default_factory=CheckConfig)
    bench: BenchConfig = field(default_factory=lambda: BenchConfig(
        ops=LADDER_BENCH_OPS, min_bytes=1024, max_bytes=16 * 2**20, factor=4, iters=20, warmup=5))
    compare_steps: int = 20
    scale_steps: int = 40
    drill_steps: int = 12
    trace_steps: int = 30
    trace_skip: int = 10
    trace_active: int = 10

    def __post_init__(self) -> None:
        presets.model(self.model)
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise ValueError(f"{','.join(unknown)}: not a stage; the stages are {', '.join(STAGES)}")
        for name in ("compare_steps", "scale_steps", "drill_steps", "trace_steps", "trace_active"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if not 0 <= self.trace_skip <= self.trace_steps - self.trace_active:
            raise ValueError(f"trace_skip {self.trace_skip} + trace_active {self.trace_active} must fit in "
                             f"trace_steps {self.trace_steps}")

    @classmethod
    def quick_preset(cls, **kwargs) -> RunConfig:
        """A smoke run: fewer sizes, iterations and steps, every stage still there."""
        return cls(quick=True,
                   check=CheckConfig(sizes={"one": 1, "odd": 7, "non_pow2": 1000}),
                   bench=BenchConfig(ops=LADDER_BENCH_OPS, min_bytes=1024, max_bytes=4 * 2**20, factor=8, iters=10,
                                     warmup=2),
                   compare_steps=8, scale_steps=20, trace_steps=12, trace_skip=4, trace_active=4, **kwargs)
