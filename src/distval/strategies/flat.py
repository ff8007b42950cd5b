"""What the hand-written ZeRO stages share: flat, evenly split parameter groups and the
sharded optimizer side (global-norm clipping, the portable checkpoint form, memory accounting).

A `FlatGroup` lays a group of parameters back to back in one flat buffer, padded with zeros to a
multiple of the world size N, and splits it into N equal shards: rank r owns elements
[r·s, (r+1)·s) with s = ceil(numel / N). Shards are balanced to within one element per group
(the padding lives at the end of the last ranks' shards and stays zero: its gradient is zero, so
AdamW, weight decay included, never moves it). The collectives on a group are one
reduce-scatter (input: the padded flat gradient) and one all-gather (output: the padded flat
parameters), so their nccl-tests sizes S are both `padded` elements.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import Strategy, initial_adam_state, optimizer_state_like


class FlatGroup:
    def __init__(self, params: list[nn.Parameter], names: list[str], world_size: int, rank: int):
        if len({p.dtype for p in params}) != 1:
            raise ValueError("a flat group needs parameters of one dtype")
        self.params, self.names = params, names
        self.numels = [p.numel() for p in params]
        self.numel = sum(self.numels)
        self.shard_numel = math.ceil(self.numel / world_size)
        self.padded = self.shard_numel * world_size
        self.lo = rank * self.shard_numel
        self.dtype = params[0].dtype

    @property
    def padded_bytes(self) -> int:
        return self.padded * torch.empty((), dtype=self.dtype).element_size()

    def flatten(self, tensors: Iterable[torch.Tensor]) -> torch.Tensor:
        """The padded flat concatenation (a new buffer)."""
        flat = torch.zeros(self.padded, dtype=self.dtype, device=self.params[0].device)
        offset = 0
        for t, n in zip(tensors, self.numels):
            flat[offset:offset + n].copy_(t.reshape(-1))
            offset += n
        return flat

    def views(self, flat: torch.Tensor) -> Iterator[torch.Tensor]:
        """Views of `flat` shaped like each parameter."""
        offset = 0
        for p, n in zip(self.params, self.numels):
            yield flat[offset:offset + n].view_as(p)
            offset += n

    def shard(self, flat: torch.Tensor) -> torch.Tensor:
        return flat[self.lo:self.lo + self.shard_numel]

    def all_gather(self, comm: Comm, shard: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.empty(self.padded, dtype=shard.dtype, device=shard.device) if out is None else out
        comm.all_gather(out, shard.detach().clone())  # the input never aliases the output
        return out

    def reduce_scatter_mean(self, comm: Comm, flat_grad: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the gradient summed over ranks, divided by N."""
        out = torch.empty(self.shard_numel, dtype=flat_grad.dtype, device=flat_grad.device)
        comm.reduce_scatter(out, flat_grad)
        return out.div_(comm.world_size)


def flat_groups(groups: list[list[nn.Parameter]], model: nn.Module, world_size: int, rank: int) -> list[FlatGroup]:
    if sum(p.numel() for g in groups for p in g) < world_size:
        raise ValueError(f"the model has fewer parameters than the {world_size} ranks to shard them over")
    names = {id(p): n for n, p in model.named_parameters()}
    return [FlatGroup(g, [names[id(p)] for p in g], world_size, rank) for g in groups if g]


class ShardedStrategy(Strategy):
    """A strategy whose optimizer updates this rank's flat shards (`self.shards[i]` of
    `self.groups[i]`, one fp32 Parameter each) instead of the model's parameters."""

    grads_replicated = False  # each rank keeps the reduced gradients of its shard only
    optimizer_over_flat_shards = True

    groups: list[FlatGroup]
    shards: list[nn.Parameter]

    def _shard_replicated(self, groups: list[list[nn.Parameter]]) -> None:
        """ZeRO-1/2: full parameters stay on every rank, as views into flat buckets
        (`self.flats`); each rank's optimizer updates its slice of them in place."""
        self.groups = flat_groups(groups, self.model, self.comm.world_size, self.comm.rank)
        self.flats, self.shards = [], []
        for group in self.groups:
            flat = group.flatten(p.detach() for p in group.params)
            for p, view in zip(group.params, group.views(flat)):
                p.data = view
            self.flats.append(flat)
            self.shards.append(nn.Parameter(group.shard(flat)))  # shares the flat buffer's memory

    def _gather_replicated(self) -> None:
        for group, shard, flat in zip(self.groups, self.shards, self.flats):
            group.all_gather(self.comm, shard, out=flat)

    def parameters(self) -> Iterator[nn.Parameter]:
        return iter(self.shards)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The global norm: each rank's sum of squares over its shards, summed over ranks (one
        4-byte all-reduce, on the shards' device); then every shard is scaled by the same
        coefficient, as torch.nn.utils.clip_grad_norm_ would scale the full gradient."""
        grads = [s.grad for s in self.shards if s.grad is not None]
        sq = torch.zeros(1, dtype=torch.float32, device=self.shards[0].device)
        for g in grads:
            sq += g.float().pow(2).sum()
        self.comm.all_reduce(sq, "sum")
        norm = sq.sqrt()
        if max_norm > 0:
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef.to(g.dtype))
        return norm.reshape(())

    def norm_bytes(self) -> int:
        return 4

    # -- the portable checkpoint form -----------------------------------------------------------------

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Each group's parameters and Adam moments all-gathered and cut back into tensors."""
        model: dict[str, torch.Tensor] = {}
        optim: dict[str, dict[str, torch.Tensor]] = {}
        for group, shard in zip(self.groups, self.shards):
            model.update({n: v.clone() for n, v in zip(group.names, group.views(group.all_gather(self.comm, shard)))})
            st = optimizer.state.get(shard)
            if st:  # every rank has stepped, or none has
                moments = {k: list(group.views(group.all_gather(self.comm, v))) for k, v in st.items() if k != "step"}
                for i, name in enumerate(group.names):
                    optim[name] = {"step": st["step"].clone(), **{k: views[i].clone() for k, views in moments.items()}}
        params = dict(self.model.named_parameters())
        model.update({k: v.detach().clone() for k, v in self.model.state_dict().items() if k not in params})  # buffers
        return {"model": model, "optim": optim}

    def load_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        missing = [n for g in self.groups for n in g.names if n not in state["model"]]
        if missing:
            raise ValueError(f"the checkpoint has no parameter {missing[0]!r}: it is from another model")
        optimizer.state.clear()
        for group, shard in zip(self.groups, self.shards):
            with torch.no_grad():
                shard.copy_(group.shard(group.flatten(state["model"][n] for n in group.names)))
            if all(n in state["optim"] for n in group.names):
                first = state["optim"][group.names[0]]
                optimizer.state[shard] = optimizer_state_like(optimizer, shard, {"step": first["step"], **{
                    k: group.shard(group.flatten(state["optim"][n][k] for n in group.names))
                    for k in first if k != "step"}})
        self.after_load()

    def sharded_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Per group, the parameters and Adam moments as 1-D DTensors of the group's logical
        length, sharded on dim 0 as torch.chunk splits it (which is this layout: rank r holds
        [r·s, (r+1)·s) clipped to the length), each a view of this rank's shard: `dcp.load`
        writes straight into the shards. Keys name the group's first and last parameter."""
        from torch.distributed.tensor import DTensor, Shard

        mesh = _mesh(self.comm, self.shards[0].device.type)
        state: dict[str, Any] = {}
        step = None
        for group, shard in zip(self.groups, self.shards):
            st = optimizer.state[shard]
            if not st:  # no step yet: AdamW's own initial state (what it would create), so load has a target
                st.update(initial_adam_state(optimizer, shard))
            valid = max(0, min(group.shard_numel, group.numel - group.lo))
            key = f"{group.names[0]}..{group.names[-1]}"
            for part, t in (("param", shard.detach()), ("exp_avg", st["exp_avg"]), ("exp_avg_sq", st["exp_avg_sq"])):
                state[f"{key}/{part}"] = DTensor.from_local(t[:valid], mesh, [Shard(0)], run_check=False,
                                                            shape=torch.Size([group.numel]), stride=(1,))
            step = st["step"]
        state["step"] = step.detach().clone()
        return state

    def finish_sharded_load(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        for shard in self.shards:
            optimizer.state[shard].update(optimizer_state_like(optimizer, shard, {"step": state["step"]}))
        self.after_load()

    def after_load(self) -> None:
        """Bring the model's parameters in line with the shards just loaded (ZeRO-1/2: gather)."""
        self._gather_replicated()

    # -- memory ---------------------------------------------------------------------------------------

    def model_state_tensors(self, optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
        yield from super().model_state_tensors(optimizer)
        for s in self.shards:
            yield s
            if s.grad is not None:
                yield s.grad

    def shard_bytes(self) -> int:
        return sum(g.shard_numel * torch.empty((), dtype=g.dtype).element_size() for g in self.groups)

    def full_bytes(self) -> int:
        return sum(g.padded_bytes for g in self.groups)


def _mesh(comm: Comm, device_type: str) -> Any:
    """A 1-D DeviceMesh over the strategy's process group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(comm.group or dist.group.WORLD, device_type)
