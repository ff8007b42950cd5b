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

import contextlib
import math
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

from distval import device as devices
from distval import strategies
from distval.ckpt.checkpointer import Checkpointer
from distval.ckpt.state import fingerprint_fields
from distval.comm.ops import busbw_factor
from distval.health.monitor import FIELDS, HealthMonitor, NonFiniteStop, nonfinite_text, replica_checksums
from distval.plan import presets
from distval.rank import RankContext
from distval.trace.capture import Tracer, phase
from distval.train import data as data_mod
from distval.train.config import TrainConfig
from distval.train.metrics import MetricsLogger
from distval.train.model import build_model


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
    if cfg.compile:  # in place: the parameters and their names (checkpoints, parity) stay the model's own
        model.compile()
    strategy = strategies.build(cfg.strategy, model, ctx.comm, cfg.strategy_cfg)
    optimizer = strategy.build_optimizer(
        torch.optim.AdamW, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, **optimizer_impl(ctx.device, strategy)
    )
    flops_per_token = spec.flops_per_token()
    peak = cfg.peak_flops or device_peak_flops(ctx.device)
    # checkpoints (distval/ckpt): resume restores model, optimizer, RNG, data position and metrics so far
    ckpt = Checkpointer(ctx, cfg.ckpt, cfg.steps, fingerprint_fields(cfg, ctx.world_size), strategy, optimizer,
                        loader) if cfg.ckpt.enabled else None
    start, steps = ckpt.resume() if ckpt else (0, [])
    ctx.comm.reset_totals()
    logger = MetricsLogger(cfg.metrics if ctx.rank == 0 else None)
    health = HealthMonitor(cfg.health) if ctx.rank == 0 else None
    tokens_per_rank = cfg.global_batch_for(ctx.world_size) * (loader.dataset.seq_len - 1) / ctx.world_size
    tracer = Tracer(cfg.trace, ctx.rank, ctx.device, {
        "strategy": cfg.strategy, "model": cfg.model, "world_size": ctx.world_size, "first_step": start,
        "flops_per_step": tokens_per_rank * flops_per_token, "peak_flops": peak}) if cfg.trace.enabled else None
    finished = False
    try:
        for step in range(start, cfg.steps):
            ctx.status(f"train {cfg.strategy} step {step}", step=step)
            if ckpt:
                ckpt.before_step(step)  # the journal, this step's test/drill fault, a stop asked by SIGTERM
            else:
                ctx.faults.at_step(step)
            steps.append(train_step(ctx, cfg, strategy, optimizer, loader, step, flops_per_token, peak, health,
                                    tracer))
            if cfg.health.every and (step + 1) % cfg.health.every == 0 and not strategy.params_sharded:
                began = time.perf_counter()
                check_replicas(ctx, strategy, step, health)
                steps[-1]["health_s"] += time.perf_counter() - began
            logger.log(steps[-1], step)
            if ctx.rank == 0:  # the live progress view (train/progress.py)
                ctx.channel.publish("step", {"step": step, "loss": steps[-1]["loss"],
                                             "step_time_s": steps[-1]["step_time_s"]})
            if ckpt:
                with phase("checkpoint"):
                    ckpt.after_step(step + 1)
            if tracer:
                tracer.step()
        finished = True
    finally:
        if tracer:
            tracer.close()
        logger.close()
        if ckpt:
            ckpt.close(ok=finished)
    full = strategy.full_parameters()  # collective for sharded strategies
    expected_state = torch.tensor([strategy.expected_model_state_bytes(optimizer) or -1], dtype=torch.float64)
    ctx.control_comm.all_reduce(expected_state, "max")  # the largest rank, as measured
    result: dict[str, Any] = {
        "steps": steps,
        "expected_comm_bytes_per_step": strategy.expected_comm_bytes_per_step(cfg.grad_accum),
        "expected_model_state_bytes": int(expected_state) if float(expected_state) >= 0 else None,
        "checksum": _checksum(full),
        "num_params": full.numel(),
        "peak_flops": peak,
        "counts_all_comm": strategy.counts_all_comm,
        "num_tensors": sum(1 for p in model.parameters() if p.requires_grad),
        "health": [f.to_dict() for f in health.findings()] if health else [],
        "health_ranks": health.rank_rows() if health else [],
        "peak_mem_per_gpu": [torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())]
        if strategy.single_process and ctx.device.type == "cuda" else None,
        "health_checks": {"replicas": health.replica_checks if health else 0,
                          "replicas_applicable": not strategy.params_sharded},
    }
    if cfg.return_params and ctx.rank == 0:
        result["params"] = full
    strategy.close()
    return result


def train_step(ctx: RankContext, cfg: TrainConfig, strategy: strategies.Strategy, optimizer: torch.optim.Optimizer,
               loader: Any, step: int, flops_per_token: float, peak: float,
               health: HealthMonitor | None = None, tracer: Tracer | None = None) -> dict[str, Any]:
    """One optimizer step. Every rank's own figures (step time, compute, waiting, loss, memory,
    model state) are gathered in one collective over the control group; rank 0 gives them to
    the health monitor (`health`). Under `--trace`, the timed region is marked distval:step."""
    for group in optimizer.param_groups:
        group["lr"] = cfg.optim.lr_at(step, cfg.steps)
    ctx.control_comm.barrier()  # start together, so step time measures this step only
    with tracer.timed() if tracer else contextlib.nullcontext():
        start = time.perf_counter()
        faults = ctx.faults
        loss = forward_backward(cfg, strategy, loader, ctx.device, poison=bool(faults and faults.poisoned(step)))
        stretch = faults.slowdown(step) if faults else 0.0
        if stretch:  # test/drill: a straggler, slowed by a known factor
            time.sleep(stretch * (time.perf_counter() - start))
        with phase("grad_sync"):
            strategy.sync_gradients()
        with phase("optimizer"):
            grad_norm = strategy.clip_grad_norm(cfg.optim.clip)  # a tensor on the device, read below
            norm = float(grad_norm)  # read once (on a GPU, a host sync)
            bad_param = None if math.isfinite(norm) else first_nonfinite_grad(strategy)
            if not math.isfinite(norm) and cfg.health.on_nan == "stop":  # every rank sees the same norm: all stop
                stop_on_nonfinite(ctx, step, loss, norm, bad_param)
            optimizer.step()
            if faults:
                faults.after_update(step, strategy.module)
            held = held_bytes(strategy.model_state_tensors(optimizer))  # everything of the model state exists now
            optimizer.zero_grad(set_to_none=True)
        strategy.after_step()
        elapsed = time.perf_counter() - start
    comm = {op: t for op, t in ctx.comm.totals.items()}
    ctx.comm.reset_totals()
    blocked = sum(t.blocked_s for t in comm.values())
    peak_mem = devices.peak_memory_bytes(ctx.device)
    mine = [elapsed, elapsed - blocked, blocked, loss, devices.current_memory_bytes(ctx.device), peak_mem, held]
    everyone = torch.zeros(ctx.world_size * len(mine), dtype=torch.float64)
    ctx.control_comm.all_gather(everyone, torch.tensor(mine, dtype=torch.float64))
    ranks = [dict(zip((*FIELDS, "held"), row)) for row in everyone.view(ctx.world_size, -1).tolist()]
    tokens = cfg.global_batch_for(ctx.world_size) * (loader.dataset.seq_len - 1)
    step_s = max(r["step_s"] for r in ranks)  # the step ends when the slowest rank ends
    compute = [r["compute_s"] for r in ranks]
    began = time.perf_counter()
    found = health.update(step, ranks, norm, bad_param, tokens) if health is not None else []
    for f in found:
        ctx.channel.publish("health", {"status": f.status, "summary": f.summary}, flush=True)
    return {
        **({"health": [f"{f.status}: {f.summary}" for f in found]} if found else {}),  # into the JSONL sink too
        "step": step,
        "loss": math.fsum(r["loss"] for r in ranks) / ctx.world_size,
        "grad_norm": norm,
        "lr": cfg.optim.lr_at(step, cfg.steps),
        "step_time_s": step_s,
        "tokens_per_s": tokens / step_s,
        "mfu": tokens / ctx.world_size * flops_per_token / step_s / peak,
        "comm_calls": sum(t.calls for t in comm.values()),
        "comm_bytes": sum(t.bytes for t in comm.values()),
        "comm_wire_bytes": round(sum(t.bytes * busbw_factor(op, ctx.world_size) for op, t in comm.items())),
        "comm_time_s": sum(t.time_s for t in comm.values()),
        "comm_blocked_s": sum(t.blocked_s for t in comm.values()),
        "peak_mem_bytes": peak_mem,
        "model_state_bytes": int(max(r["held"] for r in ranks)),  # the rank holding the most
        "slowest_rank": compute.index(max(compute)),
        "compute_skew": max(compute) / max(statistics.median(compute), 1e-9),  # the slowest over the median
        "health_s": time.perf_counter() - began,  # the monitor's own time on this rank (rank 0 decides)
    }


def stop_on_nonfinite(ctx: RankContext, step: int, loss: float, grad_norm: float, bad_param: str | None) -> None:
    """`--on-nan stop`: name the rank(s) from every rank's loss, ask distval's agent not to restart
    into it, and stop every rank before the update (nothing non-finite reaches the parameters or
    a checkpoint)."""
    losses = torch.zeros(ctx.world_size, dtype=torch.float64)
    ctx.control_comm.all_gather(losses, torch.tensor([loss], dtype=torch.float64))
    bad, text = nonfinite_text(step, losses.tolist(), grad_norm, bad_param)
    message = f"{text} (--on-nan stop: stopped before the update; nothing non-finite was saved)"
    if ctx.rank == 0:
        ctx.channel.publish("note", {"no_restart": message, "exit_code": 1, "rank": bad[0] if len(bad) == 1 else None},
                            flush=True)
    raise NonFiniteStop(message)


def first_nonfinite_grad(strategy: strategies.Strategy) -> str | None:
    """The first parameter (in the model's order) whose gradient holds a non-finite value."""
    for name, p in strategy.module.named_parameters():
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            return name
    return None


def check_replicas(ctx: RankContext, strategy: strategies.Strategy, step: int, health: HealthMonitor | None) -> None:
    """Every rank's exact per-parameter checksums, gathered on the control group and compared on
    rank 0 (health/monitor.py)."""
    names, sums = replica_checksums(strategy.module.named_parameters())
    everyone = torch.zeros(ctx.world_size * len(sums), dtype=torch.int64)
    ctx.control_comm.all_gather(everyone, sums)
    if health is not None:
        found = health.replicas_checked(step, names, list(everyone.view(ctx.world_size, -1)))
        if found:
            ctx.channel.publish("health", {"status": found.status, "summary": found.summary}, flush=True)


def forward_backward(cfg: TrainConfig, strategy: strategies.Strategy, loader: Any, device: torch.device,
                     poison: bool = False) -> float:
    """K micro-batches; returns this rank's mean loss over them. `poison` (a test/drill fault):
    the loss is NaN."""
    total = 0.0
    for k in range(cfg.grad_accum):
        with phase("data"):
            batch = {key: t.to(device) for key, t in next(loader).items()}
        with strategy.micro_batch(is_last=k == cfg.grad_accum - 1):
            with phase("forward"):
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
                    logits = strategy.module(batch["tokens"])
                loss = loss_of(logits, batch) / cfg.grad_accum
            if poison:
                loss = loss * float("nan")
            with phase("backward"):
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


def optimizer_impl(device: torch.device, strategy: strategies.Strategy) -> dict[str, bool]:
    """AdamW's implementation: on CUDA the fused kernel (one launch for every tensor, as a
    hand-written loop would use; foreach for FSDP2's DTensor shards), on CPU the single-tensor
    loop every strategy's parity and bitwise resume were established with."""
    if device.type != "cuda":
        return {"foreach": False}
    return {"fused": True} if strategy.fused_optimizer else {"foreach": True}


def device_peak_flops(device: torch.device) -> float:
    """The MFU denominator: on a GPU with a preset (plan/presets.py), its datasheet dense bf16
    peak, as MFU is quoted; on another GPU, a measured bf16 matmul rate; on CPU, this rank's
    measured fp32 matmul rate."""
    from distval.plan.model import matmul_flops

    if device.type == "cuda":
        name = presets.device_named(torch.cuda.get_device_name(device))
        if name is not None:
            return presets.device(name).peak_tflops * 1e12
        n, dtype = 4096, torch.bfloat16
    else:
        n, dtype = 512, torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)

    def mm(x: torch.Tensor, y: torch.Tensor) -> None:
        torch.mm(x, y)
        devices.synchronize(device)  # a GPU kernel is timed to its end, not to its launch

    return matmul_flops(mm, a, b, n, 3)
