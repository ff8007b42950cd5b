"""`distval doctor` as one library call: the host checks here, or the rank probe on N local
workers / every worker of torchrun or Slurm, then the topology and NCCL-log checks. Torch-backed
(the launcher), imported by the command only."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from distval import launch
from distval.doctor import amd
from distval.doctor import report as doctor_report
from distval.doctor.nccl_log import NcclLog
from distval.doctor.ranks import bound_sockets, rank_facts
from distval.doctor.topo import Topo, parse_topo, run_nvidia_smi
from distval.health.diagnose import WorkerFailure
from distval.launch.config import LaunchOptions
from distval.launch.execute import execute
from distval.results import Check, Report, Status
from distval.rocm.smi import AmdTopology


def rank_probe(ctx: Any, cfg: doctor_report.DoctorConfig) -> dict[str, Any]:
    """The per-rank function: runs on every rank after rendezvous."""
    ctx.status("doctor: rendezvous probe")
    seen = ctx.exchange(ctx.rank)  # every rank's rank number, over the control group
    store_port = int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT", "").isdigit() else None
    out = {"facts": rank_facts(cfg), "bound": bound_sockets(store_port), "seen": seen, "world_size": ctx.world_size,
           "host": None}
    if ctx.local_rank == 0:
        ctx.status("doctor: host checks")
        checks, facts = doctor_report.host_checks(cfg)
        out["host"] = {"checks": checks, "facts": facts}
    return out


def run_doctor(cfg: doctor_report.DoctorConfig, opts: LaunchOptions, probe: bool,
               topo: "Topo | AmdTopology | None" = None,
               log: NcclLog | None = None) -> Report | None:
    """The doctor's report; None on a rank other than 0 under an outer launcher (rank 0 reports).
    `probe`: start `opts.nproc` local workers (under torchrun or Slurm every worker takes part)."""
    mode = launch.detect_mode()
    cfg = dataclasses.replace(cfg, under_launcher=mode != "local")
    topo_error = None
    if topo is None and (text := run_nvidia_smi()) is not None:
        try:
            topo = parse_topo(text, "nvidia-smi topo -m")
        except ValueError as e:  # not the user's input: a finding, not a usage error
            topo_error = str(e)
    elif topo is None:  # an AMD host: amd-smi topology (rocm-smi --showtopo)
        topo, topo_error = amd.read_topology(amd.read_host())
    single = mode == "local" and not probe  # this process alone: a world of one
    world = 1 if single else launch.planned_world_size(opts)
    if cfg.expect_world is not None and world != cfg.expect_world:
        report = doctor_report.world_mismatch_report(cfg, world, mode)
    elif single:
        report = doctor_report.single_report(cfg)
    else:
        report = _probe(cfg, opts)
        if report is None:
            return None  # not rank 0: rank 0 reports
    doctor_report.add_file_checks(report, topo, log, cfg.env(), topo_error)
    return report


def _probe(cfg: doctor_report.DoctorConfig, opts: LaunchOptions) -> Report | None:
    try:
        report = execute("doctor", rank_probe, cfg, opts, lambda job: doctor_report.build_ranks_report(job, cfg))
    except WorkerFailure as e:
        # this rank (not 0) failed under torchrun/srun, e.g. the network pre-flight: its own
        # host checks say why, on this node, where rank 0 cannot see
        report = doctor_report.single_report(cfg)
        report.checks = [c for c in report.checks if c.name != "doctor.ranks"]
        report.add(Check("doctor.ranks", Status.ERROR, str(e), hint="the host checks above on this node say why",
                         where={"rank": e.rank}))
    if report is not None and not any(c.name.startswith("doctor.net") for c in report.checks):
        # the ranks failed: the host checks here usually say why
        checks, facts = doctor_report.host_checks(cfg)
        report.checks.extend(checks)
        report.tables.append(doctor_report.interfaces_table(facts))
        report.meta.update(interfaces=facts["interfaces"], routes=facts["routes"],
                           route_to_master=facts["route_to_master"])
    return report
