"""Pre-flight of a multi-node worker: will the address Gloo advertises be reachable?

The failure this catches hangs at init with no error on real clusters: Gloo (and with it every
distval job, whose bookkeeping always runs over a Gloo group) picks the address it advertises to
its peers by itself, and picks one they cannot reach. How Gloo picks on Linux (torch's
ProcessGroupGloo `createDefaultDevice`, gloo `tcp::CreateDevice`):

  * GLOO_SOCKET_IFNAME=eth0[,eth1]: the first IP address of each named interface;
  * otherwise: `gethostname()`, resolved with getaddrinfo (/etc/hosts first), and the first
    resolved address this process can bind to; if none can be bound, 127.0.0.1 (loopback).

So a hostname that resolves to docker0's address, a VPN's, the management network's or Debian's
127.0.1.1 makes Gloo advertise it, every peer's connect to it goes unanswered, and
init_process_group waits out its timeout (minutes). The pre-flight works out that address the
same way, then connects *from* it to MASTER_ADDR:MASTER_PORT (the rendezvous store, already
listening under torchrun): an answer, even a refusal, proves the path both ways; silence or "no
route" within a few seconds becomes one ERROR line naming the interface and the fix
(GLOO_SOCKET_IFNAME=<the interface the route to MASTER_ADDR leaves by>).

Only multi-node jobs are checked (a world whose ranks all run on this host talks over any local
address). DISTVAL_NETCHECK=0 turns the check off.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import sys
from dataclasses import dataclass
from typing import Mapping

from distval import envvars
from distval.netaddr import (
    family_of,
    hostname_address,
    interface_address,
    interface_names,
    interface_of,
    is_loopback,
    route_interface,
)
from distval.netaddr import ipv4_of as ipv4_of  # re-exported: part of this module's interface
from distval.netaddr import route_source as route_source  # re-exported likewise
from distval.results import CannotRun

_UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL, errno.ETIMEDOUT, errno.EINVAL}


class NetworkPreflightError(CannotRun):
    """The address this rank would advertise cannot be reached: the job would hang at init."""


@dataclass(frozen=True)
class Advertised:
    address: str
    interface: str | None
    why: str  # how Gloo arrives at it, in words


def gloo_address(env: Mapping[str, str], hostname: str | None = None) -> list[Advertised]:
    """What Gloo will advertise, one entry per device it creates (see the module docstring).
    NetworkPreflightError when GLOO_SOCKET_IFNAME names an interface that is missing or has no
    address (Gloo would fail with a less helpful message)."""
    names = [n.strip() for n in env.get("GLOO_SOCKET_IFNAME", "").split(",") if n.strip()]
    if names:
        out = []
        for name in names:
            if name not in interface_names():
                raise NetworkPreflightError(f"GLOO_SOCKET_IFNAME={env['GLOO_SOCKET_IFNAME']}: no interface {name!r} on "
                                            f"{socket.gethostname()} (it has {', '.join(interface_names())})")
            address = interface_address(name)
            if address is None:
                raise NetworkPreflightError(f"GLOO_SOCKET_IFNAME={env['GLOO_SOCKET_IFNAME']}: interface {name} on "
                                            f"{socket.gethostname()} has no IP address")
            out.append(Advertised(address, name, f"GLOO_SOCKET_IFNAME={env['GLOO_SOCKET_IFNAME']}"))
        return out
    hostname = hostname or socket.gethostname()
    address = hostname_address(hostname)
    if address is not None:
        return [
            Advertised(address, interface_of(address), f"GLOO_SOCKET_IFNAME unset; hostname {hostname} resolves to it")
        ]
    return [
        Advertised(
            "127.0.0.1",
            "lo",
            f"GLOO_SOCKET_IFNAME unset; hostname {hostname} resolves to no local address, so loopback",
        )
    ]


# -- the check ---------------------------------------------------------------------------------------


def multi_node(env: Mapping[str, str]) -> bool:
    """True when some ranks run on other hosts (torchrun: LOCAL_WORLD_SIZE < WORLD_SIZE; Slurm:
    more than one node in the step)."""
    world = int(env.get("WORLD_SIZE", "1") or 1)
    if "LOCAL_WORLD_SIZE" in env:
        return int(env["LOCAL_WORLD_SIZE"]) < world
    if "SLURM_STEP_NUM_NODES" in env or "SLURM_NNODES" in env:
        return int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or 1) > 1
    return world > 1  # no way to tell: check


def reachable(source: str, address: str, port: int, timeout_s: float) -> tuple[bool, str]:
    """Connect from `source` to address:port. (True, how) when anything answers (a refusal proves
    the path both ways), (False, why) on silence or no route."""
    family = family_of(address)
    if ipaddress.ip_address(source).version != ipaddress.ip_address(address).version:
        return True, "different address families: not probed"
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.bind((source, 0))
            s.connect((address, port))
            return True, "connected"
        except ConnectionRefusedError:
            return True, "refused (the path works)"
        except socket.timeout:
            return False, f"no answer within {timeout_s:g}s"
        except OSError as e:
            if e.errno in _UNREACHABLE:
                return False, os.strerror(e.errno).lower()
            return True, f"{os.strerror(e.errno or 0).lower()} (not a routing failure)"


def preflight(env: Mapping[str, str] | None = None, timeout_s: float = 5.0, warn=None) -> None:
    """Raise NetworkPreflightError (exit 3, one line) when the address this rank will advertise
    cannot reach MASTER_ADDR; print a warning line when it sits on another interface than the
    route to MASTER_ADDR but answers (it may still be unreachable from other peers)."""
    env = dict(os.environ if env is None else env)
    if env.get(envvars.NETCHECK.name, "1").lower() in ("0", "off", "no", "false") or not multi_node(env):
        return
    master, port = env.get("MASTER_ADDR"), int(env.get("MASTER_PORT", "0") or 0)
    if not master or not port:
        return
    where = socket.gethostname()
    try:
        master_ip = socket.getaddrinfo(master, port, type=socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as e:
        raise NetworkPreflightError(f"{where}: MASTER_ADDR={master} does not resolve ({e.strerror}); "
                                    f"set MASTER_ADDR to an address of the first node") from None
    source, route_if = route_interface(master_ip, port)
    fix = (
        f"set GLOO_SOCKET_IFNAME={route_if}"
        if route_if
        else "set GLOO_SOCKET_IFNAME to the interface that reaches MASTER_ADDR"
    )
    for adv in gloo_address(env):
        label = f"{adv.address} on interface {adv.interface or '?'}"
        if is_loopback(adv.address) and not is_loopback(master_ip):
            raise NetworkPreflightError(
                f"{where}: Gloo will advertise {label} ({adv.why}), which no other host can "
                f"reach; init would hang: {fix} (route to MASTER_ADDR {master}) or fix /etc/hosts"
            )
        ok, how = reachable(adv.address, master_ip, port, timeout_s)
        if not ok:
            raise NetworkPreflightError(
                f"{where}: Gloo will advertise {label} ({adv.why}), but MASTER_ADDR {master}:{port} is unreachable "
                f"from it ({how}); init would hang: {fix} (the route to MASTER_ADDR leaves by {route_if or '?'}"
                f"{' ' + source if source else ''})")
        if route_if and adv.interface and adv.interface != route_if and route_if != "lo":
            (warn or _warn)(
                f"distval: warning: rank {env.get('RANK', '?')} on {where}: "
                f"Gloo will advertise {label} ({adv.why}) but MASTER_ADDR "
                f"{master} is reached via {route_if}; if ranks hang at init, {fix}"
            )


def _warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
