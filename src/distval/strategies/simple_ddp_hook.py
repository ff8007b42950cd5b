"""simple_ddp_hook: synchronize each gradient from inside backward.

A post-accumulate-grad hook on every parameter all-reduces (SUM, blocking) and divides that
parameter's gradient as soon as autograd has finished accumulating it, on the last micro-batch
only. Communication: one all_reduce per parameter per optimizer step, issued during backward in
the order gradients become ready. Blocking calls inside backward stall autograd, so little is
hidden; `simple_ddp_async` makes the same calls asynchronous.
"""

from __future__ import annotations

from torch import nn

from distval.strategies.base import HookStrategy


class SimpleDDPHook(HookStrategy):
    name = "simple_ddp_hook"
    call_per_tensor = True  # blocking inside backward: no overlap

    def on_grad(self, p: nn.Parameter) -> None:
        self.comm.all_reduce(p.grad)
        p.grad.div_(self.world_size)
