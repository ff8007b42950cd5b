"""`distval slurm`: write an sbatch script that runs a distval command on N nodes.

The script runs one Slurm task per node (`srun --ntasks-per-node=1`), and each task starts
torchrun, which starts the node's workers and joins a c10d rendezvous hosted on the job's first
node (`scontrol show hostnames $SLURM_JOB_NODELIST | head -n1`), with the job id as rendezvous
id. Workers see torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR...), so distval runs in its
torchrun mode; `--ifname` pins both Gloo and NCCL to one interface (GLOO_SOCKET_IFNAME,
NCCL_SOCKET_IFNAME), the fix for jobs that hang at init because auto-detection chose docker0, a
VPN or the management network. The script is checked with `bash -n` before it is written.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

_TIME = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$")
_PARTITION = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
RDZV_PORT = 29500


@dataclass(frozen=True)
class SlurmJob:
    command: tuple[str, ...]  # the distval command line, without "distval"
    num_nodes: int = 1
    gpus_per_node: int | None = None
    nproc_per_node: int | None = None
    partition: str | None = None
    time: str | None = None
    ifname: str | None = None
    job_name: str = "distval"
    python: str = sys.executable

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"--nodes must be at least 1 (got {self.num_nodes})")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ValueError(f"--gpus-per-node must be at least 1 (got {self.gpus_per_node})")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node must be at least 1 (got {self.nproc_per_node})")
        if self.partition is not None and not _PARTITION.match(self.partition):
            raise ValueError(
                f"--partition {self.partition!r} is not a Slurm partition name (letters, digits, _ . -; comma list)"
            )
        if self.time is not None and not _TIME.match(self.time):
            raise ValueError(
                f"--time {self.time!r} is not a Slurm time; "
                "use minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]], e.g. 00:30:00"
            )
        if self.ifname is not None:
            for name in self.ifname.split(","):
                if not _IFNAME.match(name):
                    raise ValueError(f"--ifname {self.ifname!r}: {name!r} is not an interface name (1-15 characters, "
                                     f"no spaces; give exact names such as eth0 or ib0, comma-separated)")

    @property
    def procs_per_node(self) -> int:
        return self.nproc_per_node or self.gpus_per_node or 1


def sbatch_script(job: SlurmJob) -> str:
    q = shlex.quote
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job.job_name}", f"#SBATCH --nodes={job.num_nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if job.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    if job.partition:
        lines.append(f"#SBATCH --partition={job.partition}")
    if job.time:
        lines.append(f"#SBATCH --time={job.time}")
    lines += ["#SBATCH --output=distval-%j.out",
              f"# written by `distval slurm`: {' '.join(q(a) for a in ('distval', *job.command))}",
              "set -euo pipefail",
              "",
              "# The rendezvous (a c10d TCP store) is hosted by torchrun on the job's first node.",
              'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
              f'RDZV_PORT="${{RDZV_PORT:-{RDZV_PORT}}}"',
              f'PYTHON="${{PYTHON:-{job.python}}}"']
    if job.ifname:
        lines += ["# Pin Gloo and NCCL to the data-network interface (auto-detection can pick docker0, a VPN...).",
                  f"export GLOO_SOCKET_IFNAME={q(job.ifname)}", f"export NCCL_SOCKET_IFNAME={q(job.ifname)}"]
    lines += ["",
              "# One task per node; each starts torchrun, which starts the node's workers.",
              f"srun --nodes={job.num_nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
              f'  "$PYTHON" -m torch.distributed.run --nnodes={job.num_nodes} --nproc-per-node={job.procs_per_node} \\',
              '    --rdzv-backend=c10d --rdzv-endpoint="$HEAD_NODE:$RDZV_PORT" --rdzv-id="$SLURM_JOB_ID" \\',
              f"    -m distval {' '.join(q(a) for a in job.command)}",
              ""]
    return "\n".join(lines)


def check_syntax(text: str) -> None:
    """`bash -n` on the script: an AssertionError is our bug (the inputs were validated)."""
    bash = shutil.which("bash")
    if bash is None:
        return  # nothing to check with; the script is plain POSIX-ish bash built from quoted parts
    res = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, f"generated sbatch script does not parse: {res.stderr.strip()}"
