"""Network facts and the checks on them: interfaces, routes, hostname resolution, the socket
interface variables of Gloo and NCCL, decoy interfaces, port reachability. Torch-free: `distval
doctor`'s host checks run before it imports torch.

Where the facts come from: `ip -j addr`, `ip -j route`, `ip -j route get ADDR` (iproute2, the
current network namespace) with /sys/class/net for link speed; without iproute2, the interface
list of the socket module, /sys/class/net, /proc/net/if_inet6, an ioctl for IPv4 addresses, and a
connected UDP socket to learn which source address (hence interface) the kernel picks (those
readers, which interface holds an address or a route leaves by, and name resolution, live in
`distval.netaddr`, shared with the worker's pre-flight `distval.launch.netcheck`).

The two variables have different grammars (verified against torch 2.13's Gloo and the NCCL
environment-variable documentation):
  GLOO_SOCKET_IFNAME  a comma list of exact interface names; every one must exist and hold an
                      address ("Unable to find address for: ^lo"); spaces are not stripped; empty
                      items are ignored; several names are used round-robin.
  NCCL_SOCKET_IFNAME  a comma list of name *prefixes*; a leading `^` excludes instead of selects,
                      a leading `=` (after `^` if both) makes every item an exact name; an item may
                      carry `:port`. `^`/`=` anywhere else become part of a name that matches nothing.
Unset, Gloo binds the address the hostname resolves to (127.0.0.1 if it resolves to loopback or to
an address no interface holds) and NCCL prefers `ib*` interfaces, then any but `docker*` and `lo`,
so `virbr0`, `tun0`, `wg0`, `veth*` or `br-*` can win and hang a multi-node job at init.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from distval.netaddr import (
    family_of,
    interface_names,
    interface_of,
    ipv4_with_prefix,
    ipv6_addresses,
    is_loopback,
    resolve,
    route_interface,
)
from distval.results import Check, Status

SYS_NET = Path("/sys/class/net")
DECOY_PREFIXES = (
    "docker",
    "br-",
    "virbr",
    "veth",
    "tun",
    "tap",
    "wg",
    "tailscale",
    "zt",
    "vboxnet",
    "vmnet",
    "cni",
    "flannel",
)
_NAME_RE = re.compile(r"^[A-Za-z0-9_.@:-]{1,15}$")  # Linux IFNAMSIZ is 16 with the NUL


@dataclass
class Interface:
    name: str
    up: bool
    state: str  # the kernel's operstate: UP, DOWN, UNKNOWN (loopback, many virtual links), ...
    mtu: int | None
    addresses: list[str] = field(default_factory=list)  # "addr/prefixlen", IPv4 first
    speed_mbps: int | None = None
    loopback: bool = False

    @property
    def ips(self) -> list[str]:
        return [a.split("/")[0] for a in self.addresses]

    @property
    def routable_ips(self) -> list[str]:
        """Addresses another host could reach (not IPv6 link-local)."""
        return [ip for ip in self.ips if not ipaddress.ip_address(ip).is_link_local]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_decoy_name(name: str) -> bool:
    return name.startswith(DECOY_PREFIXES)


# -- facts ------------------------------------------------------------------------------------


def _ip_json(*args: str) -> Any | None:
    """`ip -j ARGS` parsed, or None when iproute2 is missing or the command fails."""
    if shutil.which("ip") is None:
        return None
    try:
        out = subprocess.run(["ip", "-j", *args], check=False, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    try:
        return json.loads(out.stdout)
    except ValueError:
        return None


def _sys_read(name: str, attr: str) -> str | None:
    try:
        return (SYS_NET / name / attr).read_text().strip()
    except OSError:  # speed of a virtual link is EINVAL; a name from another namespace is absent
        return None


def _speed(name: str) -> int | None:
    text = _sys_read(name, "speed")
    try:
        value = int(text) if text is not None else -1
    except ValueError:
        return None
    return value if value > 0 else None


def interfaces() -> list[Interface]:
    """Every interface of this network namespace, in kernel index order."""
    data = _ip_json("addr")
    if data is None:
        return _interfaces_without_ip()
    out = []
    for link in data:
        flags = link.get("flags", [])
        addrs = sorted(link.get("addr_info", []), key=lambda a: a.get("family") != "inet")
        out.append(Interface(
            name=link["ifname"], up="UP" in flags, state=link.get("operstate", "UNKNOWN"), mtu=link.get("mtu"),
            addresses=[f"{a['local']}/{a['prefixlen']}" for a in addrs if "local" in a],
            speed_mbps=_speed(link["ifname"]), loopback="LOOPBACK" in flags))
    return out


def _interfaces_without_ip() -> list[Interface]:
    """The interfaces from the socket module, /sys/class/net, an ioctl and /proc/net/if_inet6."""
    v6 = ipv6_addresses()  # {} without IPv6 on this host: IPv4 addresses only
    out = []
    for name in interface_names():
        flags = int(_sys_read(name, "flags") or "0", 16)
        v4 = ipv4_with_prefix(name)
        mtu = _sys_read(name, "mtu")
        out.append(Interface(name=name, up=bool(flags & 0x1), state=(_sys_read(name, "operstate") or "unknown").upper(),
                             mtu=int(mtu) if mtu and mtu.isdigit() else None,
                             addresses=([v4] if v4 else []) + v6.get(name, []),
                             speed_mbps=_speed(name), loopback=bool(flags & 0x8)))
    return out


def routes() -> list[dict[str, Any]]:
    """The main routing tables (IPv4 then IPv6) as iproute2 reports them: dst, gateway, dev, prefsrc."""
    out = []
    for family in ("-4", "-6"):
        data = _ip_json(family, "route")
        for r in data or []:
            out.append({k: r.get(k) for k in ("dst", "gateway", "dev", "prefsrc", "metric") if r.get(k) is not None}
                       | {"family": "inet" if family == "-4" else "inet6"})
    return out


def held_by(ifaces: list[Interface]) -> dict[str, list[str]]:
    """{interface: its addresses}, what `netaddr.interface_of` looks in."""
    return {i.name: i.ips for i in ifaces}


def route_to(addr: str, ifaces: list[Interface] | None = None) -> dict[str, Any] | None:
    """How the kernel reaches `addr` (an IP address): {dev, src, gateway, local}. `dev` is the
    interface packets leave by; for one of this host's own addresses it is the interface holding
    the address (what other hosts reach it through; 127.x: lo). None when there is no route."""
    ifaces = interfaces() if ifaces is None else ifaces
    data = _ip_json("route", "get", addr)
    if data:
        r = data[0]
        local = r.get("type") == "local"
        dev = (interface_of(addr, held_by(ifaces)) or r.get("dev")) if local else r.get("dev")
        return {"addr": addr, "dev": dev, "src": r.get("prefsrc"), "gateway": r.get("gateway"), "local": local}
    if shutil.which("ip") is not None:
        return None  # iproute2 answered "unreachable"
    src, leaves_by = route_interface(addr, held=held_by(ifaces))
    if src is None:
        return None
    owner = interface_of(addr, held_by(ifaces))
    return {"addr": addr, "dev": owner or leaves_by, "src": src, "gateway": None, "local": owner is not None}


def interface_for(addr: str) -> str | None:
    """The interface the kernel routes `addr` (an address or a host name) through, or None when
    it does not resolve or there is no route. For this host's own address: the interface holding it."""
    ips = resolve(addr)
    if not ips:
        return None
    route = route_to(ips[0])
    return route["dev"] if route else None


# -- the socket-interface variables -------------------------------------------------------------


def parse_gloo_ifname(value: str) -> list[str]:
    """GLOO_SOCKET_IFNAME's names; ValueError naming the first item Gloo cannot use as a name."""
    names = [item for item in value.split(",") if item != ""]
    for item in names:
        if item[0] in "^=":
            raise ValueError(f"GLOO_SOCKET_IFNAME={value!r}: {item!r} uses NCCL's {item[0]!r} syntax; Gloo takes exact "
                             f"interface names only (it fails with 'Unable to find address for: {item}')")
        if item != item.strip():
            raise ValueError(f"GLOO_SOCKET_IFNAME={value!r}: {item!r} has spaces; Gloo does not strip them")
        if not _NAME_RE.match(item):
            raise ValueError(f"GLOO_SOCKET_IFNAME={value!r}: {item!r} is not an interface name")
    return names


@dataclass
class NcclIfname:
    exclude: bool
    exact: bool
    items: list[str]  # names or prefixes, without a :port suffix

    def matches(self, name: str) -> bool:
        hit = any(name == p if self.exact else name.startswith(p) for p in self.items)
        return hit != self.exclude


def parse_nccl_ifname(value: str) -> NcclIfname:
    """NCCL_SOCKET_IFNAME: `[^][=]item[:port],item...`; ValueError on what NCCL would read as a
    name that matches nothing."""
    rest = value
    exclude = rest.startswith("^")
    rest = rest[1:] if exclude else rest
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    items = []
    for raw in rest.split(","):
        if raw == "":
            continue
        name, _, port = raw.partition(":")
        if any(c in name for c in "^="):
            raise ValueError(
                f"NCCL_SOCKET_IFNAME={value!r}: {raw!r} has {'^' if '^' in name else '='} inside the list; "
                f"NCCL reads ^ and = only at the start of the whole value (e.g. ^=docker0,lo)"
            )
        if name != name.strip() or not _NAME_RE.match(name) or (port and not port.isdigit()):
            raise ValueError(f"NCCL_SOCKET_IFNAME={value!r}: {raw!r} is not an interface name or prefix")
        items.append(name)
    if not items:
        raise ValueError(f"NCCL_SOCKET_IFNAME={value!r} names no interface")
    return NcclIfname(exclude, exact, items)


def nccl_auto_candidates(ifaces: list[Interface]) -> list[str]:
    """Interfaces NCCL's auto-detection would consider, in its order of preference (first is the
    bootstrap interface): ib* first; else anything but docker*/lo; else docker*; else lo."""
    with_addr = [i.name for i in ifaces if i.up and i.routable_ips]
    for pick in (lambda n: n.startswith("ib"), lambda n: not n.startswith(("docker", "lo")),
                 lambda n: n.startswith("docker"), lambda n: n.startswith("lo")):
        chosen = [n for n in with_addr if pick(n)]
        if chosen:
            return chosen
    return []


_FROM_ENV: Any = object()


def check_socket_ifname(env: Mapping[str, str] | None = None, ifaces: list[Interface] | None = None,
                        route: dict[str, Any] | None = _FROM_ENV) -> list[Check]:
    """One check per variable (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) from `env` (default
    os.environ): its grammar, the interfaces it selects on this host, and whether it selects the
    interface the route to the master leaves by (`route` from `route_to`; by default the route to
    env's MASTER_ADDR when it is set; None: no route known)."""
    env = os.environ if env is None else env
    ifaces = interfaces() if ifaces is None else ifaces
    if route is _FROM_ENV:
        ips = resolve(env["MASTER_ADDR"]) if env.get("MASTER_ADDR") else []
        route = route_to(ips[0], ifaces) if ips else None
    return [_check_gloo(env.get("GLOO_SOCKET_IFNAME"), ifaces, route),
            _check_nccl(env.get("NCCL_SOCKET_IFNAME"), ifaces, route)]


def _route_note(route: dict[str, Any] | None) -> tuple[str | None, bool]:
    """(interface that reaches the master, whether the master is off this host's loopback)."""
    if not route or not route.get("dev"):
        return None, False
    return route["dev"], not is_loopback(route["addr"])


def _check_gloo(value: str | None, ifaces: list[Interface], route: dict[str, Any] | None) -> Check:
    name = "doctor.net GLOO_SOCKET_IFNAME"
    by_name = {i.name: i for i in ifaces}
    master_dev, remote = _route_note(route)
    fix = (
        f"export GLOO_SOCKET_IFNAME={master_dev}"
        if master_dev
        else "set it to the interface `ip route get $MASTER_ADDR` names"
    )
    if value is None or value == "":
        return Check(
            name,
            Status.OK,
            "not set: Gloo binds the address the host name resolves to (see doctor.net hostname)",
            details={"value": None},
        )
    try:
        names = parse_gloo_ifname(value)
    except ValueError as e:
        return Check(
            name, Status.FAIL, str(e), details={"value": value}, hint=fix, where={"variable": "GLOO_SOCKET_IFNAME"}
        )
    where = {"variable": "GLOO_SOCKET_IFNAME", "value": value}
    missing = [n for n in names if n not in by_name]
    if missing:
        return Check(name, Status.FAIL, f"GLOO_SOCKET_IFNAME={value}: no interface {', '.join(missing)} on this host "
                     f"(there are {', '.join(by_name)}); Gloo fails with 'Unable to find address'",
                     details={"value": value, "missing": missing}, hint=fix, where=where)
    no_addr = [n for n in names if not by_name[n].ips]
    if no_addr:
        return Check(
            name,
            Status.FAIL,
            f"GLOO_SOCKET_IFNAME={value}: {', '.join(no_addr)} has no address; Gloo fails "
            f"with 'Unable to find address'",
            details={"value": value, "no_address": no_addr},
            hint=fix,
            where=where,
        )
    down = [n for n in names if not by_name[n].up]
    if down:
        return Check(
            name,
            Status.FAIL,
            f"GLOO_SOCKET_IFNAME={value}: {', '.join(down)} is down",
            details={"value": value, "down": down},
            hint=f"bring it up (ip link set {down[0]} up) or {fix}",
            where=where,
        )
    if remote and master_dev not in names:
        loop = [n for n in names if by_name[n].loopback]
        what = f"{', '.join(loop)} is loopback and cannot reach other hosts" if loop else \
            f"the route to MASTER_ADDR {route['addr']} leaves by {master_dev}, not {', '.join(names)}"
        return Check(name, Status.FAIL if loop else Status.WARN, f"GLOO_SOCKET_IFNAME={value}: {what}",
                     details={"value": value, "route_dev": master_dev}, hint=fix, where=where)
    return Check(
        name,
        Status.OK,
        f"GLOO_SOCKET_IFNAME={value}: Gloo binds {', '.join(f'{n} ({by_name[n].ips[0]})' for n in names)}",
        details={"value": value, "selected": names},
        where=where,
    )


def _check_nccl(value: str | None, ifaces: list[Interface], route: dict[str, Any] | None) -> Check:
    name = "doctor.net NCCL_SOCKET_IFNAME"
    master_dev, remote = _route_note(route)
    fix = (
        f"export NCCL_SOCKET_IFNAME=={master_dev}"
        if master_dev
        else "set it to the interface `ip route get $MASTER_ADDR` names"
    )
    if value is None or value == "":
        auto = nccl_auto_candidates(ifaces)
        return Check(
            name,
            Status.OK,
            f"not set: NCCL auto-detects ({', '.join(auto) or 'nothing'}; see doctor.net decoys)",
            details={"value": None, "auto": auto},
        )
    where = {"variable": "NCCL_SOCKET_IFNAME", "value": value}
    try:
        spec = parse_nccl_ifname(value)
    except ValueError as e:
        return Check(name, Status.FAIL, str(e), details={"value": value}, hint=fix, where=where)
    usable = [i for i in ifaces if i.up and i.routable_ips]
    selected = [i.name for i in usable if spec.matches(i.name)]
    details = {"value": value, "exclude": spec.exclude, "exact": spec.exact, "items": spec.items, "selected": selected}
    if not selected:
        return Check(
            name,
            Status.FAIL,
            f"NCCL_SOCKET_IFNAME={value} selects no usable interface (up, with an address) "
            f"among {', '.join(i.name for i in usable) or 'none'}; NCCL fails with 'no socket interface found'",
            details=details,
            hint=fix,
            where=where,
        )
    if remote and master_dev not in selected:
        return Check(
            name,
            Status.WARN,
            f"NCCL_SOCKET_IFNAME={value} selects {', '.join(selected)}, not {master_dev}, "
            f"the interface the route to MASTER_ADDR {route['addr']} leaves by",
            details=details,
            hint=fix,
            where=where,
        )
    if remote and (stray := [n for n in selected if n != master_dev and (n == "lo" or is_decoy_name(n))]):
        return Check(
            name,
            Status.WARN,
            f"NCCL_SOCKET_IFNAME={value} also selects {', '.join(stray)}; NCCL may use it for traffic between hosts",
            details=details,
            hint=fix,
            where=where,
        )
    return Check(
        name, Status.OK, f"NCCL_SOCKET_IFNAME={value} selects {', '.join(selected)}", details=details, where=where
    )


# -- host checks ------------------------------------------------------------------------------


def check_hostname(ifaces: list[Interface], hostname: str | None = None, route: dict[str, Any] | None = None) -> Check:
    """The host name must resolve to an address of this host that other hosts can reach: Gloo
    and torchrun's c10d rendezvous advertise it. With the route to MASTER_ADDR known (`route`,
    from check_master_route), an address on another interface than the one that route leaves by
    is the "wrong interface, hangs at init" case."""
    hostname = hostname or socket.gethostname()
    addrs = resolve(hostname)
    name, where = "doctor.net hostname", {"hostname": hostname}
    hint_loop = ("multi-node rendezvous will advertise 127.0.0.1: set --local-addr (torchrun) and GLOO_SOCKET_IFNAME, "
                 f"or map {hostname} to this host's network address in /etc/hosts")
    if not addrs:
        return Check(name, Status.WARN, f"host name {hostname!r} does not resolve; Gloo falls back to 127.0.0.1",
                     details={"addresses": []}, hint=hint_loop, where=where)
    if all(is_loopback(a) for a in addrs):
        return Check(name, Status.WARN, f"host name {hostname!r} resolves to loopback ({', '.join(addrs)})",
                     details={"addresses": addrs}, hint=hint_loop, where=where)
    held = held_by(ifaces)
    foreign = [a for a in addrs if not is_loopback(a) and interface_of(a, held) is None]
    if foreign and len(foreign) == len([a for a in addrs if not is_loopback(a)]):
        return Check(
            name,
            Status.WARN,
            f"host name {hostname!r} resolves to {', '.join(foreign)}, which no interface here holds; "
            "Gloo falls back to 127.0.0.1",
            details={"addresses": addrs},
            hint=hint_loop,
            where=where,
        )
    first = next(a for a in addrs if not is_loopback(a) and interface_of(a, held))
    dev = (route or {}).get("dev")
    if dev and dev != "lo" and interface_of(first, held) != dev:
        return Check(
            name,
            Status.WARN,
            f"host name {hostname!r} resolves to {first} ({interface_of(first, held)}), but the route "
            f"to MASTER_ADDR leaves by {dev}: with GLOO_SOCKET_IFNAME unset Gloo advertises {first}, which the "
            "other ranks may not reach (init hangs)",
            details={"addresses": addrs, "route_dev": dev},
            hint=f"export GLOO_SOCKET_IFNAME={dev}, or map {hostname} to {dev}'s address in /etc/hosts",
            where=where,
        )
    return Check(name, Status.OK, f"host name {hostname!r} resolves to {first} ({interface_of(first, held)})",
                 details={"addresses": addrs}, where=where)


def check_master_route(master_addr: str, ifaces: list[Interface]) -> tuple[Check, dict[str, Any] | None]:
    """Resolve MASTER_ADDR and find the interface the route to it leaves by."""
    name, where = "doctor.net route", {"master_addr": master_addr}
    ips = resolve(master_addr)
    if not ips:
        return Check(name, Status.FAIL, f"MASTER_ADDR {master_addr!r} does not resolve", where=where,
                     hint="use an IP address, or fix DNS / /etc/hosts on every node"), None
    route = route_to(ips[0], ifaces)
    if route is None or not route.get("dev"):
        return Check(name, Status.FAIL, f"no route to MASTER_ADDR {master_addr} ({ips[0]})", details={"addresses": ips},
                     where=where, hint="check the address, the interface's state and `ip route` on this node"), None
    by_name = {i.name: i for i in ifaces}
    dev = by_name.get(route["dev"])
    via = f" via {route['gateway']}" if route.get("gateway") else ""
    what = f"MASTER_ADDR {master_addr}" + (f" ({ips[0]})" if ips[0] != master_addr else "")
    details = {"addresses": ips, "route": route}
    if dev is not None and not dev.up:
        return Check(
            name,
            Status.FAIL,
            f"{what} is routed through {dev.name}, which is down",
            details=details,
            where=where,
            hint=f"ip link set {dev.name} up, or fix the route",
        ), route
    local = " (an address of this host)" if route["local"] else ""
    return Check(name, Status.OK, f"{what}{local} is reached through {route['dev']}{via}"
                 + (f", source {route['src']}" if route.get("src") else ""), details=details, where=where), route


def check_decoys(ifaces: list[Interface], route: dict[str, Any] | None, env: Mapping[str, str]) -> Check:
    """Interfaces that auto-detection may pick but that do not lead to the master: docker0,
    virbr*, tun*, wg*, veth* and any other interface that is up with an address but is not the
    one the route to MASTER_ADDR leaves by."""
    name = "doctor.net decoys"
    master_dev, remote = _route_note(route)
    others = [i for i in ifaces if i.up and i.routable_ips and not i.loopback and i.name != master_dev]
    details = {"decoys": [i.name for i in others], "route_dev": master_dev, "nccl_auto": nccl_auto_candidates(ifaces)}
    if not others:
        return Check(
            name,
            Status.OK,
            f"no interface but {master_dev or 'the route interface'} is up with an address",
            details=details,
        )
    listing = ", ".join(f"{i.name} ({i.routable_ips[0]})" for i in others)
    if not remote:
        return Check(name, Status.OK, f"MASTER_ADDR is on this host's loopback: a single-host job; {listing} "
                     f"{'matter' if len(others) > 1 else 'matters'} only once other hosts join", details=details)
    gloo, nccl = env.get("GLOO_SOCKET_IFNAME"), env.get("NCCL_SOCKET_IFNAME")
    pinned_gloo = bool(gloo) and _names_or_none(parse_gloo_ifname, gloo) == [master_dev]
    pinned_nccl = bool(nccl) and _selects_only(nccl, ifaces, master_dev)
    if pinned_gloo and pinned_nccl:
        return Check(name, Status.OK, f"{listing} could be picked by auto-detection, but GLOO_SOCKET_IFNAME and "
                     f"NCCL_SOCKET_IFNAME pin {master_dev}", details=details)
    named = [i.name for i in others if is_decoy_name(i.name)]
    auto = details["nccl_auto"]
    nccl_pick = (
        f"; NCCL's auto-detection would start with {auto[0]}"
        if auto and auto[0] != master_dev and not pinned_nccl
        else ""
    )
    unpinned = [v for v, ok in (("GLOO_SOCKET_IFNAME", pinned_gloo), ("NCCL_SOCKET_IFNAME", pinned_nccl)) if not ok]
    return Check(
        name,
        Status.WARN,
        f"{listing} {'are' if len(others) > 1 else 'is'} up with an address but not on the route "
        f"to MASTER_ADDR (which leaves by {master_dev}){nccl_pick}"
        + (
            f"; {', '.join(named)} {'look' if len(named) > 1 else 'looks'} like a container/VPN/bridge link"
            if named
            else ""
        ),
        details=details | {"unpinned": unpinned},
        hint=f"export GLOO_SOCKET_IFNAME={master_dev} NCCL_SOCKET_IFNAME=={master_dev} on every node "
        "(with that node's interface name); NCCL_DEBUG=INFO shows what NCCL chose",
        where={"interfaces": [i.name for i in others]},
    )


def _names_or_none(parse, value: str) -> list[str] | None:
    try:
        return parse(value)
    except ValueError:
        return None


def _selects_only(value: str, ifaces: list[Interface], dev: str | None) -> bool:
    try:
        spec = parse_nccl_ifname(value)
    except ValueError:
        return False
    return [i.name for i in ifaces if i.up and i.routable_ips and spec.matches(i.name)] == [dev]


def check_port(addr: str, port: int, listening_expected: bool, timeout_s: float = 3.0) -> Check:
    """TCP connect to addr:port. Refused means nothing listens there: fine before rank 0 has
    started (a standalone doctor), a failure once the job's store should be up (under a launcher).
    No answer at all means a firewall drops the packets."""
    name, where = "doctor.net port", {"addr": addr, "port": port}
    ips = resolve(addr)
    if not ips:
        return Check(name, Status.FAIL, f"{addr} does not resolve", where=where, hint="fix MASTER_ADDR")
    with socket.socket(family_of(ips[0]), socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect((ips[0], port))
            return Check(name, Status.OK, f"{addr}:{port} accepts TCP connections", where=where)
        except TimeoutError:
            return Check(
                name,
                Status.FAIL,
                f"{addr}:{port}: no answer within {timeout_s:g}s (packets dropped: a firewall?)",
                where=where,
                hint=f"open TCP {port} and the ephemeral ports between the nodes "
                "(e.g. ufw allow from <cluster subnet>)",
            )
        except OSError as e:
            if e.errno == errno.ECONNREFUSED:
                status = Status.FAIL if listening_expected else Status.WARN
                return Check(name, status, f"{addr}:{port} refused the connection: nothing listens there"
                             + ("" if listening_expected else " yet"), where=where,
                             hint="start rank 0 first (its store listens on MASTER_PORT), or check MASTER_PORT and the "
                                  "firewall on the master")
            return Check(name, Status.FAIL, f"{addr}:{port}: {e.strerror or e}", where=where,
                         hint="check the route and firewall between this node and the master")
