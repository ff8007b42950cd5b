"""pytorch_ddp: torch.nn.parallel.DistributedDataParallel, the reference implementation.

DDP buckets gradients (`bucket_cap_mb`), all-reduces each bucket asynchronously during backward
and waits before backward returns; `no_sync()` skips synchronization on the first K-1
micro-batches. Its bucket all-reduces run through a communication hook that calls distval's
collective layer, so they are counted like the hand-written strategies' (SUM of the bucket
pre-divided by the world size, as DDP's default hook). `--comm-hook fp16|bf16` compresses each
bucket to 16 bits for the all-reduce (half the bytes) and back; `powersgd` uses torch's PowerSGD
hook (rank r low-rank approximation): its traffic bypasses the layer and is not counted.
The exposed part of the communication (for compare's hidden share) is measured around backward:
see `micro_batch`.
"""

# No `from __future__ import annotations` here: DDP checks the hook's `bucket` annotation at
# run time and rejects the string form.
import contextlib
import itertools
import time
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from distval.comm.layer import Comm
from distval.strategies.base import Strategy, StrategyConfig


class PytorchDDP(Strategy):
    name = "pytorch_ddp"
    overlaps_backward = True

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        super().__init__(model, comm, cfg)
        self.ddp = DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_mb, broadcast_buffers=False,
                                           process_group=comm.group)
        if cfg.comm_hook == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

            state = powersgd.PowerSGDState(process_group=comm.group, matrix_approximation_rank=cfg.powersgd_rank,
                                           start_powerSGD_iter=2)
            self.ddp.register_comm_hook(state, powersgd.powerSGD_hook)
        else:
            wire = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}[cfg.comm_hook]
            self.ddp.register_comm_hook(None, self._hook(wire))

    def _hook(self, wire_dtype: torch.dtype | None):
        comm, n = self.comm, self.world_size

        def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            buf = bucket.buffer()
            send = buf.div_(n) if wire_dtype is None else buf.div(n).to(wire_dtype)
            fut = comm.all_reduce_future(send)
            if wire_dtype is None:
                return fut

            def back(f: torch.futures.Future) -> torch.Tensor:
                return buf.copy_(f.value())

            return fut.then(back)

        return hook

    @property
    def module(self) -> nn.Module:
        return self.ddp

    @contextlib.contextmanager
    def micro_batch(self, is_last: bool) -> Iterator[None]:
        """no_sync() for the first K-1 micro-batches. On the last, the exposed communication is
        measured: DDP's reducer launches a bucket's all-reduce as soon as its gradients are ready
        and, once the last bucket is launched, waits inside backward for all of them; that wait
        (last launch to backward's return) is the communication backward could not hide. It is an
        upper bound: the reducer's copy of the averaged buckets back into .grad is in it too."""
        if not is_last:
            with self.ddp.no_sync():
                yield
            return
        first = self.comm.issued
        yield
        returned = time.perf_counter()
        # this backward's records are the newest: walk back from the end of the ring buffer only
        launched = [r.start_s for r in itertools.takewhile(lambda r: r.seq >= first, reversed(self.comm.records))
                    if r.op == "all_reduce"]
        if launched and self.cfg.comm_hook != "powersgd":
            self.comm.add_blocked("all_reduce", max(0.0, returned - max(launched)))

    def expected_comm_bytes_per_step(self, grad_accum: int) -> int | None:
        if self.cfg.comm_hook == "powersgd":
            return None  # torch's hook issues its own collectives
        return self.grad_bytes() // (2 if self.cfg.comm_hook in ("fp16", "bf16") else 1)
