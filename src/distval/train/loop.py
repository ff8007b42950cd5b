"""The training loop: train() -> train_step() -> forward_backward(), strategy-agnostic.

Each rank builds the same model (deterministic init from the seed), the strategy named in the
config, AdamW with linear warm-up and cosine decay, and its shard of the data. Per optimizer step
it runs K micro-batches (`grad_accum`) through the strategy's interface (strategies/base.py),
clips the global gradient norm, steps, and records: loss (mean over ranks), grad norm, LR,
tokens/s, step time (max over ranks), MFU (DESIGN.md convention: 6·N + 12·L·H·Q·T FLOPs per
token against a device peak, measured on CPU), peak memory (RSS on CPU, CUDA peak on GPU), and
the collectives the strategy issued (calls, bytes, time, exposed time) from the collective layer.
Metrics bookkeeping goes over the control group, never counted as the strategy's traffic.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from distval import device as devices
from distval import strategies
from distval.ckpt.checkpointer import Checkpointer
from distval.comm.ops import busbw_factor
from distval.plan import presets
from distval.rank import RankContext
from distval.strategies.base import StrategyConfig
from distval.train import data as data_mod
from distval.train.metrics import MetricsLogger
from distval.train.model import build_model


@dataclass
class TrainConfig:
    model: str = "tiny"
    strategy: str = "simple_ddp"
    steps: int = 20
    micro_batch: int = 2  # sequences per rank per micro-batch
    grad_accum: int = 1
    global_batch: int | None = None  # checked against micro_batch x world x grad_accum when given
    lr: float = 3e-3
    warmup_steps: int = 5
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    data: str = "synthetic"
    task: str = "lm"  # lm | classify (a (label, text) file or data set)
    strategy_cfg: StrategyConfig = field(default_factory=StrategyConfig)
    return_params: bool = False  # gather the final parameters (parity checks)
    log_jsonl: str | None = None  # rank 0 appends one JSON line per step
    tensorboard: str | None = None  # rank 0 writes TensorBoard scalars here
    peak_flops: float | None = None  # per device; None: measured matmul rate on CPU
    ckpt_dir: str | None = None  # checkpoints (docs/checkpointing.md); None: no checkpoints
    ckpt_every: int = 10  # save after every N optimizer steps (and after the last)
    ckpt_keep: int = 3  # keep the newest K checkpoints
    ckpt_async: bool = True  # write in a background thread; the loop only waits for the snapshot
    resume: str | None = None  # "auto" (newest valid checkpoint in ckpt_dir, or start at 0), a checkpoint path, or None
    run_id: str | None = None  # names the run journal in ckpt_dir/runs (None: the elastic agent's run id)

    def __post_init__(self) -> None:
        presets.model(self.model)  # unknown preset -> ValueError listing the known ones
        strategies.check_name(self.strategy)
        for name in ("steps", "micro_batch", "grad_accum"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"--precision must be fp32 or bf16 (got {self.precision!r})")
        if self.lr <= 0:
            raise ValueError(f"--lr must be positive (got {self.lr:g})")
        mp = self.strategy_cfg.mixed_precision
        if mp != "none" and self.strategy != "fsdp2":
            raise ValueError(f"--mixed-precision {mp} is fsdp2's parameter/reduce policy; {self.strategy} computes in "
                             f"--precision: use --strategy fsdp2, or --precision bf16 (autocast) with {self.strategy}")
        if mp == "bf16" and devices.bf16_unsupported():
            raise ValueError("--mixed-precision bf16: this GPU has no bf16 support; use --mixed-precision fp16")
        for name in ("ckpt_every", "ckpt_keep"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.resume == "auto" and not self.ckpt_dir:
            raise ValueError("--resume auto needs --ckpt-dir (where to look for checkpoints)")

    def data_config(self) -> data_mod.DataConfig:
        return data_mod.DataConfig(source=self.data, task=self.task)

    def check_world(self, world_size: int) -> None:
        """The global batch must split evenly over ranks and micro-batches; a sharded strategy
        needs at least one element per rank."""
        if self.strategy in strategies.SHARDED and world_size > presets.model(self.model).num_params():
            raise ValueError(f"{world_size} ranks is more than the {presets.model(self.model).num_params()} parameters of "
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


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up to lr, then cosine decay to min_lr_ratio·lr at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(cfg.steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def loss_of(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy, or classification cross-entropy when the batch has labels."""
    if "labels" in batch:
        return F.cross_entropy(logits.float(), batch["labels"])
    tokens = batch["tokens"]
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))


def train_rank(ctx: RankContext, cfg: TrainConfig) -> dict[str, Any]:
    cfg.check_world(ctx.world_size)
    spec = presets.model(cfg.model)
    loader = data_mod.build_loader(cfg.data_config(), spec, micro_batch=cfg.micro_batch, grad_accum=cfg.grad_accum,
                                   rank=ctx.rank, world_size=ctx.world_size, seed=cfg.seed)
    # a (label, text) data set trains a sequence classifier, anything else the language model
    num_classes = getattr(getattr(loader, "dataset", None), "num_classes", None)
    model = build_model(spec, seed=cfg.seed, num_classes=num_classes, device=ctx.device)
    strategy = strategies.build(cfg.strategy, model, ctx.comm, cfg.strategy_cfg)
    optimizer = strategy.build_optimizer(torch.optim.AdamW, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)
    flops_per_token = spec.flops_per_token()
    peak = cfg.peak_flops or _measured_peak(ctx)
    # checkpoints (distval/ckpt): resume restores model, optimizer, RNG, data position and metrics so far
    ckpt = Checkpointer(ctx, cfg, strategy, optimizer, loader) if cfg.ckpt_dir or cfg.resume else None
    start, steps = ckpt.resume() if ckpt else (0, [])
    ctx.comm.reset_totals()
    logger = MetricsLogger(cfg.log_jsonl, cfg.tensorboard) if ctx.rank == 0 else MetricsLogger()
    finished = False
    try:
        for step in range(start, cfg.steps):
            ctx.status(f"train {cfg.strategy} step {step}")
            if ckpt:
                ckpt.before_step(step)  # the journal, this step's test/drill fault, a stop asked by SIGTERM
            else:
                ctx.faults.at_step(step)
            steps.append(train_step(ctx, cfg, strategy, optimizer, loader, step, flops_per_token, peak))
            logger.log(steps[-1], step)
            if ctx.rank == 0:  # the live progress view (train/progress.py)
                ctx.channel.publish("step", {"step": step, "loss": steps[-1]["loss"],
                                             "step_time_s": steps[-1]["step_time_s"]})
            if ckpt:
                ckpt.after_step(step + 1)
        finished = True
    finally:
        logger.close()
        if ckpt:
            ckpt.close(ok=finished)
    full = strategy.full_parameters()  # collective for sharded strategies
    expected_state = torch.tensor([strategy.expected_model_state_bytes(optimizer) or -1], dtype=torch.float64)
    ctx.control_comm.all_reduce(expected_state, "max")  # the largest rank, as measured
    result: dict[str, Any] = {"steps": steps, "expected_comm_bytes_per_step": strategy.expected_comm_bytes_per_step(cfg.grad_accum),
                              "expected_model_state_bytes": int(expected_state) if float(expected_state) >= 0 else None,
                              "checksum": _checksum(full), "num_params": full.numel(), "peak_flops": peak,
                              "counts_all_comm": strategy.counts_all_comm,
                              "num_tensors": sum(1 for p in model.parameters() if p.requires_grad)}
    if cfg.return_params and ctx.rank == 0:
        result["params"] = full
    strategy.close()
    return result


def train_step(ctx: RankContext, cfg: TrainConfig, strategy: strategies.Strategy, optimizer: torch.optim.Optimizer,
               loader: Any, step: int, flops_per_token: float, peak: float) -> dict[str, Any]:
    for group in optimizer.param_groups:
        group["lr"] = lr_at(cfg, step)
    ctx.control_comm.barrier()  # start together, so step time measures this step only
    start = time.perf_counter()
    loss = forward_backward(cfg, strategy, loader, ctx.device)
    strategy.sync_gradients()
    grad_norm = strategy.clip_grad_norm(cfg.clip)  # a tensor on the device, read below
    optimizer.step()
    held = held_bytes(strategy.model_state_tensors(optimizer))  # everything of the model state exists now
    optimizer.zero_grad(set_to_none=True)
    strategy.after_step()
    elapsed = time.perf_counter() - start
    comm = {op: t for op, t in ctx.comm.totals.items()}
    ctx.comm.reset_totals()
    loss_sum = torch.tensor([loss], dtype=torch.float64)
    ctx.control_comm.all_reduce(loss_sum, "sum")
    # the step ends when the slowest rank ends; model state: the rank holding the most
    maxima = torch.tensor([elapsed, held], dtype=torch.float64)
    ctx.control_comm.all_reduce(maxima, "max")
    tokens = cfg.global_batch_for(ctx.world_size) * (loader.dataset.seq_len - 1)
    step_s = float(maxima[0])
    return {
        "step": step, "loss": float(loss_sum) / ctx.world_size, "grad_norm": float(grad_norm), "lr": lr_at(cfg, step),
        "step_time_s": step_s, "tokens_per_s": tokens / step_s,
        "mfu": tokens / ctx.world_size * flops_per_token / step_s / peak,
        "comm_calls": sum(t.calls for t in comm.values()), "comm_bytes": sum(t.bytes for t in comm.values()),
        "comm_wire_bytes": round(sum(t.bytes * busbw_factor(op, ctx.world_size) for op, t in comm.items())),
        "comm_time_s": sum(t.time_s for t in comm.values()), "comm_blocked_s": sum(t.blocked_s for t in comm.values()),
        "peak_mem_bytes": devices.peak_memory_bytes(ctx.device), "model_state_bytes": int(maxima[1]),
    }


def forward_backward(cfg: TrainConfig, strategy: strategies.Strategy, loader: Any, device: torch.device) -> float:
    """K micro-batches; returns this rank's mean loss over them."""
    total = 0.0
    for k in range(cfg.grad_accum):
        batch = {key: t.to(device) for key, t in next(loader).items()}
        with strategy.micro_batch(is_last=k == cfg.grad_accum - 1):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
                logits = strategy.module(batch["tokens"])
            loss = loss_of(logits, batch) / cfg.grad_accum
            loss.backward()
        total += float(loss.detach())
    return total


def _checksum(flat: torch.Tensor) -> str:
    """A fingerprint of the exact parameter bits (same bits -> same checksum on every rank)."""
    import hashlib

    return hashlib.sha256(flat.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def held_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages behind these tensors (a view into a flat buffer counts the
    buffer once; a DTensor counts its local shard)."""
    storages: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        st = local.untyped_storage()
        if st.nbytes():
            storages[st.data_ptr()] = st.nbytes()
    return sum(storages.values())


def _measured_peak(ctx: RankContext, n: int = 512, reps: int = 3) -> float:
    """The MFU denominator on CPU: this rank's fp32 matmul rate through torch."""
    from distval.plan.model import matmul_flops

    a, b = torch.randn(n, n, device=ctx.device), torch.randn(n, n, device=ctx.device)
    return matmul_flops(torch.mm, a, b, n, reps)


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    return asdict(cfg)
