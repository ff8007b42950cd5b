"""Facts every report carries: versions, backend, world size, hosts, how it was launched, the
resolved configuration and the command line that reproduces it."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

import distval
from distval import envvars

if TYPE_CHECKING:
    from distval.results import JobResult

_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "MASTER_", "OMP_NUM_THREADS", "RCCL_", "HSA_",
                 "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def versions() -> dict[str, Any]:
    """Versions; backend facts only where torch is already loaded (a command that ran ranks):
    `distval plan` reports without importing torch."""
    out: dict[str, Any] = {
        "distval": distval.__version__,
        "python": platform.python_version(),
        "torch": _version("torch"),
    }
    if "torch" in sys.modules:
        import torch
        import torch.distributed as dist

        from distval.device import collective_library, gpu_runtime, nccl_version

        # on ROCm "nccl" is RCCL's version and `collectives` says so; `runtime` is "ROCm 6.2" there
        out.update(gloo=dist.is_gloo_available(), mpi=dist.is_mpi_available(), cuda=torch.version.cuda,
                   hip=torch.version.hip, runtime=gpu_runtime(), collectives=collective_library(),
                   nccl=nccl_version())
    return out


def stack_text(v: dict[str, Any]) -> str:
    """The GPU stack of `versions()` in words: "NCCL 2.21.5, CUDA 12.4", "RCCL 2.20.5, ROCm 6.2",
    "NCCL no" (no GPU library usable)."""
    library = v.get("collectives") or "NCCL"
    text = f"{library} {v.get('nccl') or 'no'}"
    runtime = v.get("runtime") or (f"CUDA {v['cuda']}" if v.get("cuda") else None)
    return text + (f", {runtime}" if runtime else "")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def collect(job: "JobResult | None", config: Any = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": ["distval", *sys.argv[1:]],
        "versions": versions(),
        "platform": platform.platform(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
    }
    if job is not None:
        meta.update(world_size=job.world_size, backend=job.backend, launch=job.mode, hosts=job.hosts,
                    devices=sorted({r["device"] for r in job.ranks}))
    if os.environ.get(envvars.EMULATED.name):  # set by `distval emulate` on every node: the emulated topology
        meta["emulated"] = json.loads(os.environ[envvars.EMULATED.name])
    if config is not None and dataclasses.is_dataclass(config):
        meta["config"] = dataclasses.asdict(config)
    meta.update(extra)
    return meta
