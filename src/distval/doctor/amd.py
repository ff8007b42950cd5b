"""`distval doctor` on an AMD host: the GPUs and their links from amd-smi (rocm-smi where only it
is installed), NUMA and NIC placement, clocks under load, ECC, the visible-devices variables,
kernel.numa_balancing and the RCCL/HSA environment. Torch-free; the parsing lives in
`distval.rocm.smi`, the platform facts in `distval.rocm.platform`, the variables in
`distval.rocm.env`. Every check has the NVIDIA checks' shape (OK/WARN/FAIL/SKIP with a hint)."""

from __future__ import annotations

import functools
import re
import shutil
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distval.doctor.topo import p2p_disabled_by
from distval.results import Check, Status, Table
from distval.rocm import env as rocm_env
from distval.rocm import platform
from distval.rocm.smi import (
    AmdGpu,
    AmdTopology,
    parse_amd_smi,
    parse_amd_smi_topology,
    parse_rocm_smi,
    parse_rocm_smi_topo,
    run_tool,
)

BUSY_PCT = 50.0  # a GPU this busy should run near its top clock
THROTTLED_SHARE = 0.8  # ... and one under 80% of it is held back (power, heat, a cap)
PEER_CAP_SHARE = 0.95  # a power cap 5% under the other GPUs' is a capped GPU


@functools.lru_cache(maxsize=None)
def _tool(*args: str) -> str | None:
    """A tool's output, once per process (the host checks and the topology read the same)."""
    return run_tool(*args)


def tool_name() -> str | None:
    """The AMD tool this host has: amd-smi (preferred), rocm-smi, or None (not an AMD host)."""
    return next((t for t in ("amd-smi", "rocm-smi") if shutil.which(t)), None)


@dataclass
class AmdHost:
    tool: str
    gpus: list[AmdGpu]
    rocm: str | None = None  # "6.2.2"
    errors: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """doctor.devices' GPU rows, as nvidia-smi's."""
        return [{"index": g.index, "name": g.product or "AMD GPU", "memory_mib": g.vram_bytes // 2**20
                 if g.vram_bytes else None, "driver": g.driver, "bus_id": g.bus_id} for g in self.gpus]

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "rocm": self.rocm, "gpus": [g.to_dict() for g in self.gpus], "errors": self.errors}


def _rocm_version() -> str | None:
    text = _tool("amd-smi", "version") or ""
    m = re.search(r"ROCm version:\s*([\d.]+)", text)
    if m:
        return m.group(1)
    try:
        return Path("/opt/rocm/.info/version").read_text().strip().split("-")[0] or None
    except OSError:
        return None


def read_host() -> AmdHost | None:
    """This host's AMD GPUs, or None without amd-smi and rocm-smi. What a tool printed but the
    parser could not read is kept in `errors` (a finding, not a crash)."""
    tool = tool_name()
    if tool is None:
        return None
    host = AmdHost(tool, [], _rocm_version())
    try:
        if tool == "amd-smi":
            static, metric = _tool("amd-smi", "static", "--json"), _tool("amd-smi", "metric", "--json")
            if static or metric:
                host.gpus = parse_amd_smi(static, metric)
        elif text := _tool("rocm-smi", "--showallinfo"):
            host.gpus = parse_rocm_smi(text)
    except ValueError as e:
        host.errors.append(str(e))
    return host


def read_topology(host: AmdHost | None) -> tuple[AmdTopology | None, str | None]:
    """(the GPU links of this host, or None; the reason when its tool's output did not parse)."""
    if host is None:
        return None, None
    try:
        if host.tool == "amd-smi":
            text = _tool("amd-smi", "topology", "--json")
            topo = parse_amd_smi_topology(text) if text else None
        else:
            text = _tool("rocm-smi", "--showtopo")
            topo = parse_rocm_smi_topo(text) if text else None
    except ValueError as e:
        return None, str(e)
    if topo is not None:  # amd-smi's topology has no NUMA nodes, rocm-smi's no bus ids: the GPUs' readings have
        topo.numa = topo.numa or {f"GPU{g.index}": g.numa_node for g in host.gpus if g.numa_node is not None}
        topo.bus_ids = topo.bus_ids or {f"GPU{g.index}": g.bus_id for g in host.gpus if g.bus_id}
    return topo, None


def load_topology_file(text: str, source: str) -> AmdTopology | None:
    """A --topo-file holding rocm-smi's or amd-smi's topology (None when it is neither)."""
    if "Link Type between two GPUs" in text or "Weight between two GPUs" in text:
        return parse_rocm_smi_topo(text, source)
    if "LINK TYPE TABLE" in text or (text.lstrip()[:1] in ("[", "{") and '"link_type"' in text):
        return parse_amd_smi_topology(text, source)
    return None


def nic_numa(sys_root: str | Path = "/sys") -> dict[str, int]:
    """RDMA devices (else physical network interfaces) and their NUMA node, from sysfs; a NIC
    whose node is unknown (-1: a single-node machine) is left out."""
    root = Path(sys_root)
    found: dict[str, int] = {}
    for cls in ("infiniband", "net"):
        base = root / "class" / cls
        try:
            entries = sorted(base.iterdir())
        except OSError:
            continue
        for entry in entries:
            try:
                node = int((entry / "device" / "numa_node").read_text().strip())
            except (OSError, ValueError):
                continue  # virtual interfaces have no device
            if node >= 0:
                found[entry.name] = node
        if found:
            return found
    return found


# -- checks ---------------------------------------------------------------------------------------


def _gpus_text(indices: list[int]) -> str:
    return ", ".join(f"GPU{i}" for i in indices)


def check_gpus(host: AmdHost) -> Check:
    name = "doctor.amd gpus"
    details = host.to_dict()
    if not host.gpus:
        why = host.errors[0] if host.errors else f"{host.tool} printed no GPU"
        return Check(name, Status.WARN, f"{host.tool} is installed but reports no GPU: {why}", details=details,
                     hint=f"run `{host.tool} static` by hand; check the amdgpu driver (dmesg | grep amdgpu) and that "
                     "this user is in the video and render groups")
    products = Counter(platform.product_named(g.product) or g.product or "unknown" for g in host.gpus)
    archs = sorted({a for g in host.gpus if (a := platform.gfx_arch(g.arch))})
    sizes = sorted({round(g.vram_bytes / 2**30) for g in host.gpus if g.vram_bytes})
    numa: dict[int, list[int]] = {}
    for g in host.gpus:
        if g.numa_node is not None:
            numa.setdefault(g.numa_node, []).append(g.index)
    text = (", ".join(f"{n} x {p}" for p, n in products.items()) + (f" ({', '.join(archs)})" if archs else "")
            + (f", {'/'.join(map(str, sizes))} GiB each" if sizes else "")
            + (f", ROCm {host.rocm}" if host.rocm else "")
            + ("; " + "; ".join(f"NUMA {n}: {_gpus_text(ix)}" for n, ix in sorted(numa.items())) if numa else ""))
    if len(products) > 1 or len(sizes) > 1:
        return Check(name, Status.WARN, f"{text}: the GPUs are not all alike (product or memory differs)",
                     details=details, hint="a mixed node, or GPUs in different partition modes (amd-smi static "
                     "--partition): a job runs at the pace of the smallest")
    return Check(name, Status.OK, text, details=details)


def check_paths(topo: AmdTopology, env: Mapping[str, str]) -> Check:
    """An 8-GPU MI300X node is a full xGMI mesh: every pair XGMI, weight 15, one hop. A PCIe pair
    among xGMI ones is a missing link (down, or a GPU of another hive); PCIe pairs across sockets
    are nvidia-smi's SYS."""
    name = "doctor.topo gpu-paths"
    pairs = [(a, b, kind) for a, b, kind in topo.gpu_pairs() if kind != "SAME"]
    details = {"pairs": [{"a": a, "b": b, "link": kind, "hops": topo.hops.get((a, b)),
                          "weight": topo.weight.get((a, b))} for a, b, kind in pairs], "source": topo.source}
    if not pairs:
        return Check(name, Status.OK, f"{len(topo.gpus)} GPU: no GPU pairs", details=details)
    kinds = Counter(kind for _, _, kind in pairs)
    pcie = [(a, b) for a, b, kind in pairs if kind == "PCIE"]

    def described(a: str, b: str) -> str:
        extra = [f"{what} {v}" for what, v in (("hops", topo.hops.get((a, b))), ("weight", topo.weight.get((a, b))))
                 if v is not None]
        return f"{a}-{b}" + (f" ({', '.join(extra)})" if extra else "")

    if kinds["XGMI"] and pcie:
        return Check(name, Status.WARN, f"{', '.join(described(a, b) for a, b in pcie)} over PCIe while the other "
                     f"{kinds['XGMI']} pair(s) are xGMI: the mesh is missing a link, so RCCL's rings through that pair "
                     "run at PCIe speed (or RCCL routes around it)", details=details,
                     where={"pairs": [f"{a}-{b}" for a, b in pcie]},
                     hint="check the links with `amd-smi xgmi` and `amd-smi topology` (ACCESS and LINK TYPE tables); "
                     "a GPU in another slot or hive, or a failed link: reseat or service the GPU, and until then "
                     "leave the pair out with ROCR_VISIBLE_DEVICES")
    across = [(a, b) for a, b in pcie if topo.crosses_socket(a, b) or topo.hops.get((a, b), 0) >= 3]
    guard = p2p_disabled_by(env)  # RCCL reads NCCL_P2P_DISABLE and NCCL_P2P_LEVEL as NCCL does
    if across and not guard:
        return Check(name, Status.WARN, f"{', '.join(described(a, b) for a, b in across)}: PCIe across the two sockets "
                     "(no xGMI): peer-to-peer there crosses the CPUs' interconnect, slow and on some platforms stalled",
                     details=details, where={"pairs": [f"{a}-{b}" for a, b in across]},
                     hint="HSA_FORCE_FINE_GRAIN_PCIE=1 with large BAR for P2P over PCIe; if RCCL hangs or is slow: "
                     "NCCL_P2P_DISABLE=1; check IOMMU (iommu=pt) and ACS")
    weights = sorted({topo.weight[(a, b)] for a, b, _ in pairs if (a, b) in topo.weight})
    text = f"{len(pairs)} GPU pair(s) over {', '.join(f'{k} x{n}' for k, n in sorted(kinds.items()))}" + (
        f", weight {'/'.join(map(str, weights))}" if weights else "")
    if kinds == Counter({"XGMI": len(pairs)}) and len(topo.gpus) > 2:
        text += ": a fully connected xGMI mesh"
    return Check(name, Status.OK, text + (f"; {guard} keeps P2P off the PCIe pairs" if guard and across else ""),
                 details=details)


def check_nic_affinity(topo: AmdTopology, nics: dict[str, int]) -> Check:
    name = "doctor.topo nic-affinity"
    if not nics:
        return Check(name, Status.SKIP, "no NIC with a NUMA node in sysfs (a single-socket host, or no network "
                     "adapter)", details={"reason": "no NIC NUMA nodes"})
    by_node: dict[int, list[str]] = {}
    for nic, node in nics.items():
        by_node.setdefault(node, []).append(nic)
    far = [g for g in topo.gpus if g in topo.numa and topo.numa[g] not in by_node]
    details = {"nics": nics, "gpu_numa": topo.numa}
    if not topo.numa:
        return Check(name, Status.SKIP, "the GPUs' NUMA nodes are not known", details=details | {"reason": "no numa"})
    if far:
        return Check(name, Status.WARN, f"{', '.join(far)} {'have' if len(far) > 1 else 'has'} no NIC on its NUMA "
                     f"node (NICs on node(s) {', '.join(map(str, sorted(by_node)))}): network traffic crosses the "
                     "socket", details=details, where={"gpus": far},
                     hint="pin NCCL_IB_HCA to NICs next to the GPUs, or move a NIC to that socket")
    text = "; ".join(f"NUMA {n}: {', '.join(g for g in topo.gpus if topo.numa.get(g) == n)} -> {', '.join(by_node[n])}"
                     for n in sorted({topo.numa[g] for g in topo.gpus if g in topo.numa}))
    return Check(name, Status.OK, f"every GPU has a NIC on its NUMA node: {text}", details=details)


def check_clocks(gpus: list[AmdGpu]) -> Check:
    """A busy GPU below 80% of its top graphics clock, a GPU the tool calls throttled, or a power
    cap under the other GPUs'. An idle GPU's low clock is power saving, not a finding."""
    name = "doctor.amd clocks"
    rows = [g for g in gpus if g.sclk_mhz is not None or g.throttled or g.power_cap_w is not None]
    if not rows:
        return Check(name, Status.SKIP, "no clock or power readings", details={"reason": "no clocks"})
    findings = []
    for g in gpus:
        if g.throttled:
            findings.append((g.index, f"GPU{g.index}: {', '.join(g.throttled)}"))
        elif g.busy_pct is not None and g.busy_pct >= BUSY_PCT and g.sclk_mhz and g.sclk_max_mhz \
                and g.sclk_mhz < THROTTLED_SHARE * g.sclk_max_mhz:
            findings.append((g.index, f"GPU{g.index} at {g.sclk_mhz:.0f} of {g.sclk_max_mhz:.0f} MHz while "
                             f"{g.busy_pct:.0f}% busy"))
    caps = [g.power_cap_w for g in gpus if g.power_cap_w]
    if caps:
        top = max(caps)
        for g in gpus:
            if g.power_cap_w and g.power_cap_w < PEER_CAP_SHARE * top and g.index not in {i for i, _ in findings}:
                findings.append((g.index, f"GPU{g.index} capped at {g.power_cap_w:.0f} W, the others up to "
                                 f"{top:.0f} W"))
    details = {"gpus": [{"index": g.index, "sclk_mhz": g.sclk_mhz, "sclk_max_mhz": g.sclk_max_mhz,
                         "busy_pct": g.busy_pct, "power_w": g.power_w, "power_cap_w": g.power_cap_w,
                         "throttled": g.throttled} for g in gpus]}
    if findings:
        return Check(name, Status.WARN, "throttled: " + "; ".join(text for _, text in findings) + ": a collective runs "
                     "at the pace of its slowest GPU", details=details, where={"gpus": [i for i, _ in findings]},
                     hint="check power and cooling (amd-smi metric --power --temperature), a power cap set by hand "
                     "(amd-smi set --power-cap), and that the clock is not locked low (amd-smi metric --clock)")
    busy = [g for g in gpus if g.busy_pct is not None and g.busy_pct >= BUSY_PCT]
    text = (f"{len(busy)} busy GPU(s) at their top clock" if busy else
            "GPUs idle: clocks are judged under load only (run doctor while a job runs to check them)")
    return Check(name, Status.OK, text + (f"; power caps {min(caps):.0f} W" if caps else ""), details=details)


def check_ras(gpus: list[AmdGpu]) -> Check:
    name = "doctor.amd ras"
    counted = [g for g in gpus if g.ecc_uncorrectable is not None or g.ecc_correctable is not None]
    if not counted:
        return Check(name, Status.SKIP, "no ECC counts (amd-smi metric --ecc)", details={"reason": "no ECC counts"})
    details = {"gpus": {f"GPU{g.index}": {"correctable": g.ecc_correctable, "uncorrectable": g.ecc_uncorrectable}
                        for g in counted}}
    bad = [g for g in counted if g.ecc_uncorrectable]
    if bad:
        return Check(name, Status.FAIL, "uncorrectable ECC errors: " + ", ".join(
            f"GPU{g.index} {g.ecc_uncorrectable}" for g in bad) + ": results on that GPU cannot be trusted",
            details=details, where={"gpus": [g.index for g in bad]},
            hint="take the GPU out of service (ROCR_VISIBLE_DEVICES without it) and have it checked (amd-smi "
            "metric --ecc-blocks names the block; bad pages: amd-smi bad-pages)")
    soft = [g for g in counted if g.ecc_correctable]
    if soft:
        return Check(name, Status.WARN, "correctable ECC errors: " + ", ".join(
            f"GPU{g.index} {g.ecc_correctable}" for g in soft) + " (corrected; a rising count foretells a failure)",
            details=details, where={"gpus": [g.index for g in soft]},
            hint="watch the count (amd-smi metric --ecc); reset it after a known event with amd-smi reset")
    return Check(name, Status.OK, f"no ECC errors on {len(counted)} GPU(s)", details=details)


def check_visible_devices(env: Mapping[str, str], gpu_count: int | None) -> Check:
    name = "doctor.amd visible-devices"
    vis = platform.visibility(env, gpu_count)
    details = {"variables": vis.variables, "visible": vis.physical, "gpus": gpu_count, "ignored": vis.ignored}
    if vis.problems:
        return Check(name, Status.FAIL, "; ".join(vis.problems), details=details,
                     where={"variables": sorted(vis.variables)},
                     hint="on Linux set ROCR_VISIBLE_DEVICES alone (AMD's advice), or HIP_VISIBLE_DEVICES alone; "
                     "never two that disagree")
    if not vis.variables:
        count = gpu_count if gpu_count is not None else "?"
        return Check(name, Status.OK, f"no visible-devices variable: every GPU ({count}) is visible", details=details)
    shown = ", ".join(f"{k}={v}" for k, v in vis.variables.items())
    seen = f"physical GPU(s) {', '.join(vis.physical)}" if vis.physical is not None else "an unknown set"
    return Check(name, Status.OK, f"{shown}: a process sees {seen}", details=details)


def check_numa_balancing(path: str | Path = "/proc/sys/kernel/numa_balancing") -> Check:
    name = "doctor.amd numa-balancing"
    try:
        value = Path(path).read_text().strip()
    except OSError:
        return Check(name, Status.SKIP, f"{path} cannot be read", details={"reason": "no file"})
    if value != "0":
        return Check(name, Status.WARN, f"kernel.numa_balancing={value}: the kernel migrates pages under RCCL's and "
                     "the GPUs' feet; AMD's RCCL troubleshooting and MI300X tuning guides turn it off",
                     details={"value": value},
                     hint="sudo sysctl kernel.numa_balancing=0 (and in /etc/sysctl.d to keep it)")
    return Check(name, Status.OK, "kernel.numa_balancing=0", details={"value": value})


def check_env(env: Mapping[str, str], gpus: list[AmdGpu], rocm: str | None, xgmi: bool | None) -> Check:
    name = "doctor.amd env"
    products = [p for g in gpus if (p := platform.product_named(g.product))]
    vis = platform.visibility(env, len(gpus) if gpus else None)
    in_job = len(vis.physical) if vis.physical is not None else (len(gpus) or None)
    findings = rocm_env.unknown_names(env) + rocm_env.advice(env, products=products, gpus_in_job=in_job,
                                                            rocm=platform.version_tuple(rocm), xgmi=xgmi)
    set_vars = {k: env[k] for k in sorted(env) if k.startswith(("RCCL_", "HSA_", "NCCL_"))}
    details = {"set": set_vars, "findings": [f.__dict__ for f in findings]}
    if not findings:
        return Check(name, Status.OK, f"{len(set_vars)} RCCL/HSA/NCCL variable(s) set, none known to hurt",
                     details=details)
    warn = [f for f in findings if f.level == "warn"]
    return Check(name, Status.WARN, "; ".join(f.text for f in findings), details=details,
                 where={"variables": [f.variable for f in findings]},
                 hint="; ".join(f"{f.fix} ({f.source})" for f in (warn or findings)))


def host_checks(host: AmdHost, env: Mapping[str, str], xgmi: bool | None = None,
                numa_balancing: str | Path = "/proc/sys/kernel/numa_balancing") -> list[Check]:
    gpus = host.gpus
    return [check_gpus(host), check_clocks(gpus), check_ras(gpus), check_visible_devices(env, len(gpus) or None),
            check_numa_balancing(numa_balancing), check_env(env, gpus, host.rocm, xgmi)]


def topo_checks(topo: AmdTopology, env: Mapping[str, str], sys_root: str | Path = "/sys") -> list[Check]:
    return [check_paths(topo, env), check_nic_affinity(topo, nic_numa(sys_root))]


def topo_tables(topo: AmdTopology) -> list[Table]:
    matrix = Table("topo", ["device", *topo.gpus, "numa_affinity"], title=f"GPU topology ({topo.source}; link type, "
                   "weight)")
    for a in topo.gpus:
        cells = {b: "X" if a == b else topo.link(a, b) + (f" {topo.weight[(a, b)]}" if (a, b) in topo.weight else "")
                 for b in topo.gpus}
        matrix.add(device=a, **cells, numa_affinity=topo.numa.get(a))
    return [matrix]


def gpus_table(host: AmdHost) -> Table:
    t = Table("amd_gpus", ["gpu", "product", "arch", "bus_id", "numa", "vram_gib", "sclk_mhz", "sclk_max_mhz",
                           "busy_pct", "power_w", "power_cap_w", "ecc_corr", "ecc_uncorr"],
              title=f"AMD GPUs ({host.tool})", units={"sclk_mhz": "MHz", "sclk_max_mhz": "MHz", "busy_pct": "%",
                                                     "power_w": "W", "power_cap_w": "W", "vram_gib": "GiB"})
    for g in host.gpus:
        t.add(gpu=g.index, product=g.product, arch=platform.gfx_arch(g.arch), bus_id=g.bus_id, numa=g.numa_node,
              vram_gib=round(g.vram_bytes / 2**30, 1) if g.vram_bytes else None,
              sclk_mhz=round(g.sclk_mhz) if g.sclk_mhz else None, sclk_max_mhz=g.sclk_max_mhz, busy_pct=g.busy_pct,
              power_w=g.power_w, power_cap_w=g.power_cap_w, ecc_corr=g.ecc_correctable, ecc_uncorr=g.ecc_uncorrectable)
    return t
