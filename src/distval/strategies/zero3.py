"""zero3: parameters, gradients and optimizer state partitioned (ZeRO stage 3, FSDP's FULL_SHARD).

Units are the model's transformer blocks (`model.blocks`) and the root (everything else:
embeddings, final norm, heads). Each unit is one flat group split evenly over ranks
(strategies/flat.py); a rank keeps only its shard of it (a separate fp32 Parameter that its
optimizer updates). A unit's full parameters exist only while needed:

    forward    pre-forward hook: all-gather the unit into its flat buffer, the parameters are
               views of it; post-forward hook: free the buffer (storage resized to 0), and hook
               the output tensor so that ...
    backward   ... when the output's gradient arrives (the unit's backward is next), the unit is
               all-gathered again; when autograd has accumulated every parameter's gradient
               (post-accumulate-grad hooks), the gradients are flattened, freed, reduce-scattered
               and added to the shard's gradient, and the unit's buffer is freed.

The root is gathered before the whole forward and again when the logits' gradient arrives, so it
stays whole through the backward (its head runs first, its embedding last). Every micro-batch
reduces its gradients (full gradients are never kept), so with accumulation K the traffic is K
times one micro-batch's.

Per rank (fp32 Adam): shard 4Ψ/N + gradient shard 4Ψ/N + Adam 8Ψ/N = 16Ψ/N, plus transiently one
or two units' full parameters and gradients. Per micro-batch per unit: two all-gathers and one
reduce-scatter of the padded unit (S each): wire volume 3(n-1)/n·S = 1.5x DDP's 2(n-1)/n·S.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch
from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import StrategyConfig, host_flat
from distval.strategies.flat import ShardedStrategy, flat_groups


class Zero3(ShardedStrategy):
    name = "zero3"
    compiles = False
    compiles_not = ("gathers each layer's parameters in forward hooks and frees them after: the compiled graph "
                    "would be guarded on storages that change at every call (a recompile or a break per layer)")
    params_sharded = True
    plan_model = "zero3"

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        super().__init__(model, comm, cfg)
        blocks = list(getattr(model, "blocks", []))
        in_blocks = {id(p) for b in blocks for p in b.parameters()}
        root = [p for p in model.parameters() if p.requires_grad and id(p) not in in_blocks]
        units = [(b, [p for p in b.parameters() if p.requires_grad]) for b in blocks] + [(model, root)]
        units = [(m, ps) for m, ps in units if ps]
        self.groups = flat_groups([ps for _, ps in units], model, comm.world_size, comm.rank)
        self.flats, self.shards = [], []
        for group in self.groups:
            flat = group.flatten(p.detach() for p in group.params)
            self.shards.append(nn.Parameter(group.shard(flat).clone()))
            for p, view in zip(group.params, group.views(flat)):
                p.data = view
            self.flats.append(flat)
            _free(flat)
        self._group_of = {id(p): i for i, g in enumerate(self.groups) for p in g.params}
        self._ready = [0] * len(self.groups)
        self._handles = []
        for i, (module, params) in enumerate(units):
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._pre_forward, i)))
            self._handles.append(module.register_forward_hook(functools.partial(self._post_forward, i)))
            self._handles += [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]

    # -- gather and free ------------------------------------------------------------------------------

    def _gather(self, i: int) -> None:
        flat = self.flats[i]
        if flat.untyped_storage().nbytes() == 0:
            flat.untyped_storage().resize_(flat.numel() * flat.element_size())
            self.groups[i].all_gather(self.comm, self.shards[i], out=flat)

    def _pre_forward(self, i: int, module: nn.Module, args: Any) -> None:
        self._gather(i)

    def _post_forward(self, i: int, module: nn.Module, args: Any, out: Any) -> None:
        _free(self.flats[i])
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: self._gather(i))  # before this unit's backward

    def _grad_ready(self, p: nn.Parameter) -> None:
        i = self._group_of[id(p)]
        self._ready[i] += 1
        if self._ready[i] == len(self.groups[i].params):
            self._reduce(i)

    def _reduce(self, i: int) -> None:
        group, shard = self.groups[i], self.shards[i]
        flat_grad = group.flatten(p.grad if p.grad is not None else torch.zeros_like(p) for p in group.params)
        for p in group.params:
            p.grad = None
        mine = group.reduce_scatter_mean(self.comm, flat_grad)
        shard.grad = mine if shard.grad is None else shard.grad.add_(mine)
        self._ready[i] = 0
        _free(self.flats[i])

    @contextlib.contextmanager
    def micro_batch(self, is_last: bool) -> Iterator[None]:
        try:
            yield
        finally:  # a unit only some of whose parameters got gradients: reduce what there is
            for i, ready in enumerate(self._ready):
                if ready:
                    self._reduce(i)
            for flat in self.flats:
                _free(flat)

    # -- the rest of the interface --------------------------------------------------------------------

    def full_parameters(self) -> torch.Tensor:
        full = {}
        for group, shard in zip(self.groups, self.shards):
            full.update(zip(map(id, group.params), group.views(group.all_gather(self.comm, shard))))
        return host_flat(full.get(id(p), p.detach()) for p in self.model.parameters())

    def after_load(self) -> None:
        """Nothing to gather: the next forward all-gathers each unit from the loaded shards."""

    def expected_comm_bytes_per_step(self, grad_accum: int) -> int:
        return 3 * grad_accum * self.full_bytes() + self.norm_bytes()

    def expected_model_state_bytes(self, optimizer: torch.optim.Optimizer) -> int:
        return 4 * self.shard_bytes()

    def close(self) -> None:
        """The model gets its full parameters back as ordinary tensors."""
        for h in self._handles:
            h.remove()
        for group, shard in zip(self.groups, self.shards):
            full = group.all_gather(self.comm, shard)
            for p, view in zip(group.params, group.views(full)):
                p.data = view.clone()


def _free(flat: torch.Tensor) -> None:
    flat.untyped_storage().resize_(0)
