"""bucket_ddp_async: flat gradient buckets, all-reduced asynchronously as each fills.

At construction, parameters are assigned to buckets of at most `--bucket-mb` MiB in reverse
registration order (the order backward produces gradients, as DDP assumes); membership is fixed,
so it is the same on every rank. During backward of the last micro-batch a post-accumulate-grad
hook marks the parameter ready; when every member of the next bucket in line is ready, its
gradients are copied into one flat buffer and all-reduced asynchronously (SUM). Buckets are
launched strictly in order, so every rank issues the same collectives in the same order even if
hooks fire in a different order (launched as they fill, ranks would pair one bucket's all_reduce
with another's and mix gradients silently).
`sync_gradients` launches what is left, waits, divides and copies the slices back.
Communication: one all_reduce per bucket per optimizer step, total = the gradient bytes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import HookStrategy, StrategyConfig
from distval.strategies.buckets import plan_buckets


class BucketDDPAsync(HookStrategy):
    name = "bucket_ddp_async"
    overlaps_backward = True

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        self.cap_bytes = cfg.bucket_bytes
        self.buckets = plan_buckets([p for p in model.parameters() if p.requires_grad], self.cap_bytes)
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self._ready: list[set[int]] = [set() for _ in self.buckets]
        self._next = 0  # the next bucket to launch
        self._inflight: list[tuple[Any, torch.Tensor, list[nn.Parameter]]] = []
        super().__init__(model, comm, cfg)

    def on_grad(self, p: nn.Parameter) -> None:
        self._ready[self._bucket_of[id(p)]].add(id(p))
        while self._next < len(self.buckets) and len(self._ready[self._next]) == len(self.buckets[self._next]):
            self._launch(self._next)

    def _launch(self, i: int) -> None:
        params = self.buckets[i]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self._inflight.append((self.comm.all_reduce(flat, async_op=True), flat, params))
        self._next = i + 1

    def sync_gradients(self) -> None:
        while self._next < len(self.buckets):  # buckets whose parameters got no gradient hook
            self._launch(self._next)
        for handle, flat, params in self._inflight:
            handle.wait()
            flat.div_(self.world_size)
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
        self._inflight.clear()
        self._ready = [set() for _ in self.buckets]
        self._next = 0

