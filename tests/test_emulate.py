"""`distval emulate`: rate and latency parsing, bad input, and real emulated clusters (network
namespaces, veth, tbf, torchrun per node) where this host allows them (root and iproute2; the
tests that need them skip with the reason otherwise). Every test that builds namespaces checks,
in a fixture, that none of its own are left behind, even when it fails."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from distval.emulate import netns
from distval.emulate.rates import format_latency, format_rate, parse_latency, parse_rate

from conftest import run_cli

# -- parsing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,bits", [("1gbit", 10**9), ("100mbit", 10**8), ("2.5Gbit", 25 * 10**8), ("1kibit", 1024),
                                       ("100mbps", 8 * 10**8), ("1kbps", 8000), ("1mibps", 8 * 2**20), ("64bit", 64),
                                       (" 10 gbit ", 10**10), ("1e3mbit", 10**9)])
def test_parse_rate_tc_units(text, bits):
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["1000", "fast", "1gb", "1 gigabit", "-1gbit", "0gbit", "1gbitt", "", "2tbit"])
def test_parse_rate_rejects(text):
    with pytest.raises(ValueError, match=r"^--rate"):
        parse_rate(text)


@pytest.mark.parametrize("text,seconds", [("0.2ms", 2e-4), ("200us", 2e-4), ("200usec", 2e-4), ("1s", 1.0), ("0", 0.0),
                                          ("5msecs", 5e-3)])
def test_parse_latency(text, seconds):
    assert parse_latency(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", "0.2 m", "soon", "1h", "20s"])
def test_parse_latency_rejects(text):
    with pytest.raises(ValueError, match=r"^--latency"):
        parse_latency(text)


def test_formatting_round_trips():
    for text in ("1gbit", "100mbit", "2.5gbit", "64bit"):
        assert parse_rate(format_rate(parse_rate(text))) == parse_rate(text)
    assert format_latency(2e-4) == "200us" and format_latency(0.0015) == "1.5ms" and format_latency(0) == "0"


def test_shaping_commands():
    topo = netns.Topology(2, 1, 10**9, latency_s=2e-4)
    (tbf,) = netns.shaping_commands("dv-1-n0", "eth0", topo, with_delay=False)
    assert tbf[:7] == ["tc", "-n", "dv-1-n0", "qdisc", "replace", "dev", "eth0"]
    assert tbf[tbf.index("rate") + 1] == "1000000000bit"
    assert int(tbf[tbf.index("burst") + 1]) == 131072  # 1 ms at 1 gbit is 125 kB < two 64 KiB GSO packets
    netem, child = netns.shaping_commands("dv-1-n0", "eth0", topo, with_delay=True)
    assert netem[netem.index("delay") + 1] == "200us" and child[child.index("parent") + 1] == "1:" and "tbf" in child
    assert netns.burst_bytes(10 * 10**9) == 1_250_000


def test_topology_validation():
    with pytest.raises(ValueError, match="--nodes must be between 1"):
        netns.Topology(0, 1, 10**9)
    with pytest.raises(ValueError, match="--nproc-per-node"):
        netns.Topology(2, 0, 10**9)
    meta = netns.Topology(4, 2, 10**9, 2e-4, decoy=True).meta(latency_emulated=False)
    assert meta["nodes"] == 4 and meta["rate"] == "1gbit" and meta["latency"] == "200us" and meta["decoy_nic"] is True
    assert meta["latency_emulated"] is False and meta["qdisc"] == "tbf"


# -- bad input: one line, exit 2, before anything is created (no root needed) -------------------------


@pytest.mark.parametrize("args,message", [
    (["--nodes", "0", "--", "comm", "bench"], "--nodes must be between 1 and 200 (got 0)"),
    (["--rate", "fast", "--", "comm", "bench"], "--rate 'fast' is not a tc rate"),
    (["--latency", "5", "--", "comm", "bench"], "--latency '5' is not a tc time"),
    ([], "distval emulate needs a distval command after `--`"),
    (["--", "frobnicate"], "'frobnicate' after `--` is not a distval command"),
    (["--", "plan", "--model", "gpt2"], "`distval plan` cannot run inside distval emulate"),
])
def test_bad_input_one_line_exit_2(args, message):
    res = run_cli("emulate", *args, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("distval: error: ") and message in res.stderr
    assert "Traceback" not in res.stderr


def test_without_iproute2_exit_3(tmp_path):
    res = run_cli("emulate", "--nodes", "2", "--", "comm", "bench", env={"PATH": str(tmp_path)}, timeout=60)
    assert res.returncode == 3 and res.stderr.startswith("distval: error: distval emulate needs iproute2"), res.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to become another user (setpriv)"
)
def test_without_root_exit_3():
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "distval"]
    res = run_cli("emulate", "--nodes", "2", "--", "comm", "bench", prefix=prefix, timeout=60,
                  env={"PYTHONDONTWRITEBYTECODE": "1"})
    if "Permission denied" in res.stderr or "No module named" in res.stderr:
        pytest.skip(f"the unprivileged user cannot read this checkout: {res.stderr.strip().splitlines()[-1]}")
    assert res.returncode == 3 and "needs root" in res.stderr and res.stderr.count("\n") == 1, res.stderr


# -- real emulated clusters ---------------------------------------------------------------------------------


def _namespaces_possible() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    name = f"dv-{os.getpid()}-probe"
    res = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None if res.returncode == 0 else f"cannot create a network namespace: {res.stderr.strip()}"


_REASON = _namespaces_possible()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


@pytest.fixture
def no_leftovers():
    """Every emulate the test started is a child of this process: after the test, no namespace
    of a dead owner may remain, and the test's own are removed if it left any (then it fails)."""
    before = set(netns.list_namespaces())
    yield
    stray = [n for n in netns.list_namespaces() if n not in before and n.startswith(netns.PREFIX)]
    for name in stray:
        netns.remove_namespace(name)
    assert not stray, f"namespaces left behind: {stray}"


@needs_netns
def test_two_nodes_shaped_bench(tmp_path, no_leftovers):
    """2 nodes x 1 rank at 200 mbit: the report comes from rank 0 on node 0 with the topology in
    its meta, each node's lines carry its name, and the fitted bandwidth is the shaped rate."""
    out = tmp_path / "bench.json"
    dead = subprocess.Popen(["true"])  # a leftover of a crashed run: removed first, and said so
    dead.wait()
    subprocess.run(["ip", "netns", "add", f"dv-{dead.pid}-sw"], check=True)
    (tmp_path / "tmp").mkdir()
    res = run_cli("emulate", "--nodes", "2", "--nproc-per-node", "1", "--rate", "200mbit", "--",
                  "comm", "bench", "--ops", "all_reduce", "-b", "1M", "-e", "4M", "-n", "3", "-w", "1", "-c", "1",
                  "--json", str(out), timeout=120, env={"TMPDIR": str(tmp_path / "tmp")})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert not list((tmp_path / "tmp").iterdir())  # nothing left in the temporary folder: torchrun's logs included
    assert f"distval: removed leftovers of a crashed emulate run: dv-{dead.pid}-sw" in res.stderr.splitlines()
    assert f"dv-{dead.pid}-sw" not in netns.list_namespaces()
    doc = json.loads(out.read_text())
    meta = doc["meta"]
    assert (
        meta["emulated"]["nodes"] == 2
        and meta["emulated"]["rate"] == "200mbit"
        and meta["emulated"]["decoy_nic"] is False
    )
    assert meta["world_size"] == 2 and meta["launch"] == "torchrun"
    assert sorted(meta["hosts"].values()) == [[0], [1]] and all(h.startswith("dv-") for h in meta["hosts"])
    assert meta["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert doc["summary"]["FAIL"] == 0 and doc["summary"]["ERROR"] == 0
    # 2 ranks: a ring all_reduce sends S per rank, so beta is the link's payload rate (~95% of 25 MB/s)
    (fit,) = doc["tables"]["alpha_beta"]["rows"]
    assert 0.80 * 25e6 <= fit["beta_gbps"] * 1e9 <= 1.05 * 25e6, fit
    lines = res.stdout.splitlines()
    assert any(line.startswith("n0 | distval comm bench") for line in lines)
    assert any(line.startswith("n1 | ") for line in res.stdout.splitlines() + res.stderr.splitlines())


@needs_netns
def test_the_quick_ladder_across_two_emulated_nodes(tmp_path, no_leftovers):
    """`distval emulate --nodes 2 -- run --quick`: the stages that launch ranks run across both
    nodes, one after the other in the same processes (each job's keys in the agent's store apart
    from the last one's); compare and drills, which start local jobs, say where to run them."""
    out = tmp_path / "report"
    res = run_cli("emulate", "--nodes", "2", "--nproc-per-node", "1", "--", "run", "--quick", "--out", str(out),
                  timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    ladder = {r["stage"]: r for r in doc["tables"]["ladder"]["rows"]}
    assert doc["meta"]["launch"] == "torchrun" and len(doc["meta"]["hosts"]) == 2
    assert "on 2 host(s)" in ladder["doctor"]["headline"]
    for stage in ("doctor", "check", "bench", "plan", "trace", "health"):
        assert ladder[stage]["status"] in ("OK", "WARN"), (stage, ladder[stage])
    for stage in ("compare", "drills"):
        assert ladder[stage]["status"] == "SKIP" and f"`distval run --only {stage}` on one node" in \
            ladder[stage]["headline"]
    assert {r["rank"] for r in doc["tables"]["trace_breakdown"]["rows"]} == {0, 1}
    assert (out / "report.html").is_file()


@needs_netns
def test_decoy_nic_named_error_fast(no_leftovers):
    """The drill: hostnames resolve to a NIC that leads nowhere and GLOO_SOCKET_IFNAME is unset.
    Without the pre-flight this hangs at init for the whole --timeout; with it, rank 1 names the
    interface and the fix within seconds, and the job ends with exit 3."""
    started = time.monotonic()
    res = run_cli("emulate", "--nodes", "2", "--decoy-nic", "--", "comm", "check", "--ops", "all_reduce", "-d", "int64",
                  "--counts", "5", "--timeout", "120s", timeout=60)
    elapsed = time.monotonic() - started
    assert res.returncode == 3, res.stdout[-2000:] + res.stderr[-3000:]
    assert elapsed < 30, elapsed
    text = res.stdout + res.stderr
    assert "Gloo will advertise 10.78.0.2 on interface decoy0" in " ".join(text.split())
    assert "set GLOO_SOCKET_IFNAME=eth0" in " ".join(text.split())
    last = res.stderr.rstrip().splitlines()[-1]  # emulate's summary carries rank 1's one-line error
    assert last.startswith("distval: error: emulated node n1 failed first (exit code 3): rank 1 failed: "
                           "NetworkPreflightError: dv-") and "decoy0" in last and "GLOO_SOCKET_IFNAME=eth0" in last


@needs_netns
def test_doctor_points_at_the_decoy_nic(no_leftovers):
    """Under the same drill, doctor on the failing node reports its host checks: the host name
    resolves to decoy0 while the route to MASTER_ADDR leaves by eth0."""
    res = run_cli("emulate", "--nodes", "2", "--decoy-nic", "--", "doctor", "--timeout", "60s", timeout=60)
    assert res.returncode == 3, res.stdout[-2000:] + res.stderr[-3000:]
    n1 = [line for line in res.stdout.splitlines() if line.startswith("n1 | ")]
    assert any("WARN" in line and "doctor.net hostname" in line and "resolves to 10.78.0.2" in line for line in n1)
    flat = " ".join(" ".join(n1).split())
    assert "(decoy0), but the route to MASTER_ADDR leaves" in flat and "export GLOO_SOCKET_IFNAME=eth0" in flat
    assert "ERROR" in flat and "NetworkPreflightError" in flat


@needs_netns
def test_leftover_of_a_crashed_run_is_cleaned(no_leftovers):
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"dv-{dead.pid}-n0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    (netns.NETNS_ETC / name).mkdir(parents=True, exist_ok=True)
    (netns.NETNS_ETC / name / "hosts").write_text("127.0.0.1 localhost\n")
    live = f"dv-{os.getpid()}-n9"  # owner alive: never touched
    subprocess.run(["ip", "netns", "add", live], check=True)
    try:
        assert name in netns.leftovers() and live not in netns.leftovers()
        res = run_cli("emulate", "--clean", timeout=60)
        assert res.returncode == 0 and name in res.stdout, res.stderr
        assert name not in netns.list_namespaces() and not (netns.NETNS_ETC / name).exists()
        assert live in netns.list_namespaces()
    finally:
        netns.remove_namespace(live)
        netns.remove_namespace(name)


@needs_netns
def test_sigterm_removes_the_cluster(tmp_path, no_leftovers):
    cmd = [sys.executable, "-m", "distval", "emulate", "--nodes", "2", "--rate", "10mbit", "--",
           "comm", "bench", "--ops", "all_reduce", "-b", "4M", "-e", "4M", "-n", "50"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tag = f"dv-{proc.pid}-"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(n.startswith(tag) for n in netns.list_namespaces()) < 3:
            time.sleep(0.1)
        assert sum(n.startswith(tag) for n in netns.list_namespaces()) == 3  # switch + 2 nodes
        time.sleep(2)  # torchrun is up on both nodes
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; stopping the nodes" in err
    assert not [n for n in netns.list_namespaces() if n.startswith(tag)]
    etc_left = [p for p in os.listdir(netns.NETNS_ETC) if p.startswith(tag)] if netns.NETNS_ETC.exists() else []
    assert not etc_left
