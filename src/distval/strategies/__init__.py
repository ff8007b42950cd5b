"""Strategies by name: the loop asks the registry, never branches on a name."""

from __future__ import annotations

from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import Strategy, StrategyConfig
from distval.strategies.bucket_ddp_async import BucketDDPAsync
from distval.strategies.dataparallel import DataParallel
from distval.strategies.fsdp2 import FSDP2
from distval.strategies.pytorch_ddp import PytorchDDP
from distval.strategies.pytorch_zero1 import PytorchZero1
from distval.strategies.simple_ddp import SimpleDDP
from distval.strategies.simple_ddp_async import SimpleDDPAsync
from distval.strategies.simple_ddp_ga import SimpleDDPGA
from distval.strategies.simple_ddp_hook import SimpleDDPHook
from distval.strategies.zero1 import Zero1
from distval.strategies.zero2 import Zero2
from distval.strategies.zero3 import Zero3

REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (SimpleDDP, SimpleDDPGA, SimpleDDPHook, SimpleDDPAsync, BucketDDPAsync, PytorchDDP,
                              Zero1, Zero2, Zero3, PytorchZero1, FSDP2, DataParallel)
}
BUCKETED = ("bucket_ddp_async", "pytorch_ddp", "zero1", "zero2")  # --bucket-mb changes what they do
DDP_FAMILY = ["simple_ddp", "simple_ddp_ga", "simple_ddp_hook", "simple_ddp_async", "bucket_ddp_async", "pytorch_ddp"]
SHARDED = ["zero1", "zero2", "zero3", "pytorch_zero1", "fsdp2"]


def check_name(name: str) -> str:
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(REGISTRY)}")
    return name


def build(name: str, model: nn.Module, comm: Comm, cfg: StrategyConfig) -> Strategy:
    return REGISTRY[check_name(name)](model, comm, cfg)


__all__ = ["REGISTRY", "BUCKETED", "DDP_FAMILY", "SHARDED", "Strategy", "StrategyConfig", "build", "check_name"]
