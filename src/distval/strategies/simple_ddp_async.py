"""simple_ddp_async: launch each gradient's all-reduce during backward, wait before the step.

As simple_ddp_hook, but the hook issues an asynchronous all_reduce (SUM) and keeps the handle;
`sync_gradients` waits on every handle, then divides by the world size. Communication: one
all_reduce per parameter per optimizer step, overlapping with the rest of backward.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import Strategy, StrategyConfig


class SimpleDDPAsync(Strategy):
    name = "simple_ddp_async"

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        super().__init__(model, comm, cfg)
        self._sync = False
        self._pending: list[tuple[Any, nn.Parameter]] = []
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in model.parameters() if p.requires_grad]

    def _on_grad(self, p: nn.Parameter) -> None:
        if self._sync:
            self._pending.append((self.comm.all_reduce(p.grad, async_op=True), p))

    @contextlib.contextmanager
    def micro_batch(self, is_last: bool) -> Iterator[None]:
        self._sync = is_last
        try:
            yield
        finally:
            self._sync = False

    def sync_gradients(self) -> None:
        for handle, p in self._pending:
            handle.wait()
            p.grad.div_(self.world_size)
        self._pending.clear()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
