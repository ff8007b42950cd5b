"""`distval doctor`: check the inputs, run the host checks here (or the rank probe on N local
workers / under torchrun), add the topology and NCCL-log checks, render. Torch (through the
launcher) is imported inside the command only, so `distval --help` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from distval import knobs
from distval.cli.app import JsonOut, app, check_outputs, finish, make_console
from distval.cli.app import option as O  # noqa: N812
from distval.cli.flags import config_flags
from distval.doctor.report import DoctorConfig
from distval.launch.job import LaunchOptions


@app.command("doctor")
@config_flags("cfg", DoctorConfig)
def doctor(
    cfg: DoctorConfig,
    nproc: Annotated[
        Optional[int],
        O(
            "--nproc",
            help="Also start N local workers: probe the rendezvous and compare ranks. "
            "Under torchrun/Slurm every worker takes part.",
        ),
    ] = None,
    topo_file: Annotated[
        Optional[Path], O("--topo-file", help="`nvidia-smi topo -m`, `rocm-smi --showtopo` or `amd-smi topology` "
                                 "output to read instead of running the tool here.")
    ] = None,
    nccl_log: Annotated[
        Optional[Path],
        O(
            "--nccl-log",
            help="An NCCL_DEBUG=INFO log: transports per channel, chosen interface, P2P-over-SYS hang risk.",
        ),
    ] = None,
    backend: Annotated[
        str, O("--backend", help="Backend of the probe's world group: auto, gloo, nccl or mpi.")
    ] = "auto",
    timeout: Annotated[str, O("--timeout", help="Rendezvous and collective timeout of the probe, e.g. 30s.")] = "30s",
    json: JsonOut = None,
) -> int:
    """Environment, interfaces, routes, hostname, socket-interface variables, topology and NCCL log, with fix hints."""
    from distval.doctor.nccl_log import load_nccl_log
    from distval.doctor.topofile import load_topo

    # Input first: a bad file or flag ends here, before anything runs or is written.
    check_outputs({"--json": json})
    topo = load_topo(topo_file) if topo_file is not None else None
    log = load_nccl_log(nccl_log) if nccl_log is not None else None
    opts = knobs.build(LaunchOptions, {("nproc",): nproc, ("backend",): backend, ("timeout_s",): timeout})

    from distval.doctor.run import run_doctor  # torch from here on

    return finish(run_doctor(cfg, opts, probe=nproc is not None, topo=topo, log=log), json, make_console())
