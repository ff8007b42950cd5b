"""Device helpers: every torch.cuda call sits behind these, so CPU paths never touch CUDA."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from distval.rocm import platform as rocm_platform


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


WORKER_BYTES = 256 << 20  # what one local worker (an interpreter with torch) takes at the least


def check_local_workers(nproc: int, backend: str) -> None:
    """Before any local worker starts: NCCL needs a GPU per rank, and the host must be able to
    hold the workers at all (a ValueError: one line, exit 2)."""
    gpus = torch.cuda.device_count() if cuda_usable() else 0
    if backend == "nccl" and nproc > gpus:
        raise ValueError(f"--nproc {nproc} with NCCL needs {nproc} GPUs and this host has {gpus}: use --nproc "
                         f"{gpus}, or --backend gloo (CPU ranks)")
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on Linux: no limit known
        return
    if nproc > memory // WORKER_BYTES:
        raise ValueError(f"--nproc {nproc}: this host cannot start that many workers ({memory / 2**30:.0f} GiB of "
                         f"memory, at least {WORKER_BYTES >> 20} MiB each: at most {memory // WORKER_BYTES}); lower "
                         f"--nproc, or spread the ranks over nodes (--nnodes)")


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


def nccl_version() -> str | None:
    """The collective library's version where it and a GPU are there (e.g. "2.28.9"), else None:
    NCCL's on CUDA, RCCL's on ROCm (torch keeps the name "nccl" there)."""
    if dist.is_nccl_available() and cuda_usable():
        return ".".join(str(v) for v in torch.cuda.nccl.version())
    return None


def collective_library() -> str:
    """"RCCL" on a ROCm build of torch (backend "nccl" is RCCL underneath), else "NCCL"."""
    return "RCCL" if torch.version.hip else "NCCL"


def gpu_runtime() -> str | None:
    """"ROCm 6.2" or "CUDA 12.4": what this torch was built for; None for a CPU build."""
    if torch.version.hip:
        return f"ROCm {rocm_platform.rocm_version(torch.version.hip) or torch.version.hip}"
    return f"CUDA {torch.version.cuda}" if torch.version.cuda else None


def gpu_identity(device: torch.device) -> dict | None:
    """What names a GPU: torch's name and, on ROCm, its gfx target, compute units and memory (a
    ROCm release may name every GPU "AMD Radeon Graphics"); None on CPU. The planner's presets
    turn it into a preset (`presets.preset_for`)."""
    if device.type != "cuda":
        return None
    out = {"name": torch.cuda.get_device_name(device)}
    if torch.version.hip:
        props = torch.cuda.get_device_properties(device)
        out.update(arch=getattr(props, "gcnArchName", None), compute_units=props.multi_processor_count,
                   memory_bytes=props.total_memory)
    return out


def bf16_unsupported() -> bool:
    """True on a GPU without bf16 (pre-Ampere); False on CPU, which emulates it."""
    return cuda_usable() and not torch.cuda.is_bf16_supported()


def current_memory_bytes(device: torch.device) -> int:
    """What the CUDA allocator holds now on a GPU; the process's resident set on the host."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the peak is what there is
        return peak_memory_bytes(device)


def peak_memory_bytes(device: torch.device) -> int:
    """The CUDA allocator's peak on a GPU; the process's peak RSS on the host."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def rng_state(device: torch.device) -> torch.Tensor | None:
    """The generator state of this CUDA device (in host memory); None on the host."""
    return torch.cuda.get_rng_state(device).cpu() if device.type == "cuda" else None


def set_rng_state(state: torch.Tensor, device: torch.device) -> None:
    """Restore a CUDA device's generator (on that device), from `rng_state`."""
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
