"""What a training run is, as the user gave it: the workload, and one part each for the
optimizer, the strategy's options, checkpoints and metrics. Every part validates itself on
construction (ValueError: one line, exit 2); values are frozen, and a resolved config is a new
value (`dataclasses.replace`), never the old one changed. Run-time plumbing — the run id that
names the journal, the live progress view — travels beside it (LaunchOptions, watchers)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from distval import strategies
from distval.ckpt.config import CheckpointConfig
from distval.health.config import HealthConfig
from distval.knobs import FieldError, knob
from distval.plan import presets
from distval.strategies.config import StrategyConfig
from distval.trace.config import TraceConfig

if TYPE_CHECKING:
    from distval.train.data import DataConfig


READBACKS = ("auto", "now", "late")  # readback.py


@dataclass(frozen=True)
class MetricsConfig:
    log_jsonl: str | None = knob(None, help="Append one JSON line per step (rank 0).")
    tensorboard: str | None = knob(None, help="Write TensorBoard scalars to this folder.")
    readback: str = knob("auto", "--metrics-readback", help="When a step's loss, gradient norm and times reach the "
                         "host: late (one step on, so nothing in a step waits for the GPU), now (every step: a host "
                         "sync on a GPU), auto (late on a GPU, now on CPU).")

    def __post_init__(self) -> None:
        if self.readback not in READBACKS:
            raise FieldError("readback", f"must be auto, now or late (got {self.readback!r})")
        if self.tensorboard:
            try:
                import tensorboard  # noqa: F401
            except ImportError:
                raise FieldError("tensorboard", "needs the tensorboard package: pip install tensorboard") from None

    def resolved(self) -> MetricsConfig:
        """The paths made absolute: the workers may start in another folder."""
        paths = {k: getattr(self, k) for k in ("log_jsonl", "tensorboard")}
        return dataclasses.replace(self, **{k: str(Path(v).resolve()) for k, v in paths.items() if v})


@dataclass(frozen=True)
class StepProbe:
    """What compare's reference rank times after training (train/compare.py `reference_rank`): each
    strategy for a few steps at world 1, with a rank's micro-batch and intra-op threads (0: as is),
    and what a strategy that skips work at world 1 adds at the strategies' `world` (worldcost.py)."""

    strategies: tuple[str, ...]
    micro_batch: int
    threads: int = 0
    world: int = 1


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warm-up and cosine decay, and global gradient-norm clipping."""

    lr: float = knob(3e-3, help="Peak learning rate (AdamW, warm-up then cosine).")
    warmup_steps: int = knob(5, "--warmup", help="Warm-up steps.")
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = knob(1.0, help="Clip the global gradient norm to this (0: off).")

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise FieldError("lr", f"must be positive (got {self.lr:g})")
        if self.warmup_steps < 0:
            raise FieldError("warmup_steps", f"must be 0 or more steps (got {self.warmup_steps})")
        if self.clip < 0:
            raise FieldError("clip", f"must be 0 (off) or positive (got {self.clip:g})")

    def lr_at(self, step: int, steps: int) -> float:
        """Linear warm-up to lr, then cosine decay to min_lr_ratio·lr at the last of `steps`."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


STRATEGIES_HELP = ("simple_ddp, simple_ddp_ga, simple_ddp_hook, simple_ddp_async, bucket_ddp_async, pytorch_ddp, "
                   "zero1, zero2, zero3, pytorch_zero1, fsdp2; dp (nn.DataParallel, one process over every local GPU).")


@dataclass(frozen=True)
class TrainConfig:
    """A training run. Its knobs are the flags of `distval train` and `compare` (cli/flags.py)."""

    model: str = knob("tiny", help="Model preset: tiny, small, gpt2, smollm2-135m, ...")
    strategy: str = knob("simple_ddp", help=STRATEGIES_HELP)
    steps: int = knob(20, help="Optimizer steps.")
    micro_batch: int = knob(2, help="Sequences per rank per micro-batch.")
    grad_accum: int = knob(1, help="Micro-batches per optimizer step.")
    global_batch: int | None = knob(None,  # checked against the world in check_world
                                    help="Sequences per step; must equal micro-batch x ranks x grad-accum.")
    seed: int = knob(0, help="Seed of the model init and the data order.")
    precision: str = knob("fp32", help="fp32 or bf16 (autocast).")
    data: str = knob("synthetic",
                     help="synthetic, a .txt/.jsonl/.csv/.parquet path, or hf:NAME (offline cache).")
    task: str = knob("lm", help="lm (next token) or classify (label, text columns).")
    optim: OptimConfig = field(default_factory=OptimConfig)
    strategy_cfg: StrategyConfig = field(default_factory=StrategyConfig)
    ckpt: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)  # --trace SKIP:N: record N steps after SKIP
    return_params: bool = False  # gather the final parameters (parity checks)
    probe: StepProbe | None = None  # compare's reference run: after training, time strategies on its rank
    peak_flops: float | None = None  # per device; None: the GPU's datasheet peak, or a measured matmul rate
    compile: bool = knob(False, help="torch.compile the model's forward (every strategy but zero3 "
                         "and dp; docs/training.md).")

    def __post_init__(self) -> None:
        presets.model(self.model)  # unknown preset -> ValueError listing the known ones
        strategies.check_name(self.strategy)
        for name in ("steps", "micro_batch", "grad_accum"):
            if getattr(self, name) < 1:
                raise FieldError(name, f"must be at least 1 (got {getattr(self, name)})")
        if self.precision not in ("fp32", "bf16"):
            raise FieldError("precision", f"must be fp32 or bf16 (got {self.precision!r})")
        strategies.REGISTRY[self.strategy].check_options(self.strategy_cfg)
        if self.compile and not (chosen := strategies.REGISTRY[self.strategy]).compiles:
            raise FieldError("compile", f"{{compile}}: {self.strategy} {chosen.compiles_not}; compile one of "
                             f"{', '.join(n for n, s in strategies.REGISTRY.items() if s.compiles)}")

    def data_config(self) -> DataConfig:
        from distval.train.data import DataConfig  # torch: not needed to read the flags

        return DataConfig(source=self.data, task=self.task)

    def check_world(self, world_size: int) -> None:
        """The global batch must split evenly over ranks and micro-batches; a sharded strategy
        needs at least one element per rank."""
        if strategies.REGISTRY[self.strategy].single_process and world_size != 1:
            raise ValueError(f"--strategy {self.strategy} is one process driving every local GPU: run it with "
                             f"--nproc 1 (got {world_size} ranks)")
        num_params = presets.model(self.model).num_params()
        if self.strategy in strategies.SHARDED and world_size > num_params:
            raise ValueError(f"{world_size} ranks is more than the {num_params} parameters of "
                             f"{self.model} to shard; use fewer ranks or a larger --model")
        if self.global_batch is None:
            return
        per_step = self.micro_batch * world_size * self.grad_accum
        if self.global_batch != per_step:
            raise ValueError(
                f"--global-batch {self.global_batch} is not --micro-batch {self.micro_batch} x {world_size} ranks x "
                f"--grad-accum {self.grad_accum} = {per_step}; change one of them")

    def global_batch_for(self, world_size: int) -> int:
        return self.micro_batch * world_size * self.grad_accum
