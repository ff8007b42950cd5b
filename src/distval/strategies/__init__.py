"""Strategies by name: the loop asks the registry, never branches on a name."""

from __future__ import annotations

from torch import nn

from distval.comm.layer import Comm
from distval.strategies.base import Strategy, StrategyConfig
from distval.strategies.bucket_ddp_async import BucketDDPAsync
from distval.strategies.pytorch_ddp import PytorchDDP
from distval.strategies.simple_ddp import SimpleDDP
from distval.strategies.simple_ddp_async import SimpleDDPAsync
from distval.strategies.simple_ddp_ga import SimpleDDPGA
from distval.strategies.simple_ddp_hook import SimpleDDPHook

REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (SimpleDDP, SimpleDDPGA, SimpleDDPHook, SimpleDDPAsync, BucketDDPAsync, PytorchDDP)
}
DDP_FAMILY = list(REGISTRY)


def check_name(name: str) -> str:
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(REGISTRY)}")
    return name


def build(name: str, model: nn.Module, comm: Comm, cfg: StrategyConfig) -> Strategy:
    return REGISTRY[check_name(name)](model, comm, cfg)


__all__ = ["REGISTRY", "DDP_FAMILY", "Strategy", "StrategyConfig", "build", "check_name"]
