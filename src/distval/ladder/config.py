"""What `distval run` climbs: the stages in order, and the two presets (the default run and
`--quick`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from distval.comm import bench, check
from distval.doctor.report import DoctorConfig, default_master_addr

STAGES = ("doctor", "check", "bench", "plan", "compare", "drills", "trace", "health")
IN_JOB_A = ("doctor", "check", "bench")  # one set of workers for the three
LOCAL_ONLY = ("compare", "drills")  # start local jobs of their own: not under an outer launcher
COMPARE_STRATEGIES = ("pytorch_ddp", "bucket_ddp_async", "zero2", "fsdp2")
DRILLS = ("kill9_rank", "hang_rank", "corrupt_file", "slow_rank")
TRACED_STRATEGY = "pytorch_ddp"
# the ops the ladder's bench step sweeps: a subset of comm.names.BENCH_OPS
LADDER_BENCH_OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]


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


@dataclass
class RunConfig:
    out_dir: str = "distval-report"
    stages: tuple[str, ...] = STAGES
    keep_going: bool = False
    quick: bool = False
    model: str = "tiny"
    doctor: DoctorConfig = field(default_factory=lambda: DoctorConfig(master_addr=default_master_addr()))
    check: check.CheckConfig = field(default_factory=check.CheckConfig)
    bench: bench.BenchConfig = field(default_factory=lambda: bench.BenchConfig(
        ops=list(LADDER_BENCH_OPS), min_bytes=1024, max_bytes=16 * 2**20, factor=4, iters=20, warmup=5))
    compare_steps: int = 20
    drill_steps: int = 12
    trace_steps: int = 30
    trace_skip: int = 10
    trace_active: int = 10

    @classmethod
    def quick_preset(cls, **kwargs) -> RunConfig:
        """A smoke run: fewer sizes, iterations and steps, every stage still there."""
        return cls(quick=True,
                   check=check.CheckConfig(sizes={"one": 1, "odd": 7, "non_pow2": 1000}),
                   bench=bench.BenchConfig(ops=list(LADDER_BENCH_OPS), min_bytes=1024, max_bytes=2**20, factor=8,
                                           iters=5, warmup=1),
                   compare_steps=8, trace_steps=12, trace_skip=4, trace_active=4, **kwargs)
