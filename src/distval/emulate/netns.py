"""N emulated nodes on one Linux host: network namespaces, veth pairs, a bridge, tc shaping.

Layout of a cluster owned by process <pid> (names carry the pid, so a leftover of a crashed run is
recognisable and its owner can be checked):

    dv-<pid>-sw     the switch: a namespace holding bridge br0 and one port n<i> per node
    dv-<pid>-n<i>   node i: eth0 = 10.77.0.<i+1>/24, the peer of the switch's n<i>
                    (--decoy-nic: also decoy0 = 10.78.0.<i+1>/24, a veth whose peer decoy0p sits
                    in the same namespace with no address: packets sent there go nowhere)

Every node gets its own /etc/hosts view (`ip netns exec` bind-mounts /etc/netns/<ns>/hosts over
/etc/hosts) naming every node, and runs in its own UTS namespace with hostname dv-<pid>-n<i>, so
`socket.gethostname()` and hostname resolution behave as on separate machines. With a decoy NIC
the names resolve to the decoy addresses: Gloo, which without GLOO_SOCKET_IFNAME binds the first
address its hostname resolves to, then advertises an address no peer can reach, the "wrong
interface, hangs at init" failure of real clusters (docker0, a VPN tun, 127.0.1.1).

Shaping (tc-tbf(8)): a NIC limits both directions, so node i's rate is applied to its egress
(eth0) and to the switch port's egress towards it (its ingress). Rates may differ per node (one
slow link): traffic between two nodes then runs at the slower one's rate, as through a switch.
Latency: tbf has no delay; when the kernel has sch_netem, a netem qdisc with the one-way delay is
put on eth0 with the tbf as its child, otherwise latency is not emulated and the caller says so
(`netem_available`).

CPU (optional, per node): a cgroup dv-<pid>-n<i> with a CFS quota that node i's torchrun joins
(cgroup.py); created and removed with the namespaces, and cleaned up with them after a crash.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from distval.emulate import cgroup
from distval.emulate.rates import format_latency, format_rate
from distval.results import CannotRun

PREFIX = "dv-"
SUBNET = "10.77.0"
DECOY_SUBNET = "10.78.0"
MAX_NODES = 200
NETNS_ETC = Path("/etc/netns")
_NAME = re.compile(r"^dv-(\d+)-[a-z0-9]+$")  # dv-<owner pid>-sw, -n<i>, -probe, ...


@dataclass(frozen=True)
class Topology:
    """The cluster the flags describe. `rates_bps` (bit/s) and `cpu_cores` hold one value per
    node, node i's at index i; one value given for all nodes (a number or a 1-tuple) is spread to
    every node here, so nothing downstream asks which form the user chose. `cpu_cores` empty:
    no CPU limit."""

    num_nodes: int
    nproc_per_node: int
    rates_bps: tuple[int, ...] | int
    latency_s: float = 0.0
    decoy: bool = False
    cpu_cores: tuple[float, ...] | float = ()

    def __post_init__(self) -> None:
        if not 1 <= self.num_nodes <= MAX_NODES:
            raise ValueError(f"--nodes must be between 1 and {MAX_NODES} (got {self.num_nodes})")
        if self.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node must be at least 1 (got {self.nproc_per_node})")
        rates = self._per_node(self.rates_bps, "--rate", "rates")
        if any(r <= 0 for r in rates):
            raise ValueError(f"--rate must be positive (got {','.join(map(str, rates))} bit/s)")
        cores = self._per_node(self.cpu_cores, "--cpu", "CPU limits") if self.cpu_cores != () else ()
        if any(c <= 0 for c in cores):
            raise ValueError(f"--cpu must be a positive number of cores per node (got {','.join(map(str, cores))})")
        object.__setattr__(self, "rates_bps", rates)  # frozen: the normalised form, set once here
        object.__setattr__(self, "cpu_cores", cores)

    def _per_node(self, value: tuple | int | float, flag: str, what: str) -> tuple:
        values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
        if len(values) == 1:
            return values * self.num_nodes
        if len(values) != self.num_nodes:
            raise ValueError(f"{flag} gives {len(values)} {what} but --nodes is {self.num_nodes}: give one value "
                             f"for every node or a comma list with one per node")
        return values

    def rate_bps(self, node: int) -> int:
        """Node i's link rate (bit/s, each direction)."""
        return self.rates_bps[node]

    def burst_bytes(self, node: int) -> int:
        return burst_bytes(self.rates_bps[node])

    def cpu_limit(self, node: int) -> float | None:
        """Node i's CPU limit in cores, None when it has none."""
        return self.cpu_cores[node] if self.cpu_cores else None

    def rate_text(self) -> str:
        """'1gbit', or '1gbit,1gbit,250mbit,1gbit' when the nodes' rates differ."""
        return ",".join(format_rate(r) for r in _one_or_all(self.rates_bps))

    def cpu_text(self) -> str:
        return ",".join(f"{c:g}" for c in _one_or_all(self.cpu_cores)) if self.cpu_cores else "unlimited"

    def meta(self, latency_emulated: bool) -> dict:
        """The report's meta.emulated. A per-node quantity is one value when every node has the
        same, else a list indexed by node (`rate` then the comma list the flag takes)."""
        bursts = tuple(self.burst_bytes(i) for i in range(self.num_nodes))
        return {"nodes": self.num_nodes, "nproc_per_node": self.nproc_per_node, "rate": self.rate_text(),
                "rate_bits_per_s": _scalar_or_list(self.rates_bps), "latency": format_latency(self.latency_s),
                "latency_s": self.latency_s, "latency_emulated": latency_emulated, "decoy_nic": self.decoy,
                "burst_bytes": _scalar_or_list(bursts), "qdisc": "netem+tbf" if latency_emulated else "tbf",
                "cpu_cores": _scalar_or_list(self.cpu_cores) if self.cpu_cores else None}


def _one_or_all(values: tuple) -> tuple:
    return values[:1] if len(set(values)) == 1 else values


def _scalar_or_list(values: tuple) -> object:
    return values[0] if len(set(values)) == 1 else list(values)


def burst_bytes(rate_bps: float) -> int:
    """tbf's bucket: 1 ms of traffic at the rate, at least 2 full 64 KiB GSO packets. Smaller
    buckets make tbf split every GSO packet (CPU) and lean on timer precision; larger ones let each
    message start with a free burst at veth speed, which inflates the bandwidth of small messages
    (a 1 MiB message over 1 gbit gains 10% from a 125 kB bucket). 1 ms at 1 gbit is 125 kB."""
    return int(max(rate_bps / 8 * 1e-3, 2 * 65536))


def queue_limit_bytes(rate_bps: float) -> int:
    """tbf's queue: 50 ms at the rate (never below 1 MB), deep enough that TCP's window over the
    shaped link does not overflow it and turn shaping into loss."""
    return int(max(rate_bps / 8 * 0.05, 1 << 20))


def shaping_commands(ns: str, dev: str, topo: Topology, node: int, with_delay: bool) -> list[list[str]]:
    """tc commands that shape `dev` in `ns`, one end of node `node`'s link, at that node's rate
    (root qdisc replaced, so re-running is harmless)."""
    rate = topo.rate_bps(node)
    tbf = ["tbf", "rate", f"{rate}bit", "burst", str(burst_bytes(rate)), "limit", str(queue_limit_bytes(rate))]
    tc = ["tc", "-n", ns, "qdisc", "replace", "dev", dev]
    if with_delay and topo.latency_s > 0:
        return [[*tc, "root", "handle", "1:", "netem", "delay", f"{topo.latency_s * 1e6:.0f}us", "limit", "100000"],
                ["tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:", "handle", "10:", *tbf]]
    return [[*tc, "root", *tbf]]


# -- environment ----------------------------------------------------------------------------------


def require_environment() -> None:
    """CannotRun (exit 3) unless this process can build namespaces: root, iproute2, unshare."""
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        raise CannotRun(f"distval emulate needs iproute2 and util-linux ({', '.join(missing)} not found on PATH); "
                        f"install them (apt-get install iproute2 util-linux)")
    if os.geteuid() != 0:
        raise CannotRun("distval emulate needs root to create network namespaces, veth pairs and tc qdiscs; "
                        "run it as root (sudo -E distval emulate ...)")


def netem_available() -> bool:
    """True when the kernel has sch_netem (probed on a throwaway namespace's loopback)."""
    ns = f"{PREFIX}{os.getpid()}-probe"
    try:
        _run(["ip", "netns", "add", ns])
        probe = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us"],
                               capture_output=True, text=True)
        return probe.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _run(cmd: list[str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        raise CannotRun(f"`{' '.join(cmd)}` failed: {lines[-1] if lines else f'exit code {res.returncode}'}")
    return res.stdout


# -- leftovers ------------------------------------------------------------------------------------


def list_namespaces() -> list[str]:
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_gone(name: str) -> bool:
    m = _NAME.match(name)
    return bool(m) and not _alive(int(m.group(1)))


def leftovers() -> list[str]:
    """Namespaces named like ours whose owning process is gone: what a crashed run left."""
    return [name for name in list_namespaces() if _owner_gone(name)]


def leftover_cgroups() -> list[Path]:
    """The same for CPU cgroups (none where no cgroup cpu controller is mounted)."""
    ctl = cgroup.find_controller()
    return [ctl.root / name for name in cgroup.children(ctl, PREFIX) if _owner_gone(name)] if ctl else []


def remove_namespace(name: str) -> None:
    """Kill what still runs in the namespace, delete it (its veths and qdiscs go with it) and its
    /etc/netns folder. Never raises: cleaning must get as far as it can."""
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            continue
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def clean_leftovers() -> list[str]:
    """Remove what crashed runs left: their namespaces, then their cgroups (paths)."""
    found = leftovers()
    for name in found:
        remove_namespace(name)
    groups = leftover_cgroups()
    for path in groups:
        cgroup.remove(path)
    return found + [str(p) for p in groups]


# -- the cluster ----------------------------------------------------------------------------------


@dataclass
class Cluster:
    """Create with `create()`, always `destroy()` (idempotent); `node_argv` wraps a command so it
    runs on node i, which joins `cgroup_of(i)` when that is not None (agent.py does)."""

    topo: Topology
    owner_pid: int = field(default_factory=os.getpid)
    with_delay: bool = False
    cpu: cgroup.CpuController | None = None  # required when topo.cpu_cores is set
    created: list[str] = field(default_factory=list)
    cgroups: list[Path] = field(default_factory=list)

    @property
    def tag(self) -> str:
        return f"{PREFIX}{self.owner_pid}"

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def node(self, i: int) -> str:
        return f"{self.tag}-n{i}"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    @staticmethod
    def decoy_address(i: int) -> str:
        return f"{DECOY_SUBNET}.{i + 1}"

    def cgroup_of(self, i: int) -> Path | None:
        """Node i's CPU cgroup (named like its namespace), None without a limit."""
        if self.topo.cpu_limit(i) is None:
            return None
        assert self.cpu is not None, "a Topology with cpu_cores needs Cluster(cpu=...)"
        return self.cpu.root / self.node(i)

    def create(self) -> None:
        for i in range(self.topo.num_nodes):
            if self.cgroup_of(i) is not None:
                self.cgroups.append(cgroup.create(self.cpu, self.node(i), self.topo.cpu_limit(i)))
        sw = self.switch
        self._add_ns(sw)
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        hosts = self._hosts_text()
        for i in range(self.topo.num_nodes):
            ns = self.node(i)
            self._add_ns(ns)
            _run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"n{i}", "netns", sw])
            _run(["ip", "-n", sw, "link", "set", f"n{i}", "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            for cmd in shaping_commands(ns, "eth0", self.topo, i, self.with_delay):
                _run(cmd)
            for cmd in shaping_commands(sw, f"n{i}", self.topo, i, with_delay=False):
                _run(cmd)
            if self.topo.decoy:
                _run(["ip", "-n", ns, "link", "add", "decoy0", "type", "veth", "peer", "name", "decoy0p"])
                _run(["ip", "-n", ns, "addr", "add", f"{self.decoy_address(i)}/24", "dev", "decoy0"])
                _run(["ip", "-n", ns, "link", "set", "decoy0", "up"])
                _run(["ip", "-n", ns, "link", "set", "decoy0p", "up"])
            (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / ns / "hosts").write_text(hosts)

    def _add_ns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.created.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _hosts_text(self) -> str:
        addr = self.decoy_address if self.topo.decoy else self.address
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{addr(i)}\t{self.node(i)}" for i in range(self.topo.num_nodes)]
        # c10d names each peer from its IPv4-mapped IPv6 address; without these the lookup falls
        # through to DNS, which no namespace can reach (a warning per connection)
        lines += [f"::ffff:{addr(i)}\t{self.node(i)}" for i in range(self.topo.num_nodes)]
        if self.topo.decoy:  # the eth0 addresses get names too (-eth0), so reverse lookups still succeed
            lines += [
                f"{pre}{self.address(i)}\t{self.node(i)}-eth0"
                for i in range(self.topo.num_nodes)
                for pre in ("", "::ffff:")
            ]
        return "\n".join(lines) + "\n"

    def node_argv(self, i: int, argv: list[str]) -> list[str]:
        """`argv` run on node i: in its network namespace (with its /etc/hosts view) and its own
        UTS namespace named after the node."""
        return ["ip", "netns", "exec", self.node(i), "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', self.node(i), *argv]

    def destroy(self) -> None:
        # nodes first (their veth peers vanish from the switch with them), the switch last
        for name in reversed(self.created):
            remove_namespace(name)
        self.created.clear()
        # after the namespaces: their removal already killed what ran in them
        for path in self.cgroups:
            cgroup.remove(path)
        self.cgroups.clear()
