"""zero2: optimizer state and gradients partitioned (ZeRO stage 2).

As zero1 (flat buckets split evenly over ranks, parameters as views of the buckets, each rank
updating its slice in place, buckets all-gathered after the step), but gradients are kept only
as the rank's shard: on the last micro-batch of a step, post-accumulate-grad hooks mark each
parameter ready; when every member of the next bucket in line is ready, its gradients are copied
into one flat buffer, the parameters' full gradients are freed, and the buffer is
reduce-scattered asynchronously into the rank's shard. Buckets launch strictly in order, so every
rank issues the same collectives in the same order. With gradient accumulation the first K-1
micro-batches accumulate full gradients locally (no traffic, as DDP's no_sync), so the saving
holds from the last backward on; DeepSpeed instead reduces every micro-batch (K× the traffic).

Per rank (fp32 Adam): parameters 4Ψ + gradient shard 4Ψ/N + Adam 8Ψ/N.
Per step: the same collectives as zero1 (reduce-scatter + all-gather per bucket) plus the norm.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import HookStrategy, StrategyConfig
from distval.strategies.buckets import plan_buckets
from distval.strategies.flat import ShardedStrategy


class Zero2(HookStrategy, ShardedStrategy):
    name = "zero2"
    plan_model = "zero2"
    layout_options = ("bucket_mb",)  # the flat groups are the buckets
    overlaps_backward = True  # bucket reduce-scatters launch during backward

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        super().__init__(model, comm, cfg)
        self._shard_replicated(plan_buckets([p for p in model.parameters() if p.requires_grad], cfg.bucket_bytes))
        self._group_of = {id(p): i for i, g in enumerate(self.groups) for p in g.params}
        self._ready: list[set[int]] = [set() for _ in self.groups]
        self._next = 0
        self._inflight: list[tuple[Any, torch.Tensor, torch.Tensor, int]] = []

    def on_grad(self, p: nn.Parameter) -> None:
        self._ready[self._group_of[id(p)]].add(id(p))
        while self._next < len(self.groups) and len(self._ready[self._next]) == len(self.groups[self._next].params):
            self._launch(self._next)

    def _launch(self, i: int) -> None:
        group = self.groups[i]
        flat = group.flatten(p.grad if p.grad is not None else torch.zeros_like(p) for p in group.params)
        for p in group.params:
            p.grad = None  # only the shard is kept
        out = torch.empty(group.shard_numel, dtype=group.dtype, device=flat.device)
        self._inflight.append(
            (self.comm.reduce_scatter(out, flat, async_op=True), flat, out, i)
        )  # flat lives until waited
        self._next = i + 1

    def sync_gradients(self) -> None:
        while self._next < len(self.groups):
            self._launch(self._next)
        for handle, _, out, i in self._inflight:
            handle.wait()
            self.shards[i].grad = out.div_(self.world_size)
        self._inflight.clear()
        self._ready = [set() for _ in self.groups]
        self._next = 0

    def after_step(self) -> None:
        self._gather_replicated()

    def expected_comm_bytes_per_step(self, grad_accum: int) -> int:
        return 2 * self.full_bytes() + self.norm_bytes()

    def expected_model_state_bytes(self, optimizer: torch.optim.Optimizer) -> int:
        return self.full_bytes() + 3 * self.shard_bytes()
