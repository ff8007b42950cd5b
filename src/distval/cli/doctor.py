"""`distval doctor`: check the inputs, run the host checks here (or the rank probe on N local
workers / under torchrun), add the topology and NCCL-log checks, render. Torch (through the
launcher) is imported inside the command only, so `distval --help` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from distval.cli.app import JsonOut, app, check_outputs, finish, make_console
from distval.cli.app import option as O  # noqa: N812
from distval.cli.flags import config_flags
from distval.doctor.config import DoctorConfig
from distval.launch.config import LaunchOptions


@app.command("doctor")
@config_flags("cfg", DoctorConfig)
# the probe's rendezvous fails in half a launch's time: a doctor answers quickly
@config_flags("opts", LaunchOptions, only=("nproc", "backend", "timeout_s"), defaults={"timeout": "30s"})
def doctor(
    cfg: DoctorConfig,
    opts: LaunchOptions,
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
    json: JsonOut = None,
) -> int:
    """Environment, interfaces, routes, hostname, socket-interface variables, topology and NCCL log, with fix hints."""
    from distval.doctor.nccl_log import load_nccl_log
    from distval.doctor.topofile import load_topo

    # Input first: a bad file or flag ends here, before anything runs or is written.
    check_outputs({"--json": json})
    topo = load_topo(topo_file) if topo_file is not None else None
    log = load_nccl_log(nccl_log) if nccl_log is not None else None
    from distval.doctor.run import run_doctor  # torch from here on

    return finish(run_doctor(cfg, opts, probe=opts.nproc is not None, topo=topo, log=log), json, make_console())
