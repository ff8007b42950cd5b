"""The one small interface every data-parallel and sharding strategy implements.

The training loop drives a strategy through one optimizer step like this, and never looks
inside it or branches on its name:

    for k in range(K):                                   # K micro-batches (gradient accumulation)
        with strategy.micro_batch(is_last=k == K - 1):   # e.g. DDP's no_sync() for k < K-1
            loss = strategy.module.loss(batch) / K
            loss.backward()                              # hooks may launch communication here
    strategy.sync_gradients()                            # afterwards p.grad is the global mean
    norm = strategy.clip_grad_norm(max_norm)             # the global norm, however grads are held
    optimizer.step(); optimizer.zero_grad(set_to_none=True)
    strategy.after_step()                                # e.g. ZeRO: all-gather updated params

Checkpoints go through `state_dict(optimizer)` / `load_state_dict(optimizer, state)`, a portable
full form every strategy reads and writes the same way (so a checkpoint from one strategy or
world size loads into another):

    {"model": {name: full tensor, ... (persistent buffers too)},
     "optim": {param name: {"step": tensor, "exp_avg": tensor, "exp_avg_sq": tensor}}}

Both are collective for sharded strategies (every rank calls them; every rank gets the full
state). Sharded strategies also give a sharded form for torch.distributed.checkpoint
(`sharded_state_dict` / `finish_sharded_load`): each rank saves only its shards, and DCP
reshards them when loading on another world size. `model_state_tensors(optimizer)` yields what
this rank actually holds (parameters, gradients, optimizer state, shards) for the model-state
memory accounting.

Device placement: a tensor's device comes from the model's parameters (the rank's device), never
from a default. The full form arrives from disk on the host; `load_state_dict` puts every tensor
where the optimizer keeps it (`optimizer_state_like`). `clip_grad_norm` returns the norm as a
tensor on the device, so the caller decides when to read it back (a host sync on a GPU).

Gradient averaging is SUM then divide by the world size (the same result on every backend).
Every collective a hand-written strategy issues goes through the `Comm` it is given, so calls and
bytes per step are counted by the collective layer.
"""

from __future__ import annotations

import abc
import contextlib
import math
from typing import Any, ClassVar, Iterator

import torch
from torch import nn

from distval.comm.layer import Comm
from distval.strategies.config import StrategyConfig  # noqa: F401 (re-exported: the strategies' options)


class Strategy:
    name: ClassVar[str]
    syncs_every_micro_batch: ClassVar[bool] = False
    counts_all_comm: ClassVar[bool] = True  # False: some collectives are torch's own, not counted
    # How the planner (distval plan, compare's predictions) models this strategy:
    plan_model: ClassVar[str] = "ddp"  # its memory and traffic model: ddp, zero1, zero2, zero3 or fsdp
    overlaps_backward: ClassVar[bool] = False  # communication runs during backward (the planner's --overlap)
    overlaps_only_with_streams: ClassVar[bool] = False  # ... through device streams: on CPU its collectives block
    skips_work_at_world_1: ClassVar[bool] = False  # its one-rank step leaves out work it does at N (fsdp2)
    call_per_tensor: ClassVar[bool] = False  # one all-reduce per parameter tensor, not per bucket
    layout_options: ClassVar[tuple[str, ...]] = ()  # StrategyConfig fields that shape the sharded form
    params_sharded: ClassVar[bool] = False  # each rank holds a shard of the parameters, no replica
    grads_replicated: ClassVar[bool] = True  # after sync_gradients every rank holds the same full gradients
    fused_optimizer: ClassVar[bool] = True  # on CUDA its parameters take the fused AdamW (else foreach)
    # its optimizer updates flat shards (ZeRO's buffers), not the model's own tensors or shards of each
    # (DDP, FSDP2's DTensors): which per-parameter rate the planner divides by sharding
    optimizer_over_flat_shards: ClassVar[bool] = False
    single_process: ClassVar[bool] = False  # one process drives every local GPU (dp): compare runs it at --nproc 1
    compiles: ClassVar[bool] = True  # --compile: torch.compile of the model's forward works under it
    compiles_not: ClassVar[str] = ""  # why not, where it does not

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        self.model, self.comm, self.cfg = model, comm, cfg
        self.world_size = comm.world_size
        # Every rank starts from rank 0's parameters, as DDP does.
        for p in model.parameters():
            comm.broadcast(p.data, src=0)

    @property
    def module(self) -> nn.Module:
        """What the loop calls forward/loss on."""
        return self.model

    @contextlib.contextmanager
    def micro_batch(self, is_last: bool) -> Iterator[None]:
        yield

    def sync_gradients(self) -> None:
        """Make p.grad the global mean. Strategies that synchronise in hooks or per micro-batch
        have nothing left to do here."""

    def parameters(self) -> Iterator[nn.Parameter]:
        """The parameters this rank's optimizer updates."""
        return self.model.parameters()

    def build_optimizer(self, optimizer_class: type[torch.optim.Optimizer], **kwargs: Any) -> torch.optim.Optimizer:
        """The optimizer over `parameters()` (a strategy may wrap it, as ZeroRedundancyOptimizer)."""
        return optimizer_class(self.parameters(), **kwargs)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The global gradient norm (a 0-d tensor on the device); scales the gradients to at most
        `max_norm` when it is positive."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)

    def after_step(self) -> None:
        """After optimizer.step(): data parallelism keeps full replicas, so nothing to restore."""

    def grad_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)

    def expected_comm_bytes_per_step(self, grad_accum: int) -> int | None:
        """Bytes the collective layer should count per optimizer step (nccl-tests' S summed)."""
        return self.grad_bytes() * (grad_accum if self.syncs_every_micro_batch else 1)

    # -- checkpoint state (portable full form) and model-state memory --------------------------------

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The full model and optimizer state, keyed by parameter name (copies)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        optim = {names[id(p)]: {k: v.detach().clone() for k, v in st.items()}
                 for p, st in optimizer.state.items() if st}
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()}, "optim": optim}

    def load_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """The full form (from any device, usually the host) into the model and optimizer on theirs."""
        self.model.load_state_dict(state["model"])
        params = dict(self.model.named_parameters())
        optimizer.state.clear()
        for name, st in state["optim"].items():
            optimizer.state[params[name]] = optimizer_state_like(optimizer, params[name], st)

    def sharded_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The sharded form for torch.distributed.checkpoint: DTensors over this rank's shards
        (and replicated scalars), the same dict for `dcp.save` and, in place, for `dcp.load`
        followed by `finish_sharded_load`. None: the strategy keeps replicas (use the full form)."""
        return None

    def finish_sharded_load(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """After `dcp.load` filled `state` (from `sharded_state_dict`) in place."""

    @classmethod
    def check_options(cls, cfg: StrategyConfig) -> None:
        """Options this strategy cannot honour are bad input (ValueError), not silently ignored.
        Here: the parameter/reduce dtype policy, which only fsdp2 has."""
        if cfg.mixed_precision != "none":
            raise ValueError(f"--mixed-precision {cfg.mixed_precision} is fsdp2's parameter/reduce policy; {cls.name} "
                             f"computes in --precision: use --strategy fsdp2, or --precision bf16 (autocast) with "
                             f"{cls.name}")

    @classmethod
    def layout(cls, cfg: StrategyConfig) -> dict[str, Any]:
        """What a sharded checkpoint of this strategy needs to match to load: the strategy and
        the options that decide how its state is cut (zero1/2: the bucket cap)."""
        return {"strategy": cls.name, **{name: getattr(cfg, name) for name in cls.layout_options}}

    def full_parameters(self) -> torch.Tensor:
        """Every parameter, flattened in registration order, as fp32 in host memory (collective
        for sharded strategies)."""
        return host_flat(p.detach() for p in self.model.parameters())

    def model_state_tensors(self, optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
        """What this rank holds of the model state: parameters, gradients, optimizer state."""
        for p in self.model.parameters():
            yield p
            if p.grad is not None:
                yield p.grad
        for st in optimizer.state.values():
            yield from (v for v in st.values() if isinstance(v, torch.Tensor))

    def expected_model_state_bytes(self, optimizer: torch.optim.Optimizer) -> int | None:
        """The formula for this rank: full replicas of fp32 parameters, gradients and Adam's two
        moments, 16 bytes per parameter (16Ψ; the fp32 'step' scalars are not counted)."""
        return 16 * sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def close(self) -> None:
        """Remove hooks; the model is usable again without the strategy."""


class HookStrategy(Strategy, abc.ABC):
    """A strategy that acts on each gradient as autograd finishes accumulating it, on the last
    micro-batch of a step only (post-accumulate-grad hooks on every trainable parameter)."""

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        super().__init__(model, comm, cfg)
        self._sync = False
        self._handles = [
            p.register_post_accumulate_grad_hook(self._hook) for p in model.parameters() if p.requires_grad
        ]

    def _hook(self, p: nn.Parameter) -> None:
        if self._sync:
            self.on_grad(p)

    @abc.abstractmethod
    def on_grad(self, p: nn.Parameter) -> None:
        """What to do with p.grad once autograd has finished accumulating it."""

    @contextlib.contextmanager
    def micro_batch(self, is_last: bool) -> Iterator[None]:
        self._sync = is_last
        try:
            yield
        finally:
            self._sync = False

    def close(self) -> None:
        for h in self._handles:
            h.remove()


# -- where optimizer state lives ------------------------------------------------------------------


def _step_on_device(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> bool:
    """torch's Adam family keeps the 'step' counter on the parameter's device when fused or
    capturable, on the host otherwise. The flags are per group; when every group agrees (the
    usual case) no search for the parameter's group is needed."""
    on_device = {bool(g.get("fused") or g.get("capturable")) for g in optimizer.param_groups}
    if len(on_device) == 1:
        return on_device.pop()
    group = next((g for g in optimizer.param_groups if any(p is param for p in g["params"])), optimizer.defaults)
    return bool(group.get("fused") or group.get("capturable"))


def optimizer_state_like(optimizer: torch.optim.Optimizer, param: torch.Tensor,
                         state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (for `param`, loaded from any device) as `optimizer` keeps it: new tensors on the
    parameter's device, floating point ones in its dtype; 'step' as a float32 scalar on the host,
    or on the device for fused/capturable optimizers."""
    out = {}
    for key, value in state.items():
        if key == "step":
            device = param.device if _step_on_device(optimizer, param) else torch.device("cpu")
            out[key] = value.detach().to(device=device, dtype=torch.float32, copy=True)
        elif value.is_floating_point():
            out[key] = value.detach().to(device=param.device, dtype=param.dtype, copy=True)
        else:
            out[key] = value.detach().to(device=param.device, copy=True)
    return out


def initial_adam_state(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """What AdamW creates for `param` at its first step (so a checkpoint load has a target before any step)."""
    step_device = param.device if _step_on_device(optimizer, param) else torch.device("cpu")
    return {"step": torch.zeros((), dtype=torch.float32, device=step_device),
            "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}


def host_flat(tensors: Iterator[torch.Tensor]) -> torch.Tensor:
    """Tensors flattened and concatenated as fp32 in host memory (parity and checksums read it)."""
    return torch.cat([t.float().reshape(-1).cpu() for t in tensors])
