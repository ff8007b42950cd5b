"""dp: torch.nn.DataParallel, one process driving every local GPU (the path older code still takes),
for `compare` to set against the one-process-per-GPU strategies.

At every forward DataParallel copies the module from GPU 0 to the others, splits the batch along
dim 0, runs the replicas in threads, gathers the outputs on GPU 0; backward sums the replicas'
gradients back onto GPU 0's parameters. So the world is one process (run with `--nproc 1` and the
whole batch), p.grad is already the mean over the batch, and GPU 0 holds more than the others
(the outputs, the loss, the optimizer state): `compare` reports each GPU's peak. On a host with
fewer than two GPUs there is nothing to compare with; `compare` says so (a SKIP).
"""

from __future__ import annotations

import torch
from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import Strategy, StrategyConfig


def unavailable() -> str | None:
    """Why dp cannot run here, or None."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        return f"nn.DataParallel splits each batch over 2 or more local GPUs; this host has {gpus}"
    return None


class DataParallel(Strategy):
    name = "dp"
    counts_all_comm = False  # DataParallel's copies are its own (broadcast/reduce through NCCL), not counted
    single_process = True
    compiles = False
    compiles_not = "replicates the module onto every GPU at each call and runs the copies in threads, which " \
        "torch.compile does not trace"

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        if comm.world_size != 1:
            raise ValueError(f"dp is one process driving every local GPU: run it with --nproc 1 (got "
                             f"{comm.world_size} ranks)")
        super().__init__(model, comm, cfg)
        self.wrapped = nn.DataParallel(model)

    @property
    def module(self) -> nn.Module:
        return self.wrapped

    def expected_comm_bytes_per_step(self, grad_accum: int) -> int | None:
        return 0  # nothing goes through distval's collective layer
