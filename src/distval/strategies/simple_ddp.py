"""simple_ddp: the naive data parallelism of every tutorial.

After each micro-batch's backward, every parameter's gradient is all-reduced (SUM, blocking) and
divided by the world size. Communication: one all_reduce per parameter per micro-batch, of the
parameter's gradient bytes; nothing overlaps with compute. With accumulation it synchronizes K
times per optimizer step (still correct: the already-averaged part is equal on every rank, so
averaging it again leaves it unchanged), which is what the accumulation variants avoid.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from distval.strategies.base import Strategy


class SimpleDDP(Strategy):
    name = "simple_ddp"
    syncs_every_micro_batch = True
    call_per_tensor = True

    @contextlib.contextmanager
    def micro_batch(self, is_last: bool) -> Iterator[None]:
        yield
        for p in self.model.parameters():
            if p.grad is not None:
                self.comm.all_reduce(p.grad)
                p.grad.div_(self.world_size)
