"""`nvidia-smi topo -m` parsed into a matrix, and what it says about P2P and NIC placement.

The matrix names the path between every pair of devices (legend of nvidia-smi, best to worst):
  NV#   a bonded set of # NVLinks          PIX   at most one PCIe bridge
  PXB   several PCIe bridges, no host bridge  PHB   through a PCIe host bridge (the CPU)
  NODE  between host bridges of one NUMA node  SYS   across the SMP interconnect (QPI/UPI) between NUMA nodes
(older drivers print SOC for SYS). Rows and columns are GPUs and NICs (`NIC0`, legend `NIC0: mlx5_2`;
old drivers print the HCA name itself), followed by CPU affinity, NUMA affinity and GPU NUMA ID.

P2P between GPUs whose path is SYS is the classic single-node hang (two L4s on different sockets,
NCCL picks P2P/CUMEM, the kernels spin forever, no error: the "NCCL Hang" section of dudeperf3ct's
distributed-training experiments, written up at dudeperf3ct.github.io); PHB/NODE pairs go through
the CPU. The fix is NCCL_P2P_DISABLE=1, or NCCL_P2P_LEVEL at most NODE/PHB so P2P stops short of
the socket boundary. A GPU whose nearest NIC is SYS sends its network traffic across the socket:
pin NCCL_IB_HCA to the NICs next to the GPUs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from distval.results import Check, Status, Table

LINK_RANK = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6}
_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_EXTRA_LABELS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
# NCCL_P2P_LEVEL values that stop P2P before the socket boundary (names, and the old numbers 0-4)
_P2P_LEVEL_SAFE = {"LOC", "NVL", "PIX", "PXB", "PHB", "NODE", "0", "1", "2", "3", "4"}


def link_rank(link: str) -> int:
    return LINK_RANK["NV"] if link.startswith("NV") else LINK_RANK[link]


@dataclass
class Topo:
    devices: list[str]
    links: dict[tuple[str, str], str]
    affinity: dict[str, dict[str, str]] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)
    source: str = ""

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]

    @property
    def nics(self) -> list[str]:
        return [d for d in self.devices if not d.startswith("GPU")]

    def link(self, a: str, b: str) -> str:
        return self.links[(a, b)]

    def crosses_socket(self, a: str, b: str) -> bool:
        """SYS: across the SMP interconnect between NUMA nodes (AmdTopology has the same test)."""
        return self.link(a, b) == "SYS"

    def gpu_pairs(self) -> list[tuple[str, str, str]]:
        g = self.gpus
        return [(a, b, self.link(a, b)) for i, a in enumerate(g) for b in g[i + 1:]]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "devices": self.devices,
                "matrix": {a: {b: self.links[(a, b)] for b in self.devices} for a in self.devices},
                "affinity": self.affinity, "nic_names": self.nic_names}


def parse_topo(text: str, source: str = "topology") -> Topo:
    """Parse `nvidia-smi topo -m` output (tabs or spaces, with or without the legend); ValueError
    naming the line when it is not that."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    start = next((n for n, line in enumerate(lines) if re.match(r"^\s*GPU0\b", line) and len(line.split()) > 1
                  and not re.match(r"^\s*GPU0\s+(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)\b", line)), None)
    if start is None:
        raise ValueError(f"{source}: no `nvidia-smi topo -m` matrix (a header line starting with GPU0)")
    header = lines[start].split()
    extra_at = next(
        (i for i in range(len(header)) if " ".join(header[i : i + 2]) in ("CPU Affinity", "NUMA Affinity")), len(header)
    )
    devices = header[:extra_at]
    extras = _labels(header[extra_at:])
    if len(set(devices)) != len(devices):
        raise ValueError(f"{source}: line {start + 1}: repeated device names in the header")
    links: dict[tuple[str, str], str] = {}
    affinity: dict[str, dict[str, str]] = {}
    n = start + 1
    while n < len(lines) and lines[n].strip() and not lines[n].strip().startswith("Legend"):
        tokens = lines[n].split()
        row = tokens[0]
        if row not in devices:
            raise ValueError(f"{source}: line {n + 1}: row {row!r} is not one of the header's devices {devices}")
        cells = tokens[1:1 + len(devices)]
        if len(cells) < len(devices):
            raise ValueError(f"{source}: line {n + 1}: {row} has {len(cells)} links for {len(devices)} devices")
        for col, cell in zip(devices, cells):
            if not _CELL.match(cell):
                raise ValueError(f"{source}: line {n + 1}: {row}/{col} is {cell!r}, not a topology link "
                                 "(X, NV#, PIX, PXB, PHB, NODE, SYS)")
            links[(row, col)] = "SYS" if cell == "SOC" else cell
        values = tokens[1 + len(devices):]
        if values:
            affinity[row] = dict(zip(extras, values))
        n += 1
    missing = [d for d in devices if (d, d) not in links]
    if missing:
        raise ValueError(f"{source}: the matrix has no row for {', '.join(missing)}")
    for (a, b), link in links.items():
        if (a == b) != (link == "X"):
            raise ValueError(f"{source}: {a}/{b} is {link!r}; X belongs on the diagonal and only there")
    nic_names = {}
    for line in lines[n:]:
        m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", line)
        if m:
            nic_names[m.group(1)] = m.group(2)
    return Topo(devices, links, affinity, nic_names, source)


def _labels(tokens: list[str]) -> list[str]:
    """'CPU Affinity NUMA Affinity GPU NUMA ID' -> the three labels (whichever are present)."""
    text, out = " ".join(tokens), []
    for label in _EXTRA_LABELS:
        if label in text:
            out.append(label.lower().replace(" ", "_"))
    return out


def run_nvidia_smi() -> str | None:
    """`nvidia-smi topo -m` of this host, or None without nvidia-smi (or when it fails)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def nearest_nics(topo: Topo, gpu: str) -> tuple[list[str], str | None]:
    if not topo.nics:
        return [], None
    best = min(link_rank(topo.link(gpu, n)) for n in topo.nics)
    nics = [n for n in topo.nics if link_rank(topo.link(gpu, n)) == best]
    return nics, topo.link(gpu, nics[0])


def p2p_disabled_by(env: Mapping[str, str]) -> str | None:
    """The variable that keeps NCCL's P2P off SYS paths, if one is set."""
    if env.get("NCCL_P2P_DISABLE", "").strip() in ("1", "true", "yes"):
        return "NCCL_P2P_DISABLE=1"
    level = env.get("NCCL_P2P_LEVEL", "").strip().upper()
    if level in _P2P_LEVEL_SAFE:
        return f"NCCL_P2P_LEVEL={level}"
    return None


def check_paths(topo: Topo, env: Mapping[str, str]) -> Check:
    name = "doctor.topo gpu-paths"
    pairs = topo.gpu_pairs()
    details = {"pairs": [{"a": a, "b": b, "link": link} for a, b, link in pairs], "source": topo.source}
    if not pairs:
        return Check(name, Status.OK, f"{len(topo.gpus)} GPU: no GPU pairs", details=details)
    sys_pairs = [f"{a}-{b}" for a, b, link in pairs if link == "SYS"]
    cpu_pairs = [f"{a}-{b} {link}" for a, b, link in pairs if link in ("PHB", "NODE")]
    guard = p2p_disabled_by(env)
    if sys_pairs and not guard:
        return Check(
            name,
            Status.WARN,
            f"{', '.join(sys_pairs)}: path SYS (across NUMA nodes, no NVLink); NCCL P2P between "
            "them is the classic init/first-step hang (two GPUs on different NUMA nodes)"
            + (f"; also through the CPU: {', '.join(cpu_pairs)}" if cpu_pairs else ""),
            details=details,
            where={"pairs": sys_pairs},
            hint="if NCCL hangs or is slow: NCCL_P2P_DISABLE=1, or NCCL_P2P_LEVEL=NODE (P2P stops at the socket); "
            "check ACS/IOMMU (lspci -vvv | grep ACSCtl, iommu=pt); run with NCCL_DEBUG=INFO and pass the log "
            "to --nccl-log",
        )
    if cpu_pairs and not guard:
        return Check(
            name,
            Status.WARN,
            f"{', '.join(cpu_pairs)}: P2P goes through the CPU's PCIe host bridge (slower than "
            "PIX/PXB/NVLink; some platforms stall it)",
            details=details,
            where={"pairs": cpu_pairs},
            hint="if all_reduce hangs or is slow between them: NCCL_P2P_DISABLE=1 or NCCL_P2P_LEVEL=PXB",
        )
    best = sorted({link for _, _, link in pairs}, key=link_rank)
    kept = f"; {guard} keeps P2P off {', '.join(sys_pairs + cpu_pairs)}" if guard and (sys_pairs or cpu_pairs) else ""
    return Check(name, Status.OK, f"{len(pairs)} GPU pair(s) over {', '.join(best)}{kept}", details=details)


def check_nic_affinity(topo: Topo, env: Mapping[str, str]) -> Check:
    name = "doctor.topo nic-affinity"
    if not topo.nics:
        return Check(name, Status.SKIP, "no NIC in the matrix", details={"reason": "no NIC rows"})
    far = []
    near = {}
    for gpu in topo.gpus:
        nics, link = nearest_nics(topo, gpu)
        near[gpu] = {"nics": [topo.nic_names.get(n, n) for n in nics], "link": link}
        if link == "SYS":
            far.append(gpu)
    details = {"nearest": near}
    hca = env.get("NCCL_IB_HCA", "").strip()
    names = [topo.nic_names.get(n, n) for n in topo.nics]
    if hca:
        wanted = [x.split(":")[0] for x in hca.lstrip("^=").split(",") if x]
        excluded = hca.startswith("^")
        exact = hca.lstrip("^").startswith("=")
        hits = [n for n in names if any((n == w) if exact else n.startswith(w) for w in wanted) != excluded]
        if not hits:
            return Check(
                name,
                Status.WARN,
                f"NCCL_IB_HCA={hca} matches none of this host's NICs ({', '.join(names)})",
                details=details,
                hint=f"set NCCL_IB_HCA to NICs next to the GPUs, e.g. ={near[topo.gpus[0]]['nics'][0]}",
            )
    if far:
        return Check(
            name,
            Status.WARN,
            f"{', '.join(far)} {'have' if len(far) > 1 else 'has'} no NIC on its NUMA node "
            "(nearest path SYS): network traffic crosses the socket",
            details=details,
            where={"gpus": far},
            hint="pin NCCL_IB_HCA to NICs close to the GPUs; NCCL's PXN (NCCL_PXN_DISABLE=0) can route through a "
            "GPU next to a NIC",
        )
    text = "; ".join(f"{g} -> {'/'.join(v['nics'])} ({v['link']})" for g, v in near.items())
    return Check(name, Status.OK, f"every GPU has a NIC on its side of the socket: {text}", details=details)


def topo_checks(topo: Topo, env: Mapping[str, str]) -> list[Check]:
    return [check_paths(topo, env), check_nic_affinity(topo, env)]


def topo_tables(topo: Topo) -> list[Table]:
    matrix = Table("topo", ["device", *topo.devices, "cpu_affinity", "numa_affinity"],
                   title=f"GPU/NIC topology ({topo.source})")
    for d in topo.devices:
        row = {c: topo.link(d, c) for c in topo.devices}
        aff = topo.affinity.get(d, {})
        matrix.add(device=d if d not in topo.nic_names else f"{d} ({topo.nic_names[d]})", **row,
                   cpu_affinity=aff.get("cpu_affinity"), numa_affinity=aff.get("numa_affinity"))
    tables = [matrix]
    if topo.nics:
        nics = Table("topo_nics", ["gpu", "nearest_nics", "link", "numa"], title="nearest NIC per GPU")
        for gpu in topo.gpus:
            near, link = nearest_nics(topo, gpu)
            nics.add(gpu=gpu, nearest_nics=", ".join(topo.nic_names.get(n, n) for n in near), link=link,
                     numa=topo.affinity.get(gpu, {}).get("numa_affinity"))
        tables.append(nics)
    return tables
