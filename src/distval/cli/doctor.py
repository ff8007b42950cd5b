"""`distval doctor`: check the inputs, run the host checks here (or the rank probe on N local
workers / under torchrun), add the topology and NCCL-log checks, render. Torch (through the
launcher) is imported inside the command only, so `distval --help` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from distval.cli.app import JsonOut, app, check_outputs, finish, make_console
from distval.cli.app import option as O  # noqa: N812


@app.command("doctor")
def doctor(
    nproc: Annotated[
        Optional[int],
        O(
            "--nproc",
            help="Also start N local workers: probe the rendezvous and compare ranks. "
            "Under torchrun/Slurm every worker takes part.",
        ),
    ] = None,
    topo_file: Annotated[
        Optional[Path], O("--topo-file", help="`nvidia-smi topo -m` output to read instead of running nvidia-smi here.")
    ] = None,
    nccl_log: Annotated[
        Optional[Path],
        O(
            "--nccl-log",
            help="An NCCL_DEBUG=INFO log: transports per channel, chosen interface, P2P-over-SYS hang risk.",
        ),
    ] = None,
    master_addr: Annotated[
        Optional[str],
        O(
            "--master-addr",
            help="Address the job rendezvouses at "
            "(default: MASTER_ADDR, else the address this host name resolves to, else 127.0.0.1).",
        ),
    ] = None,
    master_port: Annotated[
        Optional[int],
        O("--master-port", help="Check TCP reachability of MASTER_ADDR:PORT (default: MASTER_PORT when set)."),
    ] = None,
    gloo_ifname: Annotated[
        Optional[str],
        O(
            "--gloo-socket-ifname",
            help="Check this GLOO_SOCKET_IFNAME value instead of the environment's (nothing is set).",
        ),
    ] = None,
    nccl_ifname: Annotated[
        Optional[str],
        O(
            "--nccl-socket-ifname",
            help="Check this NCCL_SOCKET_IFNAME value instead of the environment's (nothing is set).",
        ),
    ] = None,
    expect_world: Annotated[
        Optional[int],
        O("--expect-world", help="FAIL unless the world has exactly N ranks (catches every process running alone)."),
    ] = None,
    backend: Annotated[
        str, O("--backend", help="Backend of the probe's world group: auto, gloo, nccl or mpi.")
    ] = "auto",
    timeout: Annotated[str, O("--timeout", help="Rendezvous and collective timeout of the probe, e.g. 30s.")] = "30s",
    json: JsonOut = None,
) -> int:
    """Environment, interfaces, routes, hostname, socket-interface variables, topology and NCCL log, with fix hints."""
    import os

    from distval.doctor import report as doctor_report
    from distval.doctor.nccl_log import load_nccl_log
    from distval.doctor.topo import load_topo, parse_topo, run_nvidia_smi

    # Input first: a bad file or flag ends here, before anything runs or is written.
    check_outputs({"--json": json})
    topo = load_topo(topo_file) if topo_file is not None else None
    log = load_nccl_log(nccl_log) if nccl_log is not None else None
    overrides = {
        k: v for k, v in (("GLOO_SOCKET_IFNAME", gloo_ifname), ("NCCL_SOCKET_IFNAME", nccl_ifname)) if v is not None
    }
    if master_port is None and os.environ.get("MASTER_PORT", "").isdigit():
        master_port = int(os.environ["MASTER_PORT"])

    cfg = doctor_report.DoctorConfig(
        master_addr=master_addr or doctor_report.default_master_addr(),
        master_port=master_port,
        ifname_overrides=overrides,
        expect_world=expect_world,
    )

    from distval import knobs, launch  # torch from here on
    from distval.doctor.ranks import rank_probe
    from distval.health.diagnose import WorkerFailure
    from distval.launch.execute import execute
    from distval.launch.job import LaunchOptions
    from distval.results import Check, Status

    mode = launch.detect_mode()
    cfg.under_launcher = mode != "local"
    opts = knobs.build(LaunchOptions, {("nproc",): nproc, ("backend",): backend, ("timeout_s",): timeout})
    topo_error = None
    if topo is None and (text := run_nvidia_smi()) is not None:
        try:
            topo = parse_topo(text, "nvidia-smi topo -m")
        except ValueError as e:  # not the user's input: a finding, not a usage error
            topo_error = str(e)
    single = mode == "local" and nproc is None  # this process alone: a world of one
    world = 1 if single else launch.planned_world_size(opts)
    if expect_world is not None and world != expect_world:
        report = doctor_report.world_mismatch_report(cfg, world, mode)
    elif single:
        report = doctor_report.single_report(cfg)
    else:
        try:
            report = execute(
                "doctor", rank_probe, cfg, opts, lambda job: doctor_report.build_ranks_report(job, cfg)
            )
        except WorkerFailure as e:
            # this rank (not 0) failed under torchrun/srun, e.g. the network pre-flight: its own
            # host checks say why, on this node, where rank 0 cannot see
            report = doctor_report.single_report(cfg)
            report.checks = [c for c in report.checks if c.name != "doctor.ranks"]
            report.add(
                Check(
                    "doctor.ranks",
                    Status.ERROR,
                    str(e),
                    hint="the host checks above on this node say why",
                    where={"rank": e.rank},
                )
            )
        if report is None:
            return 0  # not rank 0: rank 0 reports
        if not any(c.name.startswith("doctor.net") for c in report.checks):
            # the ranks failed: the host checks here usually say why
            checks, facts = doctor_report.host_checks(cfg)
            report.checks.extend(checks)
            report.tables.append(doctor_report.interfaces_table(facts))
            report.meta.update(
                interfaces=facts["interfaces"], routes=facts["routes"], route_to_master=facts["route_to_master"]
            )
    doctor_report.add_file_checks(report, topo, log, cfg.env(), topo_error)
    return finish(report, json, make_console())

