"""zero1: optimizer state partitioned over ranks (ZeRO stage 1, Rajbhandari et al. 2020).

Parameters are grouped into flat buckets of at most `--bucket-mb` MiB (reverse registration order,
as the DDP buckets) and each bucket is split into N equal element ranges (strategies/flat.py), so
every rank owns 1/N of every bucket: balanced to within one element per bucket, unlike handing
whole tensors to owner ranks. The model's parameters become views into the flat buckets and the
rank's optimizer updates its slice of them in place (no master copy in fp32). Gradients
accumulate into flat gradient buckets as well (each p.grad is a view, as DDP's
gradient_as_bucket_view), and after the last micro-batch each bucket is reduce-scattered, so the
rank receives the mean gradient of exactly the slice it owns. After the step every bucket is
all-gathered back into the full parameters.

Per rank (fp32 Adam, Ψ parameters): parameters 4Ψ + gradients 4Ψ + Adam's two moments 8Ψ/N
(the reduced gradient shard is a slice of the gradient buckets: no extra memory).
Per step: one reduce-scatter and one all-gather per bucket (S = the padded bucket each), so the
wire volume (n-1)/n·S twice equals one DDP all-reduce 2(n-1)/n·S; plus the 4-byte global norm.
"""

from __future__ import annotations

import torch
from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import StrategyConfig
from distval.strategies.buckets import plan_buckets
from distval.strategies.flat import ShardedStrategy


class Zero1(ShardedStrategy):
    name = "zero1"
    plan_model = "zero1"
    layout_options = ("bucket_mb",)  # the flat groups are the buckets

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        super().__init__(model, comm, cfg)
        self._shard_replicated(plan_buckets([p for p in model.parameters() if p.requires_grad], cfg.bucket_bytes))
        self.grad_flats = [torch.zeros(g.padded, dtype=g.dtype, device=g.params[0].device) for g in self.groups]
        self._point_grads()

    def _point_grads(self) -> None:
        for group, grad in zip(self.groups, self.grad_flats):
            for p, view in zip(group.params, group.views(grad)):
                p.grad = view  # autograd accumulates into it in place

    def sync_gradients(self) -> None:
        for group, shard, grad in zip(self.groups, self.shards, self.grad_flats):
            mine = group.shard(grad)
            mine.copy_(group.reduce_scatter_mean(self.comm, grad))
            shard.grad = mine

    def after_step(self) -> None:
        self._gather_replicated()
        for grad in self.grad_flats:
            grad.zero_()
        self._point_grads()

    def expected_comm_bytes_per_step(self, grad_accum: int) -> int:
        return 2 * self.full_bytes() + self.norm_bytes()

    def expected_model_state_bytes(self, optimizer: torch.optim.Optimizer) -> int:
        return 2 * self.full_bytes() + 2 * self.shard_bytes()

    def close(self) -> None:
        for p in self.model.parameters():
            p.grad = None
