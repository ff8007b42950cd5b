"""Read an NCCL_DEBUG=INFO log: what NCCL chose, and whether that choice is a known hang.

Lines look like `host:pid:tid [cudaDev] NCCL INFO <message>` (the prefix is absent in some copies).
The messages read here:
  NCCL version 2.21.5+cuda12.4
  Bootstrap : Using eth0:10.0.0.1<0>                     the interface the bootstrap uses
  NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:...     interfaces of the socket transport
  NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>
  Using network IB | Socket
  comm 0x... rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0
  Channel 00/02 :    0   1   2   3                     ring order of channel 0
  Ring 00 : 3 -> 0 -> 1 | Trees [0] 1/-1/-1->0->-1 ...  rings and trees
  Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM             one connection: rank[device] -> rank[device]
  Channel 02/0 : 0[0] -> 2[0] [send] via NET/IB/0/GDRDMA
  Connected all rings, use ring PXN 0 GDR 1
  NCCL_P2P_LEVEL set by environment to SYS
and every `NCCL WARN` line. The device in brackets is the CUDA device index in current NCCL (the
PCI bus id, e.g. [4a000], in old releases): matched against `nvidia-smi topo -m` it assumes the same
numbering (CUDA_DEVICE_ORDER=PCI_BUS_ID, no CUDA_VISIBLE_DEVICES remapping) and, for a log of
several hosts, that every host has the topology given.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distval.doctor.net import is_decoy_name
from distval.doctor.topo import Topo
from distval.results import Check, Status, Table

if TYPE_CHECKING:
    from distval.rocm.smi import AmdTopology

_LINE = re.compile(
    r"(?:(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] )?(?:\S+:\d+ )?"
    r"NCCL (?P<level>INFO|WARN) ?(?P<msg>.*)$"
)
# "NCCL version 2.21.5+cuda12.4"; RCCL: "RCCL version 2.18.3+hip5.7 HEAD:b502725" (to 2.20), then a block
# "RCCL version : 2.21.5-HEAD:eef7b29" / "HIP version  : 6.3.42131-fa1d09cbd" / "ROCm version : 6.3.0.0-39-ce2be3b"
_VERSION = re.compile(r"\b(?P<lib>NCCL|RCCL) version\s*:?\s*(?P<v>\d[^\s]*)")
_ROCM_VERSION = re.compile(r"^\s*ROCm version\s*:\s*(\d+\.\d+(?:\.\d+)?)")
_RCCL_SUFFIX = re.compile(r"\s+comm 0x[0-9a-fA-F]+ nRanks \d+(?: busId \w+)?\s*$")  # RCCL appends it to many lines
_INIT_DONE = re.compile(r"rank (\d+) nranks (\d+)\b.*- Init COMPLETE")
_INIT_TIME = re.compile(r"^Init timings.*rank (\d+) nranks \d+ total ([\d.]+)")
# RCCL's own start-up advice (init.cc checks of the host), not failures of the job
_ADVISORY = re.compile(r'Missing "|NUMA auto balancing')
_CHANNEL = re.compile(r"^Channel (?P<ch>\d+)(?:/(?P<sub>\d+))? : (?P<src>\d+)\[(?P<sdev>[0-9a-fA-F]+)\] -> "
                      r"(?P<dst>\d+)\[(?P<ddev>[0-9a-fA-F]+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$")
_RING_ORDER = re.compile(r"^Channel (\d+)/(\d+) :\s+((?:\d+\s*)+)$")
_RING = re.compile(r"^Ring (\d+) : (.+)$")
_TREE = re.compile(r"^Trees? ?(?:\[\d+\]|\d+ :)")
_CONNECTED = re.compile(r"^Connected all (rings|trees)(?:.*\bGDR (\d))?")
_SOCKET_IFS = re.compile(r"\[(\d+)\]([^:\s\[\]]+):(\S+?)<\d+>")
_IB_HCAS = re.compile(r"\[(\d+)\]([^:\s\[\]]+):(\d+)/(IB|RoCE)")
_COMM = re.compile(r"comm 0x[0-9a-fA-F]+ rank (\d+) nRanks (\d+) nNodes (\d+)")
_ENV = re.compile(r"^(NCCL_\w+) set by environment to (.*)$")


@dataclass
class Connection:
    host: str | None
    channel: int
    src_rank: int
    src_dev: str
    dst_rank: int
    dst_dev: str
    direction: str | None
    via: str
    line: int

    @property
    def transport(self) -> str:
        parts = self.via.split("/")
        if parts[0] == "P2P":
            kind = parts[1] if len(parts) > 1 else ""
            return "P2P/direct" if kind.startswith("direct") else f"P2P/{kind}" if kind else "P2P"
        if parts[0] == "NET" and len(parts) > 1:
            return f"NET/{parts[1]}"
        return parts[0]

    @property
    def gdr(self) -> bool:
        return "GDRDMA" in self.via


@dataclass
class NcclLog:
    source: str
    version: str | None = None
    library: str = "NCCL"  # RCCL on ROCm
    rocm: str | None = None
    init_done: set[int] = field(default_factory=set)  # ranks whose communicator reached Init COMPLETE
    init_s: float | None = None  # the slowest rank's init time (Init timings, NCCL/RCCL 2.23+)
    msccl: list[str] = field(default_factory=list)  # RCCL's MSCCL/MSCCL++ lines (which algorithms it took)
    aborted: int = 0  # Abort COMPLETE lines
    connections: list[Connection] = field(default_factory=list)
    rings: dict[int, str] = field(default_factory=dict)
    num_trees: int = 0
    socket_ifs: list[dict[str, str]] = field(default_factory=list)
    ib_hcas: list[dict[str, str]] = field(default_factory=list)
    bootstrap_if: dict[str, str] | None = None
    network: str | None = None
    gdr: bool | None = None
    num_ranks: int | None = None
    num_nodes: int | None = None
    hosts: dict[int, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    num_lines: int = 0

    def summary(self) -> dict[str, Any]:
        counts = Counter(c.transport for c in self.connections)
        return {"source": self.source, "library": self.library, "version": self.version, "rocm": self.rocm,
                "init_complete": len(self.init_done), "init_s": self.init_s, "msccl": self.msccl[:4],
                "aborted": self.aborted, "ranks": self.num_ranks, "nodes": self.num_nodes,
                "network": self.network, "socket_interfaces": self.socket_ifs, "ib_hcas": self.ib_hcas,
                "bootstrap_interface": self.bootstrap_if, "gdr": self.gdr, "transports": dict(counts),
                "rings": len(self.rings), "trees": self.num_trees, "env": self.env, "warnings": len(self.warnings)}


def parse_nccl_log(text: str, source: str = "NCCL log") -> NcclLog:
    """Parse the NCCL lines of a log (other lines are ignored); ValueError if there are none."""
    log = NcclLog(source)
    seen_hosts: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        vm = _VERSION.search(raw)
        if vm and log.version is None:
            log.library, log.version = vm.group("lib"), vm.group("v")
        if (rm := _ROCM_VERSION.match(raw)) and log.rocm is None:
            log.rocm = rm.group(1)
        m = _LINE.search(raw)
        if not m:
            continue
        log.num_lines += 1
        host, msg = m.group("host"), _RCCL_SUFFIX.sub("", m.group("msg").strip())
        if host:
            seen_hosts.add(host)
        if m.group("level") == "WARN":
            log.warnings.append(raw.strip())
            continue
        _read_info(log, host, msg, n)
    if log.num_nodes is None and len(seen_hosts) > 1:  # no "nNodes" line (RCCL's older logs): the hosts seen
        log.num_nodes = len(seen_hosts)
    if log.num_lines == 0 and log.version is None:
        raise ValueError(
            f"{source}: no NCCL lines ('NCCL INFO ...', as NCCL and RCCL write them); run the job with "
            "NCCL_DEBUG=INFO and pass its output"
        )
    return log


def _read_info(log: NcclLog, host: str | None, msg: str, n: int) -> None:
    if m := _CHANNEL.match(msg):
        log.connections.append(Connection(host, int(m["ch"]), int(m["src"]), m["sdev"], int(m["dst"]), m["ddev"],
                                          m["dir"], m["via"], n))
    elif m := _RING_ORDER.match(msg):
        log.rings.setdefault(int(m.group(1)), " ".join(m.group(3).split()))
    elif m := _RING.match(msg):
        log.rings.setdefault(int(m.group(1)), m.group(2).strip())
    elif _TREE.match(msg):
        log.num_trees += 1
    elif m := _CONNECTED.match(msg):
        if m.group(2) is not None:
            log.gdr = m.group(2) == "1"
    elif msg.startswith("NET/Socket : Using"):
        for idx, name, addr in _SOCKET_IFS.findall(msg):
            entry = {"index": idx, "interface": name, "address": addr, "host": host}
            if entry not in log.socket_ifs:
                log.socket_ifs.append(entry)
    elif msg.startswith("NET/IB : Using"):
        for idx, hca, port, kind in _IB_HCAS.findall(msg):
            entry = {"index": idx, "hca": hca, "port": port, "link": kind, "host": host}
            if entry not in log.ib_hcas:
                log.ib_hcas.append(entry)
    elif m := re.match(r"^Bootstrap ?: Using ([^:\s]+):(\S+?)<\d+>", msg):
        log.bootstrap_if = log.bootstrap_if or {"interface": m.group(1), "address": m.group(2), "host": host}
    elif m := re.match(r"^Using network (\S+)", msg):
        log.network = m.group(1)
    elif m := _COMM.search(msg):
        rank, log.num_ranks, log.num_nodes = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if host:
            log.hosts[rank] = host
    elif m := _ENV.match(msg):
        log.env[m.group(1)] = m.group(2).strip().rstrip(".")
    elif m := _INIT_DONE.search(msg):
        log.init_done.add(int(m.group(1)))
        log.num_ranks = log.num_ranks or int(m.group(2))
    elif m := _INIT_TIME.match(msg):
        log.init_s = max(log.init_s or 0.0, float(m.group(2)))
    elif msg.startswith(("MSCCL", "Using MSCCL")):
        if msg not in log.msccl:
            log.msccl.append(msg)
    elif msg.endswith("Abort COMPLETE"):
        log.aborted += 1


def load_nccl_log(path: str | Path) -> NcclLog:
    p = Path(path)
    if not p.is_file():
        raise ValueError(
            f"--nccl-log {str(p)!r} does not exist" if not p.exists() else f"--nccl-log {str(p)!r} is not a file"
        )
    try:
        text = p.read_text(encoding="utf-8", errors="strict")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--nccl-log {str(p)!r} cannot be read as text ({e})") from None
    return parse_nccl_log(text, f"--nccl-log {str(p)!r}")


def _gpu_index(dev: str) -> int | None:
    """A CUDA device index, or None for an old-style PCI bus id (hex, e.g. 4a000, 7000)."""
    if dev.isdigit() and int(dev) < 1000:
        return int(dev)
    return None


def _pairs(conns: list[Connection]) -> dict[tuple, dict[str, Any]]:
    """Connections grouped by (host, src rank/dev, dst rank/dev, transport, direction)."""
    out: dict[tuple, dict[str, Any]] = {}
    for c in conns:
        key = (c.host, c.src_rank, c.src_dev, c.dst_rank, c.dst_dev, c.transport, c.direction)
        entry = out.setdefault(key, {"channels": [], "gdr": False, "via": c.via, "line": c.line})
        entry["channels"].append(c.channel)
        entry["gdr"] |= c.gdr
    return out


def check_transports(log: NcclLog) -> Check:
    name = "doctor.nccl transports"
    counts = Counter(c.transport for c in log.connections)
    details = log.summary()
    if not counts:
        return Check(
            name,
            Status.SKIP,
            f"{log.source}: no channel connection lines ('Channel NN/0 : a[i] -> b[j] via ...')",
            details=details | {"reason": "no connections in the log"},
            hint="set NCCL_DEBUG=INFO before the first collective (and NCCL_DEBUG_SUBSYS unset or including INIT)",
        )
    parts = [f"{t} x{n}" for t, n in sorted(counts.items())]
    extra = []
    if log.rings:
        extra.append(f"{len(log.rings)} ring channel(s)")
    if log.num_trees:
        extra.append("trees")
    if log.gdr is not None or any(c.gdr for c in log.connections):
        extra.append("GDR " + ("on" if log.gdr or any(c.gdr for c in log.connections) else "off"))
    number = re.match(r"\d+\.\d+\.\d+", log.version or "")
    built = re.search(r"\+(hip|cuda)([\d.]+)", log.version or "")  # "2.18.3+hip5.7": built for HIP 5.7
    runtime = f"ROCm {log.rocm}" if log.rocm else f"{built.group(1).upper()} {built.group(2)}" if built else None
    version = (f"{log.library} {number.group() if number else log.version}" + (f" ({runtime})" if runtime else "")
               + ": ") if log.version else ""
    if log.init_done:
        extra.append(f"{len(log.init_done)} rank(s) initialised"
                     + (f" in up to {log.init_s:.2f} s" if log.init_s else ""))
    if log.msccl:
        extra.append("MSCCL++ on" if any(m.startswith("MSCCL++: Enabled") for m in log.msccl) else "MSCCL on")
    return Check(
        name,
        Status.OK,
        f"{version}{', '.join(parts)} connections" + (f"; {', '.join(extra)}" if extra else ""),
        details=details,
    )


def check_network(log: NcclLog) -> Check:
    """The interface NCCL chose: loopback between nodes hangs; a container/VPN link probably too."""
    name = "doctor.nccl network"
    chosen = [s["interface"] for s in log.socket_ifs]
    if log.bootstrap_if and log.bootstrap_if["interface"] not in chosen:
        chosen.insert(0, log.bootstrap_if["interface"])
    details = {"network": log.network, "socket_interfaces": log.socket_ifs, "bootstrap_interface": log.bootstrap_if,
               "ib_hcas": log.ib_hcas, "nodes": log.num_nodes}
    if not chosen and not log.ib_hcas:
        return Check(
            name,
            Status.SKIP,
            f"{log.source}: no 'NET/Socket : Using', 'NET/IB : Using' or 'Bootstrap : Using' line",
            details=details | {"reason": "no interface lines"},
        )
    ifs = ", ".join(dict.fromkeys(f"{s['interface']} ({s['address']})" for s in log.socket_ifs)) or ", ".join(
        dict.fromkeys(chosen)
    )
    hcas = ", ".join(dict.fromkeys(f"{h['hca']}:{h['port']}/{h['link']}" for h in log.ib_hcas))
    text = (f"network {log.network}; " if log.network else "") + (f"sockets over {ifs}" if ifs else "") + \
        (f"; IB over {hcas}" if hcas else "")
    multi = (log.num_nodes or 1) > 1
    fix = "set NCCL_SOCKET_IFNAME==<the interface that reaches the other nodes> (and GLOO_SOCKET_IFNAME) on every node"
    if multi and "lo" in chosen:
        return Check(name, Status.FAIL, f"{text}: NCCL uses lo with {log.num_nodes} nodes: other nodes cannot reach it",
                     details=details, hint=fix, where={"interface": "lo"})
    decoys = list(dict.fromkeys(n for n in chosen if is_decoy_name(n)))
    if decoys:
        return Check(name, Status.WARN, f"{text}: {', '.join(decoys)} looks like a container/VPN/bridge interface; "
                     "if the job hangs at init or is slow, NCCL picked the wrong interface", details=details, hint=fix,
                     where={"interface": decoys[0]})
    if multi and log.network == "Socket" and not log.ib_hcas:
        return Check(name, Status.OK, f"{text} (TCP sockets between nodes: no IB/RoCE in use)", details=details)
    return Check(name, Status.OK, text, details=details)


def check_p2p_paths(log: NcclLog, topo: "Topo | AmdTopology | None") -> Check:
    """The P2P-over-SYS hang: P2P (CUMEM, IPC or direct) between GPUs whose topology path is SYS: NCCL's kernels
    spin-wait on data that never arrives; both GPUs at 100%, no progress, no error."""
    name = "doctor.nccl p2p-paths"
    p2p = [c for c in log.connections if c.transport.startswith("P2P")]
    if not p2p:
        return Check(name, Status.OK, "no P2P connection in the log (SHM/NET between GPUs)", details={"p2p": 0})
    devs = sorted({(c.src_dev, c.dst_dev) for c in p2p})
    if topo is None:
        return Check(
            name,
            Status.SKIP,
            f"{len(p2p)} P2P connection(s) ({', '.join(sorted({c.transport for c in p2p}))}); "
            "give --topo-file (or run where nvidia-smi, amd-smi or rocm-smi is) to check their paths",
            details={"reason": "no topology"},
        )
    def gpu(dev: str) -> str | None:
        """The matrix's name of a log's device: a CUDA index, or (RCCL, old NCCL) a PCI bus id the
        topology knows (amd-smi's tables are keyed by PCI address)."""
        index = _gpu_index(dev)
        if index is not None:
            return f"GPU{index}"
        by_bus = getattr(topo, "gpu_for_bus", None)
        return by_bus(dev) if by_bus is not None else None

    if any(gpu(a) is None or gpu(b) is None for a, b in devs):
        return Check(
            name,
            Status.SKIP,
            "the log names devices by PCI bus id and the topology has no bus ids to match them "
            "(old NCCL, RCCL): give amd-smi's topology, or a log with device indices",
            details={"reason": "bus ids", "devices": devs},
        )
    bad, unknown, paths = [], [], {}
    for key, entry in _pairs(p2p).items():
        host, src, sdev, dst, ddev, transport, _ = key
        a, b = gpu(sdev), gpu(ddev)
        if a not in topo.gpus or b not in topo.gpus:
            unknown.append(f"{a}-{b}")
            continue
        link = topo.link(a, b)
        paths[f"{a}-{b}"] = link
        if topo.crosses_socket(a, b):  # SYS; on AMD, PCIe between GPUs of different NUMA nodes
            bad.append({"host": host, "src_rank": src, "dst_rank": dst, "gpus": f"{a}->{b}", "transport": transport,
                        "channels": entry["channels"], "line": entry["line"], "via": entry["via"]})
    if unknown and not paths:
        return Check(name, Status.SKIP, f"the log's GPUs ({', '.join(sorted(set(unknown)))}) are not in the matrix "
                     f"({', '.join(topo.gpus)}): a different machine?", details={"reason": "GPU not in topology"})
    if bad:
        first = bad[0]
        where_host = f" on {first['host']}" if first["host"] else ""
        conns = "; ".join(f"{b['src_rank']}->{b['dst_rank']} ({b['gpus']}) via {b['transport']} on channel(s) "
                          f"{','.join(f'{c:02d}' for c in b['channels'])}" for b in bad)
        return Check(
            name,
            Status.FAIL,
            f"P2P between GPUs whose path is {paths[first['gpus'].replace('->', '-')]} (across NUMA nodes)"
            f"{where_host}: {conns}; "
            "the classic P2P hang (kernels spin at 100% with no progress)",
            details={"connections": bad, "paths": paths, "topology": topo.source},
            hint="NCCL_P2P_DISABLE=1 (traffic goes through SHM/NET), or NCCL_P2P_LEVEL=NODE so P2P stops at the "
            "socket boundary; check ACS/IOMMU (iommu=pt, ACS off) if P2P should work",
            where={
                "host": first["host"],
                "rank": first["src_rank"],
                "peer": first["dst_rank"],
                "gpus": first["gpus"],
                "line": first["line"],
            },
        )
    return Check(
        name,
        Status.OK,
        f"P2P only between GPUs on good paths: {', '.join(f'{k} {v}' for k, v in sorted(paths.items()))}",
        details={"paths": paths},
    )


def check_warnings(log: NcclLog) -> Check:
    """WARN lines; RCCL's start-up advice about the host (Missing "iommu=pt", NUMA auto balancing)
    is told apart from the failures, which come first."""
    name = "doctor.nccl warnings"
    if not log.warnings:
        return Check(name, Status.OK, "no NCCL WARN lines", details={"warnings": []})
    failures = [w for w in log.warnings if not _ADVISORY.search(w)]
    advice = list(dict.fromkeys(w.split("NCCL WARN", 1)[-1].strip() for w in log.warnings if _ADVISORY.search(w)))
    details = {"warnings": log.warnings[:50], "failures": len(failures), "advice": advice}
    aborted = f"; {log.aborted} communicator(s) aborted" if log.aborted else ""
    if failures:
        first = failures[0].split("NCCL WARN", 1)[-1].strip()
        return Check(name, Status.WARN, f"{len(failures)} NCCL WARN line(s){aborted}, first: {first}"
                     + (f" (and {len(advice)} host advisory line(s))" if advice else ""), details=details,
                     hint="read them in the log; each names the failing call")
    return Check(name, Status.WARN, f"{log.library}'s host advice: " + "; ".join(advice), details=details,
                 hint="each line says what to change (sudo sysctl kernel.numa_balancing=0, iommu=pt on the kernel "
                 "command line, HSA_FORCE_FINE_GRAIN_PCIE=1 for PCIe peer-to-peer); `distval doctor` checks them too")


def nccl_checks(log: NcclLog, topo: Topo | None) -> list[Check]:
    return [check_transports(log), check_network(log), check_p2p_paths(log, topo), check_warnings(log)]


def nccl_table(log: NcclLog, topo: Topo | None) -> Table:
    t = Table("nccl_connections", ["host", "from", "to", "transport", "direction", "channels", "gdr", "path"],
              title=f"NCCL connections ({log.source})")
    for (host, src, sdev, dst, ddev, transport, direction), e in _pairs(log.connections).items():
        a, b = _gpu_index(sdev), _gpu_index(ddev)
        path = None
        if topo is not None and a is not None and b is not None and f"GPU{a}" in topo.gpus and f"GPU{b}" in topo.gpus \
                and transport.startswith(("P2P", "SHM")):
            path = topo.link(f"GPU{a}", f"GPU{b}")
        t.add(host=host, **{"from": f"{src}[{sdev}]", "to": f"{dst}[{ddev}]"}, transport=transport, direction=direction,
              channels=",".join(f"{c:02d}" for c in e["channels"]), gdr=e["gdr"], path=path)
    return t
