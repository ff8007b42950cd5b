"""`distval slurm`: write an sbatch script that runs a distval command on N nodes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from distval.cli.app import app, check_inner, check_outputs
from distval.cli.app import option as O  # noqa: N812
from distval.launch.slurm import SlurmJob, check_syntax, sbatch_script
from distval.results import atomic_write_text


@app.command("slurm")
def slurm(
    command: Annotated[
        Optional[list[str]], typer.Argument(help="The distval command to run, after `--`.", show_default=False)
    ] = None,
    nodes: Annotated[int, O("--nodes", help="Nodes (one srun task, one torchrun each).")] = 1,
    gpus_per_node: Annotated[
        Optional[int], O("--gpus-per-node", help="GPUs per node (#SBATCH --gpus-per-node; one worker each).")
    ] = None,
    nproc_per_node: Annotated[
        Optional[int], O("--nproc-per-node", help="Workers per node (default: --gpus-per-node, else 1).")
    ] = None,
    partition: Annotated[Optional[str], O("--partition", help="Slurm partition.")] = None,
    time_limit: Annotated[Optional[str], O("--time", help="Time limit, e.g. 00:30:00.")] = None,
    ifname: Annotated[
        Optional[str],
        O("--ifname", help="Network interface for Gloo and NCCL (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)."),
    ] = None,
    out: Annotated[Optional[Path], O("--out", help="Write the script here (default: print it).")] = None,
) -> int:
    """Write an sbatch script: srun one task per node, torchrun per node, c10d rendezvous on the first node."""
    inner = check_inner(command or [], where="distval slurm")
    job = SlurmJob(tuple(inner), num_nodes=nodes, gpus_per_node=gpus_per_node, nproc_per_node=nproc_per_node,
                   partition=partition, time=time_limit, ifname=ifname)
    text = sbatch_script(job)
    check_syntax(text)
    if out is None:
        print(text, end="")
        return 0
    check_outputs({"--out": out})
    atomic_write_text(out, text)
    os.chmod(out, 0o755)
    print(f"wrote {out}; submit it with: sbatch {out}")
    return 0

