"""This host's addresses as the kernel and Gloo see them, without a subprocess: interface names,
their IPv4 and IPv6 addresses, which interface holds an address, which source address the kernel
picks for a destination and the interface it leaves by, what a host name resolves to, and which
address Gloo binds: one function per fact.

Shared by the worker's pre-flight (`distval.launch.netcheck`, which runs in every rank and so must stay
cheap) and `distval doctor` (`distval.doctor.net`, which prefers iproute2 and falls back to these),
so that both read the host the same way. Torch-free and typer-free.

How Gloo picks its address on Linux (torch's ProcessGroupGloo `createDefaultDevice`, gloo
`tcp::CreateDevice`): with GLOO_SOCKET_IFNAME, the first IP address of each named interface;
without, the first address `gethostname()` resolves to (getaddrinfo's order) that the process can
bind, and 127.0.0.1 when none can be bound.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Iterable, Mapping

_SIOCGIFADDR, _SIOCGIFNETMASK = 0x8915, 0x891B
_IF_INET6 = "/proc/net/if_inet6"


# -- interfaces and their addresses -----------------------------------------------------------


def interface_names() -> list[str]:
    """The names of this network namespace's interfaces, in kernel index order."""
    return [name for _, name in socket.if_nameindex()]


def _ifreq_ipv4(name: str, request: int) -> str | None:
    """The IPv4 address an SIOCGIF* ioctl returns for interface `name`; None when it fails (no such
    interface, or no IPv4 address on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), request, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(raw[20:24])


def ipv4_of(name: str) -> str | None:
    """The primary IPv4 address of an interface (None when it has none)."""
    return _ifreq_ipv4(name, _SIOCGIFADDR)


def ipv4_with_prefix(name: str) -> str | None:
    """'addr/prefixlen' of an interface's primary IPv4 address, from its address and netmask;
    None when it has none."""
    addr = ipv4_of(name)
    mask = _ifreq_ipv4(name, _SIOCGIFNETMASK) if addr else None
    if addr is None or mask is None:
        return None
    return f"{addr}/{ipaddress.IPv4Network(f'0.0.0.0/{mask}').prefixlen}"


def ipv6_addresses() -> dict[str, list[str]]:
    """Every interface's IPv6 addresses as 'addr/prefixlen', by interface name, from
    /proc/net/if_inet6 ({} on a host without IPv6; what was read before an unreadable line is kept)."""
    out: dict[str, list[str]] = {}
    with contextlib.suppress(OSError, ValueError):
        with open(_IF_INET6) as f:
            for line in f:
                fields = line.split()
                if len(fields) == 6:
                    address = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
                    out.setdefault(fields[5], []).append(f"{address}/{int(fields[2], 16)}")
    return out


def ipv6_of(name: str) -> list[str]:
    """The interface's IPv6 addresses (without prefix lengths)."""
    return [a.split("/")[0] for a in ipv6_addresses().get(name, [])]


def interface_address(name: str) -> str | None:
    """The address Gloo binds for an interface named in GLOO_SOCKET_IFNAME: its IPv4 address,
    else its first IPv6 address; None when it has neither."""
    return ipv4_of(name) or next(iter(ipv6_of(name)), None)


def interface_of(address: str, held: Mapping[str, Iterable[str]] | None = None) -> str | None:
    """The interface that holds `address` (loopback addresses: lo); None when none does. `held`:
    {interface: its addresses} to look in (doctor's list, from iproute2); by default this host's,
    read from the kernel."""
    if is_loopback(address):
        return "lo"
    if held is not None:
        return next((name for name, ips in held.items() if address in ips), None)
    ip = ipaddress.ip_address(address)
    for name in interface_names():
        if (ip.version == 4 and ipv4_of(name) == address) or (ip.version == 6 and address in ipv6_of(name)):
            return name
    return None


# -- addresses --------------------------------------------------------------------------------


def is_loopback(addr: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback; False for anything that is not an IP
    address (a host name)."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def family_of(addr: str) -> socket.AddressFamily:
    """The socket family for an address: AF_INET6 for an IPv6 literal, else AF_INET."""
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def route_source(address: str, port: int = 9) -> str | None:
    """The source address the kernel picks to reach `address` (connecting a UDP socket sends
    nothing); None when there is no route."""
    with socket.socket(family_of(address), socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, port))
        except OSError:
            return None
        return s.getsockname()[0]


def route_interface(address: str, port: int = 9, held: Mapping[str, Iterable[str]] | None = None,
                    ) -> tuple[str | None, str | None]:
    """(source, interface) of the route to `address`: the source address the kernel picks and the
    interface holding it, the one packets leave by (`held` as for `interface_of`); (None, None)
    when there is no route."""
    source = route_source(address, port)
    return source, interface_of(source, held) if source else None


def resolve(host: str, ipv4_first: bool = True) -> list[str]:
    """The addresses `host` resolves to, without duplicates ([] if it does not). IPv4 first by
    default; ipv4_first=False keeps getaddrinfo's order, the one Gloo tries them in."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return []
    if ipv4_first:
        infos = sorted(infos, key=lambda i: i[0] != socket.AF_INET)
    addrs: list[str] = []
    for *_, sockaddr in infos:
        if sockaddr[0] not in addrs:
            addrs.append(sockaddr[0])
    return addrs


def hostname_address(hostname: str) -> str | None:
    """The address Gloo binds with GLOO_SOCKET_IFNAME unset: the first one `hostname` resolves to
    that this process can bind (a loopback address can be); None when none can (Gloo then uses
    127.0.0.1)."""
    for address in resolve(hostname, ipv4_first=False):
        with socket.socket(family_of(address), socket.SOCK_STREAM) as s:
            try:
                s.bind((address, 0))
            except OSError:
                continue
        return address
    return None
