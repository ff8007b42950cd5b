"""Device helpers: every torch.cuda call sits behind these, so CPU paths never touch CUDA."""

from __future__ import annotations

import torch
import torch.distributed as dist


def cuda_usable() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def default_backend() -> str:
    """nccl where there are GPUs and NCCL, gloo otherwise."""
    if cuda_usable() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def default_nproc() -> int:
    return torch.cuda.device_count() if cuda_usable() else 2


def check_backend(name: str) -> str:
    name = name.lower()
    if name == "auto":
        return default_backend()
    available = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}
    if name not in available:
        raise ValueError(f"unknown backend {name!r}; choose auto, gloo, nccl or mpi")
    if not available[name]:
        raise ValueError(f"backend {name!r} is not available in this torch build; use --backend gloo")
    if name == "nccl" and not cuda_usable():
        raise ValueError("backend 'nccl' needs CUDA GPUs and none is visible; use --backend gloo")
    return name


def device_for(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"
