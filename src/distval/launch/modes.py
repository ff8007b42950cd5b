"""How this process was started, and torch's rank variables for each way.

  local     distval starts the workers itself (launch/local.py)
  torchrun  we are one worker of an outer launcher that set RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*
  slurm/mpi one task of `srun` (SLURM_PROCID, SLURM_STEP_NUM_TASKS, ...) or mpirun
            (OMPI_COMM_WORLD_*, PMI_*): the variables are mapped onto torch's
"""

from __future__ import annotations

import os
import re

from distval.launch.config import LaunchOptions
from distval.results import CannotRun


def detect_mode(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torchrun"
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env and int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        return "slurm"
    if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        return "mpi"
    return "local"


def planned_world_size(opts: LaunchOptions, env: dict[str, str] | None = None) -> int:
    """The world size the job will have, known before launching (to validate flags early)."""
    env = dict(os.environ if env is None else env)
    mode = detect_mode(env)
    if mode == "local":
        from distval import device as devices  # imports torch: not for the command line's first look

        return (opts.nproc or devices.default_nproc()) * opts.nnodes
    return int(worker_env(mode, env).get("WORLD_SIZE") or env["WORLD_SIZE"])


def worker_env(mode: str, env: dict[str, str]) -> dict[str, str]:
    """torch's rank variables for a Slurm or MPI task (torchrun's are used as they are)."""
    if mode == "slurm":
        out = {
            "RANK": env["SLURM_PROCID"],
            "WORLD_SIZE": env["SLURM_STEP_NUM_TASKS"],
            "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
            "MASTER_ADDR": env.get("MASTER_ADDR")
            or first_slurm_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")),
            "MASTER_PORT": env.get("MASTER_PORT") or str(29500 + int(env.get("SLURM_JOB_ID", "0")) % 1000),
        }
    elif mode == "mpi":
        rank = env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK"))
        size = env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE"))
        if "MASTER_ADDR" not in env:
            raise CannotRun(
                "launched by mpirun but MASTER_ADDR is not set; "
                "export MASTER_ADDR=<first host> (and MASTER_PORT) with mpirun -x"
            )
        out = {
            "RANK": rank,
            "WORLD_SIZE": size,
            "LOCAL_RANK": env.get("OMPI_COMM_WORLD_LOCAL_RANK", env.get("MPI_LOCALRANKID", "0")),
            "MASTER_ADDR": env["MASTER_ADDR"],
            "MASTER_PORT": env.get("MASTER_PORT", "29500"),
        }
    else:
        return {}
    return {k: str(v) for k, v in out.items()}


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: 'gpu[03-05,9],cpu1' -> 'gpu03'."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise CannotRun(f"cannot read the Slurm node list {nodelist!r}; set MASTER_ADDR")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def check_world(world_size: int, expect_world: int | None, env: dict[str, str]) -> None:
    """Fail fast on the "world of one": every process thinks it is alone (nccl-tests without
    MPI=1, srun without task variables...), which otherwise runs N copies of a 1-rank job."""
    if expect_world is not None and world_size != expect_world:
        alone = world_size == 1
        raise CannotRun(
            f"expected a world of {expect_world} ranks but this process sees WORLD_SIZE={world_size}"
            + (" (each process found itself alone)" if alone else "")
            + "; launch with `torchrun --nproc-per-node N`, `srun --ntasks N distval ...`, or `distval ... --nproc N`"
        )
