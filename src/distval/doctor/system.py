"""Host facts other than the network: versions and backends, devices, /dev/shm, memlock and
open-file limits. Torch is read only if the caller has imported it (versions come from
`distval.meta.versions`, which does the same), so this module stays importable without torch."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from pathlib import Path
from typing import Any

from distval import meta
from distval.results import Check, Status

GIB = 1024**3
MIB = 1024**2
SHM_WARN_BYTES = 256 * MIB  # Docker's default is 64 MiB: NCCL's SHM transport and DataLoader workers run out
NOFILE_WARN = 4096


def versions() -> dict[str, Any]:
    return meta.versions()


def check_versions(v: dict[str, Any], gpus: list[dict[str, Any]], amd: bool = False) -> Check:
    """Gloo must be there (distval's control group and every CPU job use it); with GPUs, NCCL (RCCL
    on an AMD host) too."""
    backends = ", ".join(f"{b} {'yes' if v.get(b) else 'no'}" for b in ("gloo", "mpi"))
    nccl = v.get("nccl")
    library = "RCCL" if amd else v.get("collectives") or "NCCL"
    text = f"Python {v['python']}, torch {v['torch']}, {backends}, {meta.stack_text({**v, 'collectives': library})}"
    if "gloo" in v and not v["gloo"]:
        return Check("doctor.versions", Status.FAIL, text + ": this torch has no Gloo backend", details=v,
                     hint="install a torch build with distributed support (pip install torch)")
    if gpus and "gloo" in v and not nccl:
        return Check(
            "doctor.versions",
            Status.WARN,
            text + f": {len(gpus)} GPU(s) but {library} is not usable from this torch",
            details=v,
            hint=f"install a {'ROCm' if library == 'RCCL' else 'CUDA'} build of torch that matches the driver (see "
            "pytorch.org), or use --backend gloo",
        )
    return Check("doctor.versions", Status.OK, text, details=v)


def gpus() -> list[dict[str, Any]]:
    """GPUs from `nvidia-smi` (index, name, memory, driver), [] without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version,pci.bus_id",
                              "--format=csv,noheader,nounits"], check=False, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5 and parts[0].isdigit():
            rows.append(
                {
                    "index": int(parts[0]),
                    "name": parts[1],
                    "memory_mib": int(parts[2]) if parts[2].isdigit() else None,
                    "driver": parts[3],
                    "bus_id": parts[4],
                }
            )
    return rows


def check_devices(gpu_rows: list[dict[str, Any]], cuda_visible: int | None, amd: bool = False) -> Check:
    """What the job can run on. `cuda_visible`: GPUs torch sees (None: torch not asked); `amd`:
    the rows come from amd-smi/rocm-smi."""
    cpus = os.cpu_count() or 0
    details = {"cpus": cpus, "gpus": gpu_rows, "torch_cuda_devices": cuda_visible}
    if not gpu_rows:
        return Check(
            "doctor.devices", Status.OK, f"{cpus} CPUs, no GPU (jobs run on CPU with Gloo)", details=details
        )
    names = sorted({g["name"] for g in gpu_rows})
    text = f"{cpus} CPUs, {len(gpu_rows)} GPU(s): {', '.join(names)}"
    if cuda_visible is not None and cuda_visible == 0:
        hint = ("a CPU-only torch build, or ROCR_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES hide them; install a ROCm build "
                "of torch (pip install torch --index-url https://download.pytorch.org/whl/rocm6.2)" if amd else
                "a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides them; install a CUDA build of torch")
        return Check("doctor.devices", Status.WARN, text + "; torch sees none", details=details, hint=hint)
    return Check("doctor.devices", Status.OK, text, details=details)


def check_shm(path: str = "/dev/shm") -> Check:
    name = "doctor.system shm"
    if not Path(path).is_dir():
        return Check(name, Status.WARN, f"{path} does not exist", where={"path": path},
                     hint="NCCL's SHM transport and DataLoader workers need it; mount a tmpfs there")
    st = os.statvfs(path)
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    details = {"path": path, "size_bytes": size, "free_bytes": free}
    text = f"{path}: {size / GIB:.1f} GiB ({free / GIB:.1f} GiB free)"
    if size < SHM_WARN_BYTES or free < SHM_WARN_BYTES:
        return Check(
            name,
            Status.WARN,
            f"{path} is {size / MIB:.0f} MiB ({free / MIB:.0f} MiB free): NCCL's shared-memory "
            "transport and DataLoader workers fail with 'No space left on device' or bus errors",
            details=details,
            where={"path": path},
            hint="docker run --shm-size=8g (or --ipc=host); Kubernetes: an emptyDir with medium: Memory",
        )
    return Check(name, Status.OK, text, details=details)


def _limit_text(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def rdma_devices() -> list[str]:
    try:
        return sorted(p.name for p in Path("/sys/class/infiniband").iterdir())
    except OSError:
        return []


def check_memlock(rdma: list[str]) -> Check:
    """RDMA (InfiniBand/RoCE) registers memory and needs `ulimit -l unlimited`; sockets do not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    details = {"soft": _limit_text(soft), "hard": _limit_text(hard), "rdma_devices": rdma}
    text = "memlock " + ("unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB")
    if soft == resource.RLIM_INFINITY:
        return Check("doctor.system memlock", Status.OK, text, details=details)
    if rdma:
        return Check(
            "doctor.system memlock",
            Status.WARN,
            f"{text} with RDMA devices {', '.join(rdma)}: NCCL's IB transport "
            "cannot register its buffers (ibv_reg_mr failed)",
            details=details,
            hint="ulimit -l unlimited (limits.conf: * - memlock unlimited; Docker: --ulimit memlock=-1)",
        )
    return Check("doctor.system memlock", Status.OK, f"{text}; only RDMA needs more and this host has no RDMA device",
                 details=details)


def check_nofile() -> Check:
    """Every peer is a socket or several (Gloo's full mesh per group, NCCL's per channel), plus
    data files: a job at scale runs out of descriptors at 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    details = {"soft": _limit_text(soft), "hard": _limit_text(hard)}
    if soft != resource.RLIM_INFINITY and soft < NOFILE_WARN:
        raise_to = (
            "its hard limit " + _limit_text(hard)
            if hard == resource.RLIM_INFINITY or hard > soft
            else "65536 (raise the hard limit)"
        )
        return Check(
            "doctor.system nofile",
            Status.WARN,
            f"open files limited to {soft}: large worlds and data loaders fail with 'Too many open files'",
            details=details,
            hint=f"ulimit -n to {raise_to}",
        )
    return Check(
        "doctor.system nofile",
        Status.OK,
        f"open files: {_limit_text(soft)} (hard {_limit_text(hard)})",
        details=details,
    )
