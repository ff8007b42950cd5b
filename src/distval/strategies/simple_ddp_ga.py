"""simple_ddp_ga: gradient accumulation done right.

Micro-batches accumulate gradients locally; only after the K-th backward is every parameter's
gradient all-reduced (SUM, blocking) and divided by the world size. Communication: one
all_reduce per parameter per optimizer step, whatever K is (the accumulation condition is the
loop's `is_last`, tested to fire exactly once per step).
"""

from __future__ import annotations

from distval.strategies.base import Strategy


class SimpleDDPGA(Strategy):
    name = "simple_ddp_ga"
    call_per_tensor = True

    def sync_gradients(self) -> None:
        for p in self.model.parameters():
            if p.grad is not None:
                self.comm.all_reduce(p.grad)
                p.grad.div_(self.world_size)
