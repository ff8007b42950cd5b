"""Strategies by name: the loop asks the registry, never branches on a name."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from distval.strategies.config import StrategyConfig

if TYPE_CHECKING:
    from torch import nn

    from distval.comm.layer import Comm
    from distval.strategies.base import Strategy

# name -> module:class; the classes (and torch) are imported when REGISTRY is first read, so the
# command line reads the strategies' options without torch
_CLASSES = {"simple_ddp": "simple_ddp:SimpleDDP", "simple_ddp_ga": "simple_ddp_ga:SimpleDDPGA",
            "simple_ddp_hook": "simple_ddp_hook:SimpleDDPHook", "simple_ddp_async": "simple_ddp_async:SimpleDDPAsync",
            "bucket_ddp_async": "bucket_ddp_async:BucketDDPAsync", "pytorch_ddp": "pytorch_ddp:PytorchDDP",
            "zero1": "zero1:Zero1", "zero2": "zero2:Zero2", "zero3": "zero3:Zero3",
            "pytorch_zero1": "pytorch_zero1:PytorchZero1", "fsdp2": "fsdp2:FSDP2", "dp": "dataparallel:DataParallel"}
_registry: dict[str, type[Strategy]] = {}


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":
        if not _registry:
            for key, where in _CLASSES.items():
                module, cls = where.split(":")
                _registry[key] = getattr(importlib.import_module(f"distval.strategies.{module}"), cls)
                assert _registry[key].name == key, (key, where)
        return _registry
    if name == "Strategy":
        from distval.strategies.base import Strategy

        return Strategy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


BUCKETED = ("bucket_ddp_async", "pytorch_ddp", "zero1", "zero2")  # --bucket-mb changes what they do
DDP_FAMILY = ["simple_ddp", "simple_ddp_ga", "simple_ddp_hook", "simple_ddp_async", "bucket_ddp_async", "pytorch_ddp"]
SHARDED = ["zero1", "zero2", "zero3", "pytorch_zero1", "fsdp2"]


def check_name(name: str) -> str:
    if name not in _CLASSES:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(_CLASSES)}")
    return name


def build(name: str, model: nn.Module, comm: Comm, cfg: StrategyConfig) -> Strategy:
    return __getattr__("REGISTRY")[check_name(name)](model, comm, cfg)


__all__ = ["REGISTRY", "BUCKETED", "DDP_FAMILY", "SHARDED", "Strategy", "StrategyConfig", "build", "check_name"]
