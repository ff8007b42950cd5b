"""The multi-node pre-flight (`distval.launch.netcheck`): which address Gloo will advertise, whether
MASTER_ADDR answers from it, and the one-line ERROR that names the interface and the fix. The
unreachable case runs for real inside a network namespace whose only non-loopback NIC leads
nowhere (skipped without root); the whole drill across emulated nodes is in test_emulate.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from distval.launch import netcheck
from distval.launch.netcheck import NetworkPreflightError, gloo_address, multi_node, preflight, reachable

MULTI = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}


@pytest.fixture
def listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        yield s.getsockname()[1]


def _non_loopback_ipv4() -> tuple[str, str] | None:
    for name in netcheck.interface_names():
        addr = netcheck.ipv4_of(name)
        if addr and not addr.startswith("127."):
            return name, addr
    return None


def test_interfaces_and_addresses():
    assert "lo" in netcheck.interface_names()
    assert netcheck.ipv4_of("lo") == "127.0.0.1" and netcheck.ipv4_of("no-such-if0") is None
    assert netcheck.interface_of("127.0.0.1") == "lo"
    found = _non_loopback_ipv4()
    if found:
        assert netcheck.interface_of(found[1]) == found[0]
    assert netcheck.route_source("127.0.0.1", 9) == "127.0.0.1"


def test_gloo_address_follows_gloo_rules():
    (adv,) = gloo_address({"GLOO_SOCKET_IFNAME": "lo"})
    assert (adv.address, adv.interface) == ("127.0.0.1", "lo") and "GLOO_SOCKET_IFNAME=lo" in adv.why
    (adv,) = gloo_address({}, hostname="localhost")  # resolves to a bindable loopback address
    assert adv.interface == "lo" and "hostname localhost resolves to it" in adv.why
    (adv,) = gloo_address({}, hostname="no-such-host.invalid")  # Gloo falls back to loopback
    assert adv.address == "127.0.0.1" and "so loopback" in adv.why
    with pytest.raises(
        NetworkPreflightError, match=r"GLOO_SOCKET_IFNAME=eth9: no interface 'eth9' on .* \(it has .*lo"
    ):
        gloo_address({"GLOO_SOCKET_IFNAME": "eth9"})
    with pytest.raises(NetworkPreflightError, match="no interface 'bogus'"):
        gloo_address({"GLOO_SOCKET_IFNAME": "lo,bogus"})


def test_multi_node_detection():
    assert multi_node(MULTI)
    assert not multi_node({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"})  # torchrun --standalone
    assert not multi_node({"WORLD_SIZE": "2", "SLURM_STEP_NUM_NODES": "1"})
    assert multi_node({"WORLD_SIZE": "2", "SLURM_STEP_NUM_NODES": "2"})
    assert multi_node({"WORLD_SIZE": "2"})  # cannot tell: check


def test_reachable_counts_a_refusal_as_a_path(listener):
    assert reachable("127.0.0.1", "127.0.0.1", listener, 1.0) == (True, "connected")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    ok, how = reachable("127.0.0.1", "127.0.0.1", closed, 1.0)
    assert ok and "refused" in how


def test_preflight_passes_and_skips(listener):
    env = {**MULTI, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(listener), "GLOO_SOCKET_IFNAME": "lo"}
    warnings: list[str] = []
    preflight(env, timeout_s=1.0, warn=warnings.append)
    assert warnings == []
    # a single-node world, or the switch off, is never probed (a missing interface would raise)
    preflight({**env, "LOCAL_WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": "eth9"}, timeout_s=1.0)
    preflight({**env, "DISTVAL_NETCHECK": "0", "GLOO_SOCKET_IFNAME": "eth9"}, timeout_s=1.0)
    with pytest.raises(NetworkPreflightError, match="no interface 'eth9'"):
        preflight({**env, "GLOO_SOCKET_IFNAME": "eth9"}, timeout_s=1.0)
    with pytest.raises(NetworkPreflightError, match="MASTER_ADDR=no-such-host.invalid does not resolve"):
        preflight({**env, "MASTER_ADDR": "no-such-host.invalid"}, timeout_s=1.0)


def test_loopback_advertised_to_a_remote_master_is_an_error():
    found = _non_loopback_ipv4()
    if found is None:
        pytest.skip("this host has no non-loopback IPv4 address to play MASTER_ADDR")
    name, addr = found
    env = {**MULTI, "MASTER_ADDR": addr, "MASTER_PORT": "29999", "GLOO_SOCKET_IFNAME": "lo"}
    with pytest.raises(NetworkPreflightError) as e:
        preflight(env, timeout_s=1.0)
    text = str(e.value)
    assert "Gloo will advertise 127.0.0.1 on interface lo" in text and "no other host can reach" in text
    assert f"set GLOO_SOCKET_IFNAME={name}" in text


def _root_and_ip() -> str | None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "needs root and iproute2 for a network namespace"
    return None


@pytest.mark.skipif(_root_and_ip() is not None, reason=_root_and_ip() or "")
def test_unreachable_master_names_the_interface_in_a_namespace():
    """In a namespace whose eth0 reaches 10.79.0.1 and whose decoy0 leads nowhere, a rank whose
    hostname resolves to decoy0's address gets the ERROR naming decoy0 and eth0 within the
    probe's timeout (1 s here)."""
    ns = f"netcheck-{os.getpid()}"  # not emulate's dv- prefix: test_emulate's leftover check runs beside it
    etc = f"/etc/netns/{ns}"
    script = (
        "import sys; from distval.launch.netcheck import preflight\n"
        "env = {'RANK': '1', 'WORLD_SIZE': '2', 'LOCAL_WORLD_SIZE': '1', "
        "'MASTER_ADDR': '10.79.0.1', 'MASTER_PORT': '29400'}\n"
        "try:\n    preflight(env, timeout_s=1.0)\nexcept Exception as e:\n    print(type(e).__name__, e); sys.exit(3)\n"
    )
    try:
        for cmd in (["ip", "netns", "add", ns], ["ip", "-n", ns, "link", "set", "lo", "up"],
                    ["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"],
                    ["ip", "-n", ns, "addr", "add", "10.79.0.2/24", "dev", "eth0"],
                    ["ip", "-n", ns, "link", "add", "decoy0", "type", "veth", "peer", "name", "decoy0p"],
                    ["ip", "-n", ns, "addr", "add", "10.78.0.2/24", "dev", "decoy0"]):
            subprocess.run(cmd, check=True, capture_output=True)
        for dev in ("eth0", "eth0p", "decoy0", "decoy0p"):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        os.makedirs(etc, exist_ok=True)
        with open(f"{etc}/hosts", "w") as f:
            f.write("127.0.0.1 localhost\n10.78.0.2 decoyhost\n")
        res = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "unshare",
                "--uts",
                "sh",
                "-c",
                'hostname decoyhost && exec "$@"',
                "sh",
                sys.executable,
                "-c",
                script,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(etc, ignore_errors=True)
    assert res.returncode == 3, res.stdout + res.stderr
    text = res.stdout
    assert text.startswith("NetworkPreflightError decoyhost: Gloo will advertise 10.78.0.2 on interface decoy0")
    assert "hostname decoyhost resolves to it" in text and "MASTER_ADDR 10.79.0.1:29400 is unreachable" in text
    assert "set GLOO_SOCKET_IFNAME=eth0" in text and "leaves by eth0 10.79.0.2" in text
