"""torchrun's environment for `distval launch`: Kubeflow's PyTorchJob and TrainJob configure
torchrun through `PET_*` variables (torchrun reads `PET_<FLAG>` as each flag's default), so
`distval launch` reads them alike and can replace torchrun in such a container unchanged.

    PET_NNODES             --nnodes
    PET_NPROC_PER_NODE     --nproc-per-node ("gpu"/"auto": one per GPU, else 1, as torchrun)
    PET_RDZV_ENDPOINT      --rdzv-endpoint
    PET_MASTER_ADDR, PET_MASTER_PORT   --rdzv-endpoint ADDR:PORT where no endpoint is given (the
                           operator's static rendezvous: distval meets by c10d at the same address)
    PET_RDZV_ID            --rdzv-id
    PET_RDZV_BACKEND       --rdzv-backend (static: c10d at the master's address)
    PET_MAX_RESTARTS       --max-restarts
    PET_NODE_RANK          not needed: c10d's rendezvous numbers the nodes (as torchrun's c10d does)

The variables become flags placed before the ones typed (and a --config file's), so flags win.
"""

from __future__ import annotations

from typing import Mapping

DIRECT = {"PET_NNODES": "--nnodes", "PET_NPROC_PER_NODE": "--nproc-per-node", "PET_RDZV_ENDPOINT": "--rdzv-endpoint",
          "PET_RDZV_ID": "--rdzv-id", "PET_MAX_RESTARTS": "--max-restarts"}


def flags(env: Mapping[str, str]) -> list[str]:
    """The flags `distval launch` takes from torchrun's PET_* variables in `env`."""
    out: list[str] = []
    for var, flag in DIRECT.items():
        value = env.get(var, "").strip()
        if not value:
            continue
        if var == "PET_NPROC_PER_NODE" and value in ("gpu", "auto", "cpu"):
            value = str(_per_node(value))
        out += [flag, value]
    if not env.get("PET_RDZV_ENDPOINT") and env.get("PET_MASTER_ADDR"):
        port = env.get("PET_MASTER_PORT", "29500").strip()
        out += ["--rdzv-endpoint", f"{env['PET_MASTER_ADDR'].strip()}:{port}"]
    backend = env.get("PET_RDZV_BACKEND", "").strip()
    if backend:
        out += ["--rdzv-backend", "c10d" if backend == "static" else backend]
    return out


def _per_node(word: str) -> int:
    """torchrun's words for --nproc-per-node: gpu (one per GPU), cpu (one per core), auto (GPUs if
    any, else cores)."""
    import os

    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if word == "gpu" and not gpus:
        raise ValueError("PET_NPROC_PER_NODE=gpu: this node has no GPU torch can use")
    return gpus if word == "gpu" or (word == "auto" and gpus) else (os.cpu_count() or 1)
