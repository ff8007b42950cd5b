"""One doctor Report: host checks (here, or on the first rank of every host), the comparison
across ranks, the topology matrix and the NCCL log. Facts go into meta: interfaces, routes, the
route to the master, versions, the topology and a summary of the NCCL log."""

from __future__ import annotations

import socket
from typing import Any

from distval import meta
from distval.doctor import amd, net, ranks, system
from distval.doctor.config import DoctorConfig
from distval.doctor.nccl_log import NcclLog, nccl_checks, nccl_table
from distval.doctor.topo import Topo, topo_checks, topo_tables
from distval.results import Check, Report, Status, Table
from distval.rocm.smi import AmdTopology


def _torch_cuda_devices() -> int | None:
    import sys

    if "torch" not in sys.modules:
        return None
    from distval import device as devices

    return devices.default_nproc() if devices.cuda_usable() else 0  # default_nproc is the CUDA device count there


def host_checks(cfg: DoctorConfig) -> tuple[list[Check], dict[str, Any]]:
    """Every check about this host, and its facts."""
    env = cfg.env()
    host = socket.gethostname()
    ifaces = net.interfaces()
    route_check, route = net.check_master_route(cfg.master_addr, ifaces)
    gpu_rows = system.gpus()
    amd_host = amd.read_host() if not gpu_rows else None  # an AMD host: amd-smi or rocm-smi is there
    if amd_host is not None:
        gpu_rows = amd_host.rows()
    rdma = system.rdma_devices()
    amd_gpus = amd_host is not None and bool(gpu_rows)
    checks = [system.check_versions(system.versions(), gpu_rows, amd_gpus),
              system.check_devices(gpu_rows, _torch_cuda_devices(), amd_gpus),
              net.check_hostname(ifaces, host, route), route_check, *net.check_socket_ifname(env, ifaces, route),
              net.check_decoys(ifaces, route, env)]
    if cfg.master_port:
        checks.append(net.check_port(cfg.master_addr, cfg.master_port, cfg.under_launcher))
    checks += [system.check_shm(), system.check_memlock(rdma), system.check_nofile()]
    if amd_host is not None:
        topo, _ = amd.read_topology(amd_host)
        xgmi = None if topo is None else any(kind == "XGMI" for _, _, kind in topo.gpu_pairs())
        checks += amd.host_checks(amd_host, env, xgmi)
    for c in checks:
        c.where = {**c.where, "host": host}
    facts = {"hostname": host, "interfaces": [i.to_dict() for i in ifaces], "routes": net.routes(),
             "route_to_master": route, "gpus": gpu_rows, "rdma_devices": rdma,
             "amd": amd_host.to_dict() if amd_host is not None else None}
    return checks, facts


def interfaces_table(*hosts_facts: dict[str, Any]) -> Table:
    """One row per interface of every host given."""
    t = Table("interfaces", ["host", "name", "state", "mtu", "speed_mbps", "addresses", "role"], title="interfaces",
              units={"speed_mbps": "Mb/s"})
    for facts in hosts_facts:
        route = facts.get("route_to_master") or {}
        for i in facts["interfaces"]:
            role = ("route to master" if i["name"] == route.get("dev") else "loopback" if i["loopback"]
                    else "not on the route" if i["up"] and i["addresses"] else "")
            t.add(host=facts["hostname"], name=i["name"], state=i["state"], mtu=i["mtu"], speed_mbps=i["speed_mbps"],
                  addresses=", ".join(i["addresses"]) or None, role=role or None)
    return t


def _host_meta(facts: dict[str, Any]) -> dict[str, Any]:
    return {k: facts[k] for k in ("interfaces", "routes", "route_to_master", "gpus", "rdma_devices", "amd")}


def single_report(cfg: DoctorConfig) -> Report:
    """The doctor in this process alone (no ranks launched)."""
    checks, facts = host_checks(cfg)
    report = Report(
        "doctor",
        meta=meta.collect(
            None,
            cfg,
            launch="none",
            hostname=facts["hostname"],
            master_addr=cfg.master_addr,
            master_port=cfg.master_port,
            **_host_meta(facts),
        ),
    )
    report.checks.extend(checks)
    report.add(Check("doctor.ranks", Status.SKIP, "one process: nothing to compare; run with --nproc N, or under "
                     "torchrun/srun on every node, to compare ranks and probe the rendezvous",
                     details={"reason": "single process"}))
    report.tables.append(interfaces_table(facts))
    add_amd_table(report, facts)
    return report


def add_amd_table(report: Report, *hosts_facts: dict[str, Any]) -> None:
    """The AMD GPUs of the first host that has them (amd-smi/rocm-smi's readings), as a table."""
    found = next((f["amd"] for f in hosts_facts if f.get("amd") and f["amd"]["gpus"]), None)
    if found is not None:
        report.tables.append(amd.gpus_table(amd.AmdHost(found["tool"], [amd.AmdGpu(**g) for g in found["gpus"]],
                                                        found["rocm"])))


def build_ranks_report(job: Any, cfg: DoctorConfig) -> Report:
    hosts: dict[str, dict[str, Any]] = {}
    for res in job.results:
        if res["host"] is not None and res["host"]["facts"]["hostname"] not in hosts:
            hosts[res["host"]["facts"]["hostname"]] = res["host"]
    first = next(iter(hosts.values()))
    report = Report("doctor", meta=meta.collect(job, cfg, master_addr=cfg.master_addr, master_port=cfg.master_port,
                                                hostname=first["facts"]["hostname"], **_host_meta(first["facts"]),
                                                nodes={h: _host_meta(v["facts"]) for h, v in hosts.items()}))
    for v in hosts.values():
        report.checks.extend(v["checks"])
    checks, table = ranks.compare(job.results, job.ranks, job.world_size, cfg.expect_world)
    report.checks.extend(checks)
    report.tables.append(interfaces_table(*(v["facts"] for v in hosts.values())))
    add_amd_table(report, *(v["facts"] for v in hosts.values()))
    report.tables.append(table)
    return report


def world_mismatch_report(cfg: DoctorConfig, world_size: int, mode: str) -> Report:
    """--expect-world says N but this process would join a world of another size: no launch; the
    host checks still run, since they usually say why (the world of one)."""
    report = single_report(cfg)
    report.meta.update(launch=mode, world_size=world_size)
    report.checks = [c for c in report.checks if c.name != "doctor.ranks"]
    alone = " (each process alone: the world of one)" if world_size == 1 else ""
    report.add(
        Check(
            "doctor.rendezvous",
            Status.FAIL,
            f"this process would join a world of {world_size} rank(s), expected {cfg.expect_world}{alone}",
            details={"world_size": world_size, "expected": cfg.expect_world},
            hint="launch with `torchrun --nnodes N --nproc-per-node P --rdzv-backend c10d --rdzv-endpoint HOST:PORT`, "
            "`srun --ntasks N distval doctor`, or `distval doctor --nproc N`",
            where={"world_size": world_size},
        )
    )
    return report


def add_file_checks(report: Report, topo: "Topo | AmdTopology | None", nccl: NcclLog | None, env: dict[str, str],
                    topo_error: str | None = None) -> None:
    if topo is not None:
        # the log's NCCL_* settings are the job's: NCCL_P2P_DISABLE=1 there keeps P2P off the SYS pairs
        job_env = {**env, **(nccl.env if nccl is not None else {})}
        if isinstance(topo, Topo):
            report.checks.extend(topo_checks(topo, job_env))
            report.tables.extend(topo_tables(topo))
        else:
            report.checks.extend(amd.topo_checks(topo, job_env))
            report.tables.extend(amd.topo_tables(topo))
        report.meta["topology"] = topo.to_dict()
    elif topo_error is not None:
        report.add(Check("doctor.topo", Status.WARN, f"cannot read this host's topology: {topo_error}",
                         details={"reason": topo_error},
                         hint="save `nvidia-smi topo -m` (or `amd-smi topology`) to a file and pass it with "
                         "--topo-file"))
    else:
        report.add(Check("doctor.topo", Status.SKIP,
                         "no nvidia-smi, amd-smi or rocm-smi on this host and no --topo-file",
                         details={"reason": "no topology"}))
    if nccl is not None:
        report.checks.extend(nccl_checks(nccl, topo))
        report.tables.append(nccl_table(nccl, topo))
        report.meta["nccl_log"] = nccl.summary()
