"""What a training run is, as the user gave it: the workload, and one part each for the
optimizer, the strategy's options, checkpoints and metrics. Every part validates itself on
construction (ValueError: one line, exit 2); values are frozen, and a resolved config is a new
value (`dataclasses.replace`), never the old one changed. Run-time plumbing — the run id that
names the journal, the live progress view — travels beside it (LaunchOptions, watchers)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from distval import strategies
from distval.ckpt.config import CheckpointConfig
from distval.health.monitor import HealthConfig
from distval.plan import presets
from distval.strategies.base import StrategyConfig
from distval.trace.config import TraceConfig
from distval.train import data as data_mod
from distval.train.metrics import MetricsConfig


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warm-up and cosine decay, and global gradient-norm clipping."""

    lr: float = 3e-3
    warmup_steps: int = 5
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0  # 0: off

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"--lr must be positive (got {self.lr:g})")
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup must be 0 or more steps (got {self.warmup_steps})")
        if self.clip < 0:
            raise ValueError(f"--clip must be 0 (off) or positive (got {self.clip:g})")

    def lr_at(self, step: int, steps: int) -> float:
        """Linear warm-up to lr, then cosine decay to min_lr_ratio·lr at the last of `steps`."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass(frozen=True)
class TrainConfig:
    model: str = "tiny"
    strategy: str = "simple_ddp"
    steps: int = 20
    micro_batch: int = 2  # sequences per rank per micro-batch
    grad_accum: int = 1
    global_batch: int | None = None  # checked against micro_batch x world x grad_accum when given
    seed: int = 0
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    data: str = "synthetic"
    task: str = "lm"  # lm | classify (a (label, text) file or data set)
    optim: OptimConfig = field(default_factory=OptimConfig)
    strategy_cfg: StrategyConfig = field(default_factory=StrategyConfig)
    ckpt: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)  # --trace SKIP:N: record N steps after SKIP
    return_params: bool = False  # gather the final parameters (parity checks)
    peak_flops: float | None = None  # per device; None: the GPU's datasheet peak, or a measured matmul rate
    compile: bool = False  # torch.compile of the model's forward (strategies whose `compiles` is True)

    def __post_init__(self) -> None:
        presets.model(self.model)  # unknown preset -> ValueError listing the known ones
        strategies.check_name(self.strategy)
        for name in ("steps", "micro_batch", "grad_accum"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"--precision must be fp32 or bf16 (got {self.precision!r})")
        strategies.REGISTRY[self.strategy].check_options(self.strategy_cfg)
        if self.compile and not strategies.REGISTRY[self.strategy].compiles:
            raise ValueError(f"--compile: {self.strategy} {strategies.REGISTRY[self.strategy].compiles_not}; compile "
                             f"one of {', '.join(n for n, s in strategies.REGISTRY.items() if s.compiles)}")

    def data_config(self) -> data_mod.DataConfig:
        return data_mod.DataConfig(source=self.data, task=self.task)

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
