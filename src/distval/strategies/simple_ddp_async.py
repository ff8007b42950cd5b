"""simple_ddp_async: launch each gradient's all-reduce during backward, wait before the step.

As simple_ddp_hook, but the hook issues an asynchronous all_reduce (SUM) and keeps the handle;
`sync_gradients` waits on every handle, then divides by the world size. Communication: one
all_reduce per parameter per optimizer step, overlapping with the rest of backward.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import HookStrategy, StrategyConfig


class SimpleDDPAsync(HookStrategy):
    name = "simple_ddp_async"
    call_per_tensor = True
    overlaps_backward = True

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        self._pending: list[tuple[Any, nn.Parameter]] = []
        super().__init__(model, comm, cfg)

    def on_grad(self, p: nn.Parameter) -> None:
        self._pending.append((self.comm.all_reduce(p.grad, async_op=True), p))

    def sync_gradients(self) -> None:
        for handle, p in self._pending:
            handle.wait()
            p.grad.div_(self.world_size)
        self._pending.clear()
