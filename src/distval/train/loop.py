"""The training loop: train_rank() -> train_step() -> forward_backward(), then finish_step(),
strategy-agnostic.

Each rank builds the same model (deterministic init from the seed), the strategy named in the
config, AdamW with linear warm-up and cosine decay, and its shard of the data. Per optimizer step
it runs K micro-batches (`grad_accum`) through the strategy's interface (strategies/base.py),
clips the global gradient norm, steps, and records: loss (mean over ranks), grad norm, LR,
tokens/s, step time (max over ranks), MFU (the PaLM convention, docs/plan.md "Compute":
6·N + 12·L·H·Q·T FLOPs per token against a device peak, measured on CPU), peak memory (RSS on
CPU, CUDA peak on GPU), and the collectives the strategy issued (calls, bytes, time, exposed
time) from the collective layer. Metrics bookkeeping goes over the control group, never counted
as the strategy's traffic.
A step is issued (train_step) and its figures read back (finish_step) at once on CPU ranks and one
step later on a GPU, so that nothing in the step waits for the GPU (readback.py).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from distval import device as devices
from distval import strategies
from distval.ckpt.checkpointer import Checkpointer
from distval.ckpt.state import fingerprint_fields
from distval.comm.ops import busbw_factor
from distval.health.monitor import FIELDS, Detectors, NonFiniteStop, nonfinite_text, replica_checksums
from distval.health.probe import param_names, unwrap
from distval.plan import presets
from distval.protocol import Kind
from distval.rank import RankContext
from distval.readback import Readback, StepMarks, lag_for, to_host
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
    # a checkpoint holds the record of every step before it: the read-back (below) settles first
    ckpt = Checkpointer(ctx, cfg.ckpt, cfg.steps, fingerprint_fields(cfg, ctx.world_size), strategy, optimizer,
                        loader, settle=lambda: readback.flush()) if cfg.ckpt.enabled else None
    start, steps = ckpt.resume() if ckpt else (0, [])
    ctx.comm.reset_totals()
    logger = MetricsLogger(cfg.metrics if ctx.rank == 0 else None)
    health = Detectors(cfg.health) if ctx.rank == 0 else None
    tokens = cfg.global_batch_for(ctx.world_size) * (loader.dataset.seq_len - 1)  # per step, every rank's
    tokens_per_rank = tokens / ctx.world_size
    tracer = Tracer(cfg.trace, ctx.rank, ctx.device, {
        "strategy": cfg.strategy, "model": cfg.model, "world_size": ctx.world_size, "first_step": start,
        "flops_per_step": tokens_per_rank * flops_per_token, "peak_flops": peak}) if cfg.trace.enabled else None
    lag = lag_for(cfg.metrics.readback, ctx.device)

    def finished_step(pending: PendingStep) -> None:
        steps.append(finish_step(ctx, cfg, pending, tokens, flops_per_token, peak, health))
        logger.log(steps[-1], pending.step)
        if ctx.rank == 0:  # the live progress view (train/progress.py) and metrics (health/metrics.py)
            live = health.metrics() if health is not None else {}
            ctx.channel.publish(Kind.STEP, {"step": pending.step, "loss": steps[-1]["loss"],
                                         "step_time_s": steps[-1]["step_time_s"],
                                         "tokens_per_s": steps[-1]["tokens_per_s"],
                                         "ranks": [live["ranks"][r] for r in sorted(live.get("ranks", {}))],
                                         "findings": {"/".join(k): n for k, n in live.get("findings", {}).items()}})

    readback: Readback[PendingStep] = Readback(lag, finished_step)
    finished = False
    try:
        for step in range(start, cfg.steps):
            ctx.status(f"train {cfg.strategy} step {step}", step=step)
            if ckpt:
                ckpt.before_step(step)  # the journal, this step's test/drill fault, a stop asked by SIGTERM
            else:
                ctx.faults.at_step(step)
            due = replicas_due(cfg, strategy, step)
            pending = train_step(ctx, cfg, strategy, optimizer, loader, step, lag, tracer,
                                 checksum_grads=due and strategy.grads_replicated)
            if due:
                began = time.perf_counter()
                check_replicas(ctx, strategy, step, health, pending.grad_sums)
                pending.health_s += time.perf_counter() - began
            readback.push(pending)  # with lag 1: the previous step's figures, read while this one runs
            if ckpt:
                with phase("checkpoint"):
                    ckpt.after_step(step + 1)
            if tracer:
                tracer.step()
        readback.flush()
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
        "device": ctx.device.type,
        "counts_all_comm": strategy.counts_all_comm,
        "param_sizes": [p.numel() for p in model.parameters() if p.requires_grad],  # unsharded, as built
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


@dataclass
class PendingStep:
    """One step as issued: its marks, its loss and gradient norm on their way to the host, and
    what the host knew at once. `finish_step` reads it back."""

    step: int
    clock: StepMarks
    values: torch.Tensor  # [this rank's loss, the gradient norm], float64, in host memory once read
    comm: dict[str, Any]
    memory: tuple[int, int]  # (current, peak) bytes when the step was issued
    held: int
    bad_param: str | None  # named only where the norm was read at once
    grad_sums: tuple[list[str], torch.Tensor] | None  # the synchronised gradients' checksums, on check steps
    checked_s: float  # the time taking them, inside the step: left out of its step time
    optimizer_waited_s: float = 0.0  # of the optimizer phase, waiting on collectives (counted as comm_blocked_s)
    health_s: float = 0.0  # the replica check's time after the step


def train_step(ctx: RankContext, cfg: TrainConfig, strategy: strategies.Strategy, optimizer: torch.optim.Optimizer,
               loader: Any, step: int, lag: int = 0, tracer: Tracer | None = None,
               checksum_grads: bool = False) -> PendingStep:
    """Issue one optimizer step. With `lag` 1 nothing in it waits for a GPU: the gradient norm is
    read at once only where `--on-nan stop` needs it before the update. `checksum_grads`: take the
    synchronised gradients' checksums for this step's replica check. Under `--trace`, the timed
    region is marked distval:step."""
    for group in optimizer.param_groups:
        group["lr"] = cfg.optim.lr_at(step, cfg.steps)
    ctx.control_comm.barrier()  # start together, so step time measures this step only
    clock = StepMarks(ctx.device)
    with tracer.timed() if tracer else contextlib.nullcontext():
        clock.mark("start")
        start = time.perf_counter()
        faults = ctx.faults
        loss = forward_backward(cfg, strategy, loader, ctx.device, poison=bool(faults and faults.poisoned(step)))
        stretch = faults.slowdown(step) if faults else 0.0
        if stretch:  # test/drill: a straggler, slowed by a known factor
            time.sleep(stretch * (time.perf_counter() - start))
        clock.mark("computed")
        with phase("grad_sync"):
            strategy.sync_gradients()
            if faults:
                faults.after_sync(step, strategy.module)
        clock.mark("synced")
        waited = ctx.comm.blocked_so_far()
        grad_sums, checked_s = None, 0.0
        if checksum_grads:  # (a host read: every K steps)
            began = time.perf_counter()
            grad_sums = replica_checksums((name, p.grad) for name, p in named_parameters(strategy)
                                          if p.grad is not None)
            checked_s = time.perf_counter() - began
        with phase("optimizer"):
            grad_norm = strategy.clip_grad_norm(cfg.optim.clip)  # a tensor on the device
            on_device = torch.stack([loss, grad_norm.detach().reshape(()).to(torch.float64)])
            values = to_host(on_device)
            bad_param = None
            if not lag or cfg.health.on_nan == "stop":  # read at once (on a GPU, a host sync)
                norm = float(on_device[1])  # (not `values`: on a GPU its copy may still be on its way)
                bad_param = None if math.isfinite(norm) else first_nonfinite_grad(strategy)
                if not math.isfinite(norm) and cfg.health.on_nan == "stop":  # every rank sees the same norm: all stop
                    stop_on_nonfinite(ctx, step, float(on_device[0]), norm, bad_param)
            optimizer.step()
            if faults:
                faults.after_update(step, strategy.module)
            held = held_bytes(strategy.model_state_tensors(optimizer))  # everything of the model state exists now
            optimizer.zero_grad(set_to_none=True)
        clock.mark("updated")
        waited = ctx.comm.blocked_so_far() - waited  # the optimizer phase's own collectives (the gradient norm)
        strategy.after_step()  # zero1/2: the updated parameters' all_gather
        clock.mark("end")
    comm = dict(ctx.comm.totals)
    ctx.comm.reset_totals()
    memory = (devices.current_memory_bytes(ctx.device), devices.peak_memory_bytes(ctx.device))
    return PendingStep(step, clock, values, comm, memory, held, bad_param, grad_sums, checked_s, waited)


def finish_step(ctx: RankContext, cfg: TrainConfig, pending: PendingStep, tokens: float, flops_per_token: float,
                peak: float, health: Detectors | None = None) -> dict[str, Any]:
    """A step's record, once its work is done. Every rank's own figures (step time, compute,
    waiting, loss, memory, model state) are gathered in one collective over the control group;
    rank 0 gives them to the health monitor (`health`). Compute is the step less its waiting: on
    the host, the time the layer saw this thread blocked in collectives; on a GPU, the stream's
    time in the gradient synchronisation (the peers' arrival included)."""
    clock, comm = pending.clock, pending.comm
    elapsed = clock.seconds("start", "end") - pending.checked_s
    blocked = clock.seconds("computed", "synced") if clock.cuda else sum(t.blocked_s for t in comm.values())
    loss, norm = pending.values.tolist()
    mine = [elapsed, elapsed - blocked, blocked, loss, *pending.memory, pending.held]
    everyone = torch.zeros(ctx.world_size * len(mine), dtype=torch.float64)
    ctx.control_comm.all_gather(everyone, torch.tensor(mine, dtype=torch.float64))
    ranks = [dict(zip((*FIELDS, "held"), row)) for row in everyone.view(ctx.world_size, -1).tolist()]
    step, step_s = pending.step, max(r["step_s"] for r in ranks)  # the step ends when the slowest rank ends
    compute = [r["compute_s"] for r in ranks]
    began = time.perf_counter()
    found = health.update(step, ranks, norm, pending.bad_param, tokens) if health is not None else []
    for f in found:
        ctx.channel.publish(Kind.HEALTH, {"status": f.status, "summary": f.summary}, flush=True)
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
        # per op (this rank's, as comm_blocked_s): [calls, bytes, seconds issue to end, seconds waited]
        "comm_ops": {op: [t.calls, t.bytes, t.time_s, t.blocked_s] for op, t in sorted(comm.items()) if t.calls},
        # this rank's optimizer phase (gradient norm, clipping, update; not zero1/2's gather after it, nor the
        # norm's collective, which is in comm_blocked_s), as comm_blocked_s is its own
        "optimizer_s": clock.seconds("synced", "updated") - pending.checked_s - pending.optimizer_waited_s,
        "peak_mem_bytes": pending.memory[1],
        "model_state_bytes": int(max(r["held"] for r in ranks)),  # the rank holding the most
        "slowest_rank": compute.index(max(compute)),
        "compute_skew": max(compute) / max(statistics.median(compute), 1e-9),  # the slowest over the median
        # the monitor's own time on this rank (rank 0 decides), with the replica check's
        "health_s": pending.checked_s + pending.health_s + time.perf_counter() - began,
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
        culprit = bad[0] if len(bad) == 1 else None
        ctx.channel.publish(Kind.NOTE, {"no_restart": message, "exit_code": 1, "rank": culprit}, flush=True)
    raise NonFiniteStop(message)


def first_nonfinite_grad(strategy: strategies.Strategy) -> str | None:
    """The first parameter (in the model's order) whose gradient holds a non-finite value."""
    for name, p in named_parameters(strategy):
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            return name
    return None


def named_parameters(strategy: strategies.Strategy) -> list[tuple[str, torch.Tensor]]:
    """The model's parameters by their keys in the user's model's state_dict: without the prefix
    of a wrapper the strategy put around it (pytorch_ddp's `module.`; health/probe.py's rule)."""
    names = param_names(unwrap(strategy.module))
    return [(names.get(id(p), name), p) for name, p in strategy.module.named_parameters()]


def replicas_due(cfg: TrainConfig, strategy: strategies.Strategy, step: int) -> bool:
    """Replicas are compared after every `--check-replicas-every` K-th step where there are any."""
    every = cfg.health.replicas_every
    return bool(every) and (step + 1) % every == 0 and not strategy.params_sharded


def check_replicas(ctx: RankContext, strategy: strategies.Strategy, step: int, health: Detectors | None,
                   grad_sums: tuple[list[str], torch.Tensor] | None = None) -> None:
    """Every rank's exact per-parameter checksums (and, where the strategy keeps full gradients,
    those of the gradients as synchronised: `grad_sums`), gathered on the control group and
    compared on rank 0 (health/monitor.py)."""
    names, sums = replica_checksums(named_parameters(strategy))
    if grad_sums is not None:
        names, sums = names + [f"{n} (gradient)" for n in grad_sums[0]], torch.cat([sums, grad_sums[1]])
    everyone = torch.zeros(ctx.world_size * len(sums), dtype=torch.int64)
    ctx.control_comm.all_gather(everyone, sums)
    if health is not None:
        found = health.replicas_checked(step, names, list(everyone.view(ctx.world_size, -1)))
        if found:
            ctx.channel.publish(Kind.HEALTH, {"status": found.status, "summary": found.summary}, flush=True)


def forward_backward(cfg: TrainConfig, strategy: strategies.Strategy, loader: Any, device: torch.device,
                     poison: bool = False) -> torch.Tensor:
    """K micro-batches; returns this rank's mean loss over them, a float64 scalar on the device
    (not read here: on a GPU a read waits for the GPU). `poison` (a test/drill fault): the loss
    is NaN."""
    total = torch.zeros((), dtype=torch.float64, device=device)
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
        total += loss.detach()
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
        name = presets.preset_for(devices.gpu_identity(device))
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
