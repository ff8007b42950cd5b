"""The doctor across ranks: every rank reports its facts and the addresses it is bound to; the
first rank of each host also runs the host checks; rank 0 compares.

The rendezvous probe is the job itself: the launcher's rendezvous and process groups are built
(torchrun's c10d, Gloo's full mesh), then every rank all-gathers its rank over the Gloo control
group and checks that it sees exactly ranks 0..world-1. The address each rank bound is read from
the kernel, not predicted: the listening TCP sockets this process owns (/proc/self/fd ->
/proc/net/tcp{,6}), which are Gloo's per-group listeners, plus the local end of its connection to
the rendezvous store.
"""

from __future__ import annotations

import os
import socket
import struct
from collections import defaultdict
from pathlib import Path
from typing import Any

from distval import meta
from distval.doctor import net
from distval.results import Check, Status, Table

ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_GLOO_", "RCCL_", "HSA_")
_TCP_LISTEN, _TCP_ESTABLISHED = "0A", "01"


def _socket_inodes() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def _decode(hexaddr: str) -> tuple[str, int]:
    """/proc/net/tcp's 0100007F:9C82 (little-endian words) -> ('127.0.0.1', 40066)."""
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(ip, 16))), int(port, 16)
    addr = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    if addr.startswith("::ffff:") and "." in addr:
        addr = addr[7:]
    return addr, int(port, 16)


def bound_sockets(store_port: int | None) -> dict[str, Any]:
    """This process's TCP sockets: `listen` (address:port it accepts peers on: Gloo's listeners),
    `store` (local address of its connection to the rendezvous store on `store_port`), `peers`
    (local addresses of its other connections). `available` False where /proc does not say."""
    inodes = _socket_inodes()
    listen, peers, store = [], set(), None
    found = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or parts[9] not in inodes:
                continue
            (laddr, lport), (_, rport) = _decode(parts[1]), _decode(parts[2])
            if parts[3] == _TCP_LISTEN and lport != store_port:
                listen.append(f"{laddr}:{lport}")
            elif parts[3] == _TCP_ESTABLISHED:
                if store_port is not None and rport == store_port:
                    store = laddr
                else:
                    peers.add(laddr)
    return {"available": found, "listen": sorted(listen), "store": store, "peers": sorted(peers),
            "addresses": sorted({a.rsplit(":", 1)[0] for a in listen})}


def rank_facts(cfg: Any) -> dict[str, Any]:
    """What must agree across ranks: versions, the NCCL/Gloo environment, the interface names and
    MTU on the way to the master."""
    from distval.doctor import system

    ifaces = net.interfaces()
    ips = net.resolve(cfg.master_addr)
    route = net.route_to(ips[0], ifaces) if ips else None
    by_name = {i.name: i for i in ifaces}
    dev = by_name.get(route["dev"]) if route and route.get("dev") else None
    v = system.versions()
    return {
        "hostname": socket.gethostname(),
        "versions": {k: v.get(k) for k in ("distval", "python", "torch", "nccl", "cuda", "hip", "collectives",
                                           "runtime")},
        "env": {k: val for k, val in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "route_dev": dev.name if dev else None,
        "route_mtu": dev.mtu if dev else None,
        "interfaces": {i.name: i.mtu for i in ifaces},
    }


# -- comparison on rank 0 -------------------------------------------------------------------------


def _ranks_text(ranks: list[int]) -> str:
    return "rank " + str(ranks[0]) if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"


def check_versions(facts: dict[int, dict[str, Any]]) -> Check:
    name = "doctor.ranks versions"
    keys = ("torch", "nccl", "distval", "python", "cuda", "hip")
    by_key = {k: {r: f["versions"].get(k) for r, f in facts.items()} for k in keys}
    differ = {k: v for k, v in by_key.items() if len(set(v.values())) > 1}
    if not differ:
        v = facts[min(facts)]["versions"]
        return Check(
            name,
            Status.OK,
            f"{len(facts)} ranks agree: torch {v['torch']}, Python {v['python']}, {meta.stack_text(v)}",
            details={"versions": v},
        )
    text = "; ".join(f"{k}: " + ", ".join(f"{val} on {_ranks_text(rs)}" for val, rs in _value_groups(v).items())
                     for k, v in differ.items())
    severe = any(k in differ for k in ("torch", "nccl", "distval", "cuda", "hip"))
    return Check(
        name,
        Status.FAIL if severe else Status.WARN,
        f"versions differ across ranks: {text}",
        details={"differ": {k: {str(r): val for r, val in v.items()} for k, v in differ.items()}},
        hint="install the same torch/NCCL (and Python) on every node: mismatched NCCL or torch versions hang or "
        "corrupt collectives",
        where={"keys": sorted(differ)},
    )


def _value_groups(values: dict[int, Any]) -> dict[Any, list[int]]:
    out: dict[Any, list[int]] = defaultdict(list)
    for rank, value in sorted(values.items()):
        out[value].append(rank)
    return dict(out)


def check_env(facts: dict[int, dict[str, Any]]) -> Check:
    name = "doctor.ranks env"
    keys = sorted({k for f in facts.values() for k in f["env"]})
    differ = {}
    for k in keys:
        vals = {r: f["env"].get(k) for r, f in facts.items()}
        if len(set(vals.values())) > 1:
            differ[k] = vals
    if not differ:
        return Check(name, Status.OK, f"NCCL/Gloo environment identical on {len(facts)} ranks"
                     + (f" ({', '.join(keys)})" if keys else " (none set)"), details={"keys": keys})
    text = "; ".join(f"{k}: " + ", ".join(f"{'unset' if val is None else repr(val)} on {_ranks_text(rs)}"
                                          for val, rs in _value_groups(v).items()) for k, v in differ.items())
    return Check(
        name,
        Status.WARN,
        f"NCCL/Gloo environment differs across ranks: {text}",
        details={"differ": {k: {str(r): val for r, val in v.items()} for k, v in differ.items()}},
        hint="export the same NCCL_*/GLOO_* (RCCL_*/HSA_* on AMD) settings on every node (interface names may "
        "differ per node on purpose)",
        where={"keys": sorted(differ)},
    )


def check_interfaces(facts: dict[int, dict[str, Any]]) -> Check:
    """Interface names and MTU on the way to the master, per host."""
    name = "doctor.ranks interfaces"
    hosts: dict[str, dict[str, Any]] = {}
    for r, f in sorted(facts.items()):
        hosts.setdefault(f["hostname"], {"dev": f["route_dev"], "mtu": f["route_mtu"], "ranks": []})["ranks"].append(r)
    devs = {h: v["dev"] for h, v in hosts.items()}
    mtus = {h: v["mtu"] for h, v in hosts.items() if v["mtu"] is not None}
    details = {"hosts": hosts}
    problems = []
    if len(set(devs.values())) > 1:
        problems.append("the route to the master leaves by " + ", ".join(f"{d} on {h}" for h, d in devs.items()))
    if len(set(mtus.values())) > 1:
        problems.append("MTU " + ", ".join(f"{m} on {h}" for h, m in mtus.items()))
    if problems:
        return Check(name, Status.WARN, f"hosts differ: {'; '.join(problems)}", details=details,
                     hint="set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME per node to that node's name; give every node's "
                          "interface the same MTU (a mismatch drops large frames: hangs on big messages)",
                     where={"hosts": sorted(hosts)})
    dev = next(iter(devs.values()))
    mtu = next(iter(mtus.values()), None)
    return Check(name, Status.OK, f"{len(hosts)} host(s) reach the master through {dev} (MTU {mtu})", details=details)


def check_rendezvous(results: list[dict[str, Any]], ranks: list[dict[str, Any]], world_size: int,
                     expect_world: int | None) -> Check:
    name = "doctor.rendezvous"
    seen_ok = all(r["seen"] == list(range(world_size)) for r in results)
    gathered = sorted(info["rank"] for info in ranks)
    hosts = sorted({info["host"] for info in ranks})
    bound = {info["rank"]: res["bound"] for info, res in zip(ranks, results)}
    details = {
        "world_size": world_size,
        "hosts": hosts,
        "ranks": [
            {"rank": info["rank"], "host": info["host"], "bound": res["bound"]} for info, res in zip(ranks, results)
        ],
    }
    if expect_world is not None and world_size != expect_world:
        return Check(name, Status.FAIL, f"world of {world_size} ranks, expected {expect_world}", details=details,
                     hint="every node must join the same rendezvous (same --rdzv-endpoint and --rdzv-id, --nnodes)")
    if not seen_ok or gathered != list(range(world_size)):
        return Check(name, Status.FAIL, f"ranks disagree on the world: gathered {gathered}, each saw "
                     f"{sorted({tuple(r['seen']) for r in results})}", details=details)
    loop = [r for r, b in bound.items() if b["addresses"] and all(net.is_loopback(a) for a in b["addresses"])]
    addrs = "; ".join(
        f"{info['rank']}@{info['host']} {','.join(bound[info['rank']]['addresses']) or '?'}" for info in ranks
    )
    if len(hosts) > 1 and loop:
        return Check(
            name,
            Status.FAIL,
            f"{_ranks_text(loop)} bound only loopback addresses in a world across {len(hosts)} hosts: {addrs}",
            details=details,
            where={"ranks": loop},
            hint="their host names resolve to 127.x: fix /etc/hosts or set GLOO_SOCKET_IFNAME on those nodes",
        )
    return Check(name, Status.OK, f"{world_size} ranks on {len(hosts)} host(s) see the same world; bound: {addrs}",
                 details=details)


def compare(results: list[dict[str, Any]], ranks: list[dict[str, Any]], world_size: int,
            expect_world: int | None) -> tuple[list[Check], Table]:
    facts = {info["rank"]: res["facts"] for info, res in zip(ranks, results)}
    checks = [check_rendezvous(results, ranks, world_size, expect_world), check_versions(facts), check_env(facts),
              check_interfaces(facts)]
    table = Table(
        "ranks",
        ["rank", "host", "local_rank", "pid", "bound", "store_local", "route_dev", "mtu", "torch", "nccl"],
        title="ranks",
    )
    for info, res in zip(ranks, results):
        f, b = res["facts"], res["bound"]
        table.add(
            rank=info["rank"],
            host=info["host"],
            local_rank=info["local_rank"],
            pid=info["pid"],
            bound=", ".join(b["listen"]) or None,
            store_local=b["store"],
            route_dev=f["route_dev"],
            mtu=f["route_mtu"],
            torch=f["versions"]["torch"],
            nccl=f["versions"]["nccl"],
        )
    return checks, table
