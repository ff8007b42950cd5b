"""simple_ddp_hook: synchronize each gradient from inside backward.

A post-accumulate-grad hook on every parameter all-reduces (SUM, blocking) and divides that
parameter's gradient as soon as autograd has finished accumulating it, on the last micro-batch
only. Communication: one all_reduce per parameter per optimizer step, issued during backward in
the order gradients become ready. Blocking calls inside backward stall autograd, so little is
hidden; `simple_ddp_async` makes the same calls asynchronous.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import Strategy, StrategyConfig


class SimpleDDPHook(Strategy):
    name = "simple_ddp_hook"

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        super().__init__(model, comm, cfg)
        self._sync = False
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in model.parameters() if p.requires_grad]

    def _on_grad(self, p: nn.Parameter) -> None:
        if self._sync:
            self.comm.all_reduce(p.grad)
            p.grad.div_(self.world_size)

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
