"""`distval doctor` as a user runs it: real subprocesses, this host's real interfaces and routes,
ranks started locally and by two torchrun agents, a network namespace with a decoy bridge, and the
topology / NCCL-log fixtures in tests/data."""

import json
import os
import resource
import shutil
import socket
import subprocess
import sys

import pytest

from distval.doctor import net
from distval.results import Status

from conftest import REPO, free_port, run_cli

DATA = REPO / "tests" / "data"
CLEAN = ("GLOO_", "NCCL_")


def clean_env(**extra):
    """The environment minus GLOO_*/NCCL_* (run_cli drops MASTER_*, RANK...), plus `extra`."""
    return {**{k: "" for k in os.environ if k.startswith(CLEAN)}, **extra}


def checks_of(doc):
    return {c["name"]: c for c in doc["checks"]}


def one_line_error(res):
    lines = res.stderr.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("distval: error: ") and "Traceback" not in res.stderr + res.stdout


def test_doctor_on_this_host_reports_what_the_kernel_says(tmp_path):
    out = tmp_path / "d.json"
    res = run_cli("doctor", "--json", str(out), env=clean_env(), timeout=60)
    doc = json.loads(out.read_text())
    checks = checks_of(doc)
    assert doc["schema"] == "distval.report/1" and doc["command"] == "doctor"
    assert res.returncode == (1 if any(c["status"] == "FAIL" for c in doc["checks"]) else 0), res.stderr
    # interfaces: the same names, MTUs and addresses iproute2 prints
    ip = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    assert [(i["name"], i["mtu"]) for i in doc["meta"]["interfaces"]] == [(i["ifname"], i["mtu"]) for i in ip]
    for mine, theirs in zip(doc["meta"]["interfaces"], ip):
        assert {a.split("/")[0] for a in mine["addresses"]} == {a["local"] for a in theirs["addr_info"]}
    # the master: the address the host name resolves to (else 127.0.0.1), and the route the kernel takes
    names = [a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)]
    master = doc["meta"]["master_addr"]
    assert master == (names[0] if names else "127.0.0.1")
    got = json.loads(
        subprocess.run(["ip", "-j", "route", "get", master], capture_output=True, text=True, check=True).stdout
    )[0]
    expected_dev = got["dev"] if got.get("type") != "local" else next(
        i["ifname"] for i in ip if any(a["local"] == master for a in i["addr_info"]))
    assert doc["meta"]["route_to_master"]["dev"] == expected_dev == net.interface_for(master)
    assert checks["doctor.net route"]["status"] == "OK" and expected_dev in checks["doctor.net route"]["summary"]
    # host name resolution: WARN exactly when it resolves to loopback only
    loop = all(a.startswith("127.") or a == "::1" for a in names)
    assert checks["doctor.net hostname"]["status"] == ("WARN" if loop else "OK")
    # limits and /dev/shm as the kernel reports them
    st = os.statvfs("/dev/shm")
    assert checks["doctor.system shm"]["details"]["size_bytes"] == st.f_blocks * st.f_frsize
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert checks["doctor.system nofile"]["details"]["soft"] == str(soft)
    assert checks["doctor.versions"]["details"]["gloo"] is True
    assert checks["doctor.ranks"]["status"] == "SKIP"
    if shutil.which("nvidia-smi") is None:
        assert checks["doctor.topo"]["status"] == "SKIP"
    assert "doctor.net hostname" in res.stdout and "interfaces" in res.stdout


def test_seed_002_files_and_a_listening_master_port(tmp_path):
    out = tmp_path / "d.json"
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        res = run_cli(
            "doctor",
            "--topo-file",
            str(DATA / "topo_2xL4_sys.txt"),
            "--nccl-log",
            str(DATA / "nccl_2xL4_p2p_cumem.log"),
            "--master-addr",
            "127.0.0.1",
            "--json",
            str(out),
            env=clean_env(MASTER_PORT=str(port)),
            timeout=60,
        )
    assert res.returncode == 1, res.stderr  # the P2P-over-SYS FAIL
    doc = json.loads(out.read_text())
    checks = checks_of(doc)
    fail = checks["doctor.nccl p2p-paths"]
    assert fail["status"] == "FAIL" and fail["where"]["gpus"] == "GPU1->GPU0" and "NCCL_P2P_DISABLE=1" in fail["hint"]
    assert checks["doctor.topo gpu-paths"]["status"] == "WARN"
    assert checks["doctor.net port"]["status"] == "OK" and checks["doctor.net port"]["where"] == {
        "addr": "127.0.0.1",
        "port": port,
        "host": socket.gethostname(),
    }
    assert doc["meta"]["topology"]["matrix"]["GPU0"]["GPU1"] == "SYS"
    assert doc["meta"]["nccl_log"]["transports"] == {"P2P/CUMEM": 4} and doc["meta"]["nccl_log"]["gdr"] is True
    assert [r["transport"] for r in doc["tables"]["nccl_connections"]["rows"]] == ["P2P/CUMEM"] * 2
    assert {r["path"] for r in doc["tables"]["nccl_connections"]["rows"]} == {"SYS"}
    assert "doctor.nccl p2p-paths" in res.stdout and "FAIL" in res.stdout


FAKE_NVIDIA_SMI = """#!/bin/sh
# stands in for the driver's tool on this GPU-less host: the two outputs doctor asks for
case "$*" in
  "topo -m") cat "{topo}" ;;
  --query-gpu=*) printf '0, NVIDIA L4, 23034, 550.54.15, 00000000:01:00.0\\n\
1, NVIDIA L4, 23034, 550.54.15, 00000000:81:00.0\\n' ;;
  *) exit 9 ;;
esac
"""


def test_nvidia_smi_output_is_read_when_the_tool_is_there(tmp_path):
    """Without --topo-file doctor runs `nvidia-smi topo -m` and `--query-gpu` itself."""
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(FAKE_NVIDIA_SMI.format(topo=DATA / "topo_2xL4_sys.txt"))
    tool.chmod(0o755)
    out = tmp_path / "d.json"
    res = run_cli("doctor", "--json", str(out), env=clean_env(PATH=f"{tool.parent}:{os.environ['PATH']}"), timeout=60)
    doc = json.loads(out.read_text())
    checks = checks_of(doc)
    assert doc["meta"]["topology"]["source"] == "nvidia-smi topo -m", res.stderr
    assert checks["doctor.topo gpu-paths"]["status"] == "WARN" and checks["doctor.topo gpu-paths"]["where"] == {
        "pairs": ["GPU0-GPU1"]
    }
    devices = checks["doctor.devices"]
    assert [g["name"] for g in devices["details"]["gpus"]] == ["NVIDIA L4", "NVIDIA L4"]
    assert devices["status"] == "WARN" and "torch sees none" in devices["summary"]  # this torch is a CPU build
    assert (
        checks["doctor.versions"]["status"] == "WARN" and "NCCL is not usable" in checks["doctor.versions"]["summary"]
    )


def test_port_that_nothing_listens_on():
    port = free_port()
    check = net.check_port("127.0.0.1", port, listening_expected=False)
    assert check.status is Status.WARN and "refused" in check.summary
    assert net.check_port("127.0.0.1", port, listening_expected=True).status is Status.FAIL


@pytest.mark.parametrize("args, message", [
    (["--topo-file", "/nonexistent/topo.txt"], "--topo-file '/nonexistent/topo.txt' does not exist"),
    (["--topo-file", str(DATA / "topo_not_a_matrix.txt")], "no `nvidia-smi topo -m` matrix"),
    (["--topo-file", str(DATA / "topo_bad_cell.txt")], "line 3: GPU1/GPU0 is 'SYX'"),
    (["--nccl-log", str(DATA / "not_an_nccl_log.log")], "no NCCL lines"),
    (["--nccl-log", sys.executable], "cannot be read as text"),
    (["--gloo-socket-ifname", "^docker0"], "--gloo-socket-ifname '^docker0': '^docker0' uses NCCL's '^' syntax"),
    (["--nccl-socket-ifname", "eth0,^lo"], "--nccl-socket-ifname 'eth0,^lo': '^lo' has ^ inside the list"),
    (["--master-port", "70000"], "--master-port 70000 is not a TCP port"),
    (["--nproc", "0"], "--nproc must be at least 1"),
])
def test_bad_input_is_one_line_exit_2(args, message, tmp_path, cli, monkeypatch):
    for name in [k for k in os.environ if k.startswith(CLEAN)]:
        monkeypatch.delenv(name)
    out = tmp_path / "d.json"
    res = cli("doctor", *args, "--json", str(out))
    assert res.returncode == 2 and one_line_error(res) and message in res.stderr, res.stderr
    assert not out.exists()


def test_two_local_ranks_probe_the_rendezvous(tmp_path):
    out = tmp_path / "d.json"
    res = run_cli("doctor", "--nproc", "2", "--expect-world", "2", "--json", str(out), env=clean_env(), timeout=120)
    doc = json.loads(out.read_text())
    checks = checks_of(doc)
    assert res.returncode in (0, 1) and doc["meta"]["world_size"] == 2 and doc["meta"]["launch"] == "local", res.stderr
    rdzv = checks["doctor.rendezvous"]
    assert rdzv["status"] == "OK" and "2 ranks on 1 host(s)" in rdzv["summary"]
    bound = {r["rank"]: r["bound"] for r in rdzv["details"]["ranks"]}
    # each rank listens (Gloo, one listener per group: world and control) on the address the host name gives Gloo
    gloo_addr = net.resolve(socket.gethostname())[0] if net.resolve(socket.gethostname()) else "127.0.0.1"
    gloo_addr = (
        "127.0.0.1" if net.is_loopback(gloo_addr) or net.interface_of(gloo_addr, net.held_by(net.interfaces())) is None
        else gloo_addr
    )
    for rank in (0, 1):
        assert len(bound[rank]["listen"]) >= 2 and bound[rank]["addresses"] == [gloo_addr], bound
    ports = {p for b in bound.values() for p in b["listen"]}
    assert len(ports) == sum(len(b["listen"]) for b in bound.values())  # no two listeners share address:port
    for name in ("doctor.ranks versions", "doctor.ranks env", "doctor.ranks interfaces"):
        assert checks[name]["status"] == "OK", checks[name]
    assert [r["rank"] for r in doc["tables"]["ranks"]["rows"]] == [0, 1]
    assert sum(c["name"] == "doctor.net hostname" for c in doc["checks"]) == 1  # host checks once per host


def test_world_of_the_wrong_size_fails_without_launching(tmp_path):
    out = tmp_path / "d.json"
    res = run_cli("doctor", "--nproc", "2", "--expect-world", "3", "--json", str(out), env=clean_env(), timeout=60)
    assert res.returncode == 1, res.stderr
    rdzv = checks_of(json.loads(out.read_text()))["doctor.rendezvous"]
    assert rdzv["status"] == "FAIL" and "world of 2 rank(s), expected 3" in rdzv["summary"]


def test_ranks_that_cannot_start_are_explained_by_the_host_checks(tmp_path):
    """Gloo rejects NCCL's grammar at init: the ranks die, and the report says why."""
    out = tmp_path / "d.json"
    res = run_cli("doctor", "--nproc", "2", "--timeout", "20s", "--json", str(out),
                  env=clean_env(GLOO_SOCKET_IFNAME="^lo", NCCL_SOCKET_IFNAME="=nosuch0"), timeout=120)
    assert res.returncode == 3, res.stderr
    checks = checks_of(json.loads(out.read_text()))
    assert (
        checks["doctor ranks"]["status"] == "ERROR"
        and "Unable to find address for: ^lo" in checks["doctor ranks"]["summary"]
    )
    gloo, nccl = checks["doctor.net GLOO_SOCKET_IFNAME"], checks["doctor.net NCCL_SOCKET_IFNAME"]
    assert gloo["status"] == "FAIL" and "NCCL's '^' syntax" in gloo["summary"]
    assert nccl["status"] == "FAIL" and "selects no usable interface" in nccl["summary"]


def test_two_torchrun_agents_compare_their_environment(tmp_path):
    """Two 'nodes' (torchrun agents) on this host join one c10d rendezvous; they differ in NCCL_DEBUG."""
    port = free_port()
    procs = []
    for node, level in (("a", "INFO"), ("b", "WARN")):
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", *CLEAN))
        }
        env.update(NCCL_DEBUG=level, OMP_NUM_THREADS="1")
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            f"doctor-{port}",
            "-m",
            "distval",
            "doctor",
            "--expect-world",
            "2",
            "--json",
            str(tmp_path / f"{node}.json"),
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    written = [f for f in (tmp_path / "a.json", tmp_path / "b.json") if f.exists()]
    assert len(written) == 1  # rank 0 reports, the other rank stays quiet
    doc = json.loads(written[0].read_text())
    checks = checks_of(doc)
    assert doc["meta"]["launch"] == "torchrun" and doc["meta"]["world_size"] == 2
    assert checks["doctor.rendezvous"]["status"] == "OK"
    env = checks["doctor.ranks env"]
    assert env["status"] == "WARN" and env["where"] == {"keys": ["NCCL_DEBUG"]}
    assert sorted(env["details"]["differ"]["NCCL_DEBUG"].values()) == ["INFO", "WARN"]
    assert checks["doctor.net port"]["status"] == "OK"  # the agents' store listens on MASTER_PORT


UNSHARE = shutil.which("unshare")
NETNS_SCRIPT = """
set -e
mount -t sysfs sysfs /sys
ip link set lo up
ip link add veth0 type veth peer name veth1
ip addr add 10.9.0.1/24 dev veth0
ip link set veth0 up
ip link set veth1 up
ip link add docker0 type bridge
ip addr add 172.17.0.1/16 dev docker0
ip link set docker0 up
"$PY" -c 'from distval.doctor.net import interface_for as f; \
print("IFACES", f("10.9.0.2"), f("172.17.5.5"), f("127.0.0.1"), f("10.200.0.1"))'
GLOO_SOCKET_IFNAME=docker0 NCCL_SOCKET_IFNAME=^lo \
"$PY" -m distval doctor --master-addr 10.9.0.2 --json "$OUT/loose.json" > /dev/null || true
GLOO_SOCKET_IFNAME=veth0 NCCL_SOCKET_IFNAME==veth0 \
"$PY" -m distval doctor --master-addr 10.9.0.2 --json "$OUT/pinned.json" > /dev/null || true
"""


def test_decoy_bridge_in_a_network_namespace(tmp_path):
    """A namespace with the route to the master on veth0 and an up docker0 bridge beside it."""
    if (
        UNSHARE is None
        or subprocess.run([UNSHARE, "-n", "-m", "true"], check=False, capture_output=True).returncode != 0
    ):
        pytest.skip("cannot create a network namespace here (needs root and unshare)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", *CLEAN))}
    env.update(PY=sys.executable, OUT=str(tmp_path))
    res = subprocess.run(
        [UNSHARE, "-n", "-m", "sh", "-c", NETNS_SCRIPT],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if res.returncode != 0 and "Operation not supported" in res.stderr:
        pytest.skip(f"namespace set-up not supported: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    assert "IFACES veth0 docker0 lo None" in res.stdout
    loose = checks_of(json.loads((tmp_path / "loose.json").read_text()))
    assert loose["doctor.net route"]["status"] == "OK" and "through veth0" in loose["doctor.net route"]["summary"]
    assert loose["doctor.net decoys"]["status"] == "WARN" and loose["doctor.net decoys"]["where"]["interfaces"] == [
        "docker0"
    ]
    assert "GLOO_SOCKET_IFNAME=veth0" in loose["doctor.net decoys"]["hint"]
    assert (
        loose["doctor.net GLOO_SOCKET_IFNAME"]["status"] == "WARN"
        and "leaves by veth0, not docker0" in loose["doctor.net GLOO_SOCKET_IFNAME"]["summary"]
    )
    assert loose["doctor.net NCCL_SOCKET_IFNAME"]["status"] == "WARN"
    assert loose["doctor.net NCCL_SOCKET_IFNAME"]["details"]["selected"] == ["veth0", "docker0"]
    pinned = checks_of(json.loads((tmp_path / "pinned.json").read_text()))
    for name in ("doctor.net decoys", "doctor.net GLOO_SOCKET_IFNAME", "doctor.net NCCL_SOCKET_IFNAME"):
        assert pinned[name]["status"] == "OK", pinned[name]
    assert "pin veth0" in pinned["doctor.net decoys"]["summary"]
