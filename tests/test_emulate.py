"""`distval emulate`: rate, latency and CPU parsing (one value or one per node), bad input, the
cgroup hierarchy's discovery, and real emulated clusters (network namespaces, veth, tbf, CPU
cgroups, torchrun per node) where this host allows them (root and iproute2, a cgroup cpu
controller for --cpu; the tests that need them skip with the reason otherwise). Every test that
builds namespaces checks, in a fixture, that none of its own namespaces or cgroups are left
behind, even when it fails."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distval.emulate import cgroup, netns
from distval.emulate.rates import format_latency, format_rate, parse_cpus, parse_latency, parse_rate, parse_rates

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
    (tbf,) = netns.shaping_commands("dv-1-n0", "eth0", topo, 0, with_delay=False)
    assert tbf[:7] == ["tc", "-n", "dv-1-n0", "qdisc", "replace", "dev", "eth0"]
    assert tbf[tbf.index("rate") + 1] == "1000000000bit"
    assert int(tbf[tbf.index("burst") + 1]) == 131072  # 1 ms at 1 gbit is 125 kB < two 64 KiB GSO packets
    netem, child = netns.shaping_commands("dv-1-n0", "eth0", topo, 0, with_delay=True)
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
    assert meta["rate_bits_per_s"] == 10**9 and meta["burst_bytes"] == 131072 and meta["cpu_cores"] is None


# -- one rate or CPU limit per node ------------------------------------------------------------------


def test_parse_rates_one_or_per_node():
    assert parse_rates("1gbit") == (10**9,)
    assert parse_rates("1gbit, 1gbit,250mbit,1gbit") == (10**9, 10**9, 250 * 10**6, 10**9)
    with pytest.raises(ValueError, match=r"^--rate '1gbit,fast' is not|^--rate 'fast' is not a tc rate"):
        parse_rates("1gbit,fast")
    with pytest.raises(ValueError, match=r"^--rate '1gbit,,1gbit' has an empty entry"):
        parse_rates("1gbit,,1gbit")


@pytest.mark.parametrize("text,cores", [("1", (1.0,)), ("0.25", (0.25,)), ("1,1,0.25,1", (1.0, 1.0, 0.25, 1.0)),
                                        (" 2 , .5", (2.0, 0.5)), ("0.01", (0.01,))])
def test_parse_cpus(text, cores):
    assert parse_cpus(text, host_cores=2) == cores


@pytest.mark.parametrize("text,message", [
    ("0", "must be a positive number of cores"), ("-1", "must be a positive number of cores"),
    ("nan", "must be a positive number of cores"), ("one", "is not a number of cores"),
    ("1core", "is not a number of cores"), ("0.001", "is below 0.01 core"), ("3", "more cores than this host has (2)"),
    ("1,", "has an empty entry"), ("", "has an empty entry"),
])
def test_parse_cpus_rejects(text, message):
    with pytest.raises(ValueError, match=r"^--cpu ") as e:
        parse_cpus(text, host_cores=2)
    assert message in str(e.value)


def test_topology_per_node_rates_and_cpu():
    slow = netns.Topology(4, 1, (10**9, 10**9, 250 * 10**6, 10**9), cpu_cores=(1, 1, 0.25, 1))
    assert [slow.rate_bps(i) for i in range(4)] == [10**9, 10**9, 250 * 10**6, 10**9]
    assert [slow.cpu_limit(i) for i in range(4)] == [1, 1, 0.25, 1]
    assert slow.burst_bytes(2) == 131072 and netns.Topology(2, 1, (10**9, 10**10)).burst_bytes(1) == 1_250_000
    meta = slow.meta(latency_emulated=False)
    assert meta["rate"] == "1gbit,1gbit,250mbit,1gbit" and meta["rate_bits_per_s"] == [10**9, 10**9, 250 * 10**6, 10**9]
    assert meta["cpu_cores"] == [1, 1, 0.25, 1] and meta["burst_bytes"] == 131072
    # one value is every node's; the same value listed per node reads as one
    same = netns.Topology(3, 1, (10**9,) * 3, cpu_cores=0.5)
    assert same.rates_bps == (10**9,) * 3 and same.cpu_cores == (0.5,) * 3 and same.cpu_text() == "0.5"
    assert same.meta(False)["rate"] == "1gbit" and same.meta(False)["cpu_cores"] == 0.5
    assert netns.Topology(2, 1, 10**9).cpu_limit(1) is None
    with pytest.raises(ValueError, match=r"^--rate gives 3 rates but --nodes is 4"):
        netns.Topology(4, 1, (10**9, 10**9, 10**9))
    with pytest.raises(ValueError, match=r"^--cpu gives 2 CPU limits but --nodes is 3"):
        netns.Topology(3, 1, 10**9, cpu_cores=(1, 0.5))


def test_shaping_commands_carry_each_nodes_rate():
    """Both ends of node i's link (its eth0 and its switch port) are shaped at node i's rate."""
    topo = netns.Topology(3, 1, (10**9, 250 * 10**6, 10 * 10**9))
    for i, (rate, burst, limit) in enumerate([(10**9, 131072, 6_250_000), (250 * 10**6, 131072, 1_562_500),
                                              (10**10, 1_250_000, 62_500_000)]):
        for ns, dev in ((f"dv-1-n{i}", "eth0"), ("dv-1-sw", f"n{i}")):
            (tbf,) = netns.shaping_commands(ns, dev, topo, i, with_delay=False)
            assert tbf[2] == ns and tbf[6] == dev
            assert (tbf[tbf.index("rate") + 1], tbf[tbf.index("burst") + 1], tbf[tbf.index("limit") + 1]) == \
                (f"{rate}bit", str(burst), str(limit))


def _mounts(*lines: str) -> str:
    return "".join(f"{line} 0 0\n" for line in lines)


def test_find_controller_v2_v1_hybrid_none(tmp_path):
    """cgroup2 with cpu in cgroup.controllers wins; a hybrid host's cpu-less cgroup2 (this host's
    /sys/fs/cgroup/unified) falls through to the v1 cpu hierarchy (also when mounted cpu,cpuacct)."""
    v2, hybrid = tmp_path / "v2", tmp_path / "unified"
    v2.mkdir()
    hybrid.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (hybrid / "cgroup.controllers").write_text("\n")
    found = cgroup.find_controller(_mounts(f"cgroup2 {v2} cgroup2 rw,nosuid"))
    assert found == cgroup.CpuController(2, v2) and found.files == "cpu.max"
    v1 = _mounts("tmpfs /sys/fs/cgroup tmpfs rw", "cgroup /sys/fs/cgroup/memory cgroup rw,memory",
                 "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct", f"cgroup2 {hybrid} cgroup2 rw")
    assert cgroup.find_controller(v1) == cgroup.CpuController(1, Path("/sys/fs/cgroup/cpu,cpuacct"))
    assert cgroup.find_controller(_mounts("cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct",
                                          f"cgroup2 {hybrid} cgroup2 rw")) is None
    assert cgroup.find_controller(_mounts(r"cgroup /a\040b cgroup rw,cpu")).root == Path("/a b")


def test_cgroup_v2_files_on_a_fake_tree(tmp_path):
    """The v2 path, which this host (v1) cannot run: cpu handed to children, cpu.max = QUOTA PERIOD."""
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    path = cgroup.create(cgroup.CpuController(2, tmp_path), "dv-1-n2", 0.25)
    assert path == tmp_path / "dv-1-n2" and (path / "cpu.max").read_text() == "25000 100000\n"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu\n"
    assert cgroup.quota_us(1.5) == 150_000 and cgroup.quota_us(0.01) == 1_000


# -- bad per-node flags: one line, exit 2, nothing created (in this process) ------------------------------


@pytest.mark.parametrize("args,message", [
    (["--nodes", "4", "--rate", "1gbit,1gbit,250mbit"],
     "--rate gives 3 rates but --nodes is 4: give one value for every node or a comma list with one per node"),
    (["--nodes", "2", "--rate", "1gbit,slow"], "--rate 'slow' is not a tc rate"),
    (["--nodes", "3", "--cpu", "1,0.25"], "--cpu gives 2 CPU limits but --nodes is 3"),
    (["--nodes", "2", "--cpu", "0,1"], "--cpu '0' must be a positive number of cores"),
    (["--nodes", "2", "--cpu", "-0.5"], "--cpu '-0.5' must be a positive number of cores"),
    (["--nodes", "2", "--cpu", "fast"], "--cpu 'fast' is not a number of cores"),
    (["--nodes", "2", "--cpu", str((os.cpu_count() or 1) + 1)], "more cores than this host has"),
])
def test_bad_per_node_flags_one_line_exit_2(cli, args, message):
    res = cli("emulate", *args, "--", "comm", "bench")
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("distval: error: ") and message in res.stderr
    ctl = cgroup.find_controller()
    assert not (ctl and cgroup.children(ctl, f"dv-{os.getpid()}-"))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2 to get "
                    "past the namespace checks")
def test_no_cpu_controller_exit_3(cli, monkeypatch, tmp_path):
    (tmp_path / "mounts").write_text(_mounts("proc /proc proc rw", "cgroup /sys/fs/cgroup/memory cgroup rw,memory"))
    monkeypatch.setattr(cgroup, "MOUNTS", tmp_path / "mounts")
    res = cli("emulate", "--nodes", "2", "--cpu", "0.5", "--", "comm", "bench")
    assert res.returncode == 3, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("distval: error: --cpu needs the cgroup cpu "
                                                                   "controller, and this host has none mounted")


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
CPU = cgroup.find_controller()
needs_cpu_controller = pytest.mark.skipif(CPU is None, reason="no cgroup cpu controller is mounted")


def _our_cgroups() -> set[str]:
    return set(cgroup.children(CPU, netns.PREFIX)) if CPU else set()


@pytest.fixture
def no_leftovers():
    """Every emulate the test started is a child of this process: after the test, no namespace
    or CPU cgroup of a dead owner may remain, and the test's own are removed if it left any (then
    it fails)."""
    before, before_cgroups = set(netns.list_namespaces()), _our_cgroups()
    yield
    stray = [n for n in netns.list_namespaces() if n not in before and n.startswith(netns.PREFIX)]
    for name in stray:
        netns.remove_namespace(name)
    stray_cgroups = sorted(_our_cgroups() - before_cgroups)
    for name in stray_cgroups:
        cgroup.remove(CPU.root / name)
    assert not stray and not stray_cgroups, f"left behind: namespaces {stray}, cgroups {stray_cgroups}"


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
    """Namespaces and (where a cpu controller is mounted) CPU cgroups of a dead owner go; those
    of a live owner stay."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"dv-{dead.pid}-n0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    (netns.NETNS_ETC / name).mkdir(parents=True, exist_ok=True)
    (netns.NETNS_ETC / name / "hosts").write_text("127.0.0.1 localhost\n")
    live = f"dv-{os.getpid()}-n9"  # owner alive: never touched
    subprocess.run(["ip", "netns", "add", live], check=True)
    groups = [cgroup.create(CPU, n, 0.5) for n in (name, live)] if CPU else []
    try:
        assert name in netns.leftovers() and live not in netns.leftovers()
        assert netns.leftover_cgroups() == groups[:1]
        res = run_cli("emulate", "--clean", timeout=60)
        assert res.returncode == 0 and name in res.stdout, res.stderr
        assert name not in netns.list_namespaces() and not (netns.NETNS_ETC / name).exists()
        assert live in netns.list_namespaces()
        if CPU:
            assert str(groups[0]) in res.stdout and not groups[0].exists() and groups[1].exists()
    finally:
        netns.remove_namespace(live)
        netns.remove_namespace(name)
        for path in groups:
            cgroup.remove(path)


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


def _cpu_quota(path: Path) -> tuple[int, int]:
    """(quota, period) in us, from either hierarchy's files."""
    if CPU.version == 2:
        quota, period = (path / "cpu.max").read_text().split()
        return int(quota), int(period)
    return int((path / "cpu.cfs_quota_us").read_text()), int((path / "cpu.cfs_period_us").read_text())


def _throttled(path: Path) -> int:
    """Periods in which the cgroup used up its quota and was held back (cpu.stat, v1 and v2)."""
    stat = dict(line.split() for line in (path / "cpu.stat").read_text().splitlines() if line.strip())
    return int(stat.get("nr_throttled", 0))


def _is_worker(pid: int) -> bool:
    """A worker torchrun started (`python -u -m distval.cli.node ...`), not the agent, whose
    arguments end with the same module."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"distval.cli.node" in args and b"distval.emulate.agent" not in args


@needs_netns
@needs_cpu_controller
def test_cpu_limit_per_node(tmp_path, no_leftovers):
    """`--cpu 1,0.25`: each node's worker (not only its torchrun) sits in the node's cgroup,
    dv-<pid>-n<i>, with that node's quota, and the quarter-core node is being throttled. Then
    SIGTERM: the run stops (130) and takes its cgroups with it. (A normal end leaves by the same
    clean-up; stopping once the limit is seen saves the slow node's seconds of work at 1/4 core.)"""
    cmd = [sys.executable, "-m", "distval", "emulate", "--nodes", "2", "--cpu", "1,0.25", "--",
           "comm", "check", "--ops", "all_reduce", "-d", "int64", "--counts", "5"]
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
    paths = [CPU.root / f"dv-{proc.pid}-n{i}" for i in (0, 1)]
    seen: dict[int, tuple] = {}  # node -> (quota, period, worker pids in its cgroup, throttled periods)
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline and not (len(seen) == 2 and seen[1][3] > 0):
            for i, path in enumerate(paths):
                try:
                    workers = [p for p in cgroup.pids(path) if _is_worker(p)]
                    if workers:
                        seen[i] = (*_cpu_quota(path), workers, _throttled(path))
                except (OSError, ValueError):  # the cgroup went away between two reads
                    continue
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout, stderr = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert f"cpu 1,0.25 core(s) per node (cgroup v{CPU.version}" in stdout.splitlines()[0], stdout[:2000]
    assert set(seen) == {0, 1}, (seen, stdout[-2000:], stderr[-2000:])
    assert seen[0][:2] == (100_000, 100_000) and seen[1][:2] == (25_000, 100_000)
    assert seen[1][3] > 0, seen  # importing torch needs more than a quarter of a core
    assert proc.returncode == 130 and "interrupted; stopping the nodes" in stderr, stderr[-2000:]
    assert not any(p.exists() for p in paths)


@needs_netns
def test_one_slow_link_sets_the_pace(tmp_path, no_leftovers):
    """`--rate 1gbit,250mbit`: a 2-node all_reduce crosses node 1's link both ways, so it runs at
    250 mbit (31 MB/s, ~30 MB/s of TCP payload), well below 1 gbit's 117 MB/s."""
    out = tmp_path / "bench.json"
    res = run_cli("emulate", "--nodes", "2", "--rate", "1gbit,250mbit", "--", "comm", "bench", "--ops", "all_reduce",
                  "-b", "1M", "-e", "4M", "-n", "3", "-w", "1", "-c", "0", "--no-call-cost", "--json", str(out),
                  timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "1gbit,250mbit per direction" in res.stdout.splitlines()[0]
    doc = json.loads(out.read_text())
    emulated = doc["meta"]["emulated"]
    assert emulated["rate"] == "1gbit,250mbit" and emulated["rate_bits_per_s"] == [10**9, 250 * 10**6]
    largest = [r for r in doc["tables"]["bench"]["rows"] if r["bytes"] == 4 * 2**20]
    busbw = max(r["busbw_gbps"] for r in largest)
    assert 0.80 * 0.03125 <= busbw <= 1.05 * 0.03125, largest


# -- comm pairs on a cluster with one bad link or one slow node (docs/scaling.md) ------------------------------


def _pairs(tmp_path, *emulate: str, bisect: bool = False) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "pairs.json"
    res = run_cli("emulate", "--nodes", "4", *emulate, "--", "comm", "pairs", "-b", "1M", "-n", "8",
                  *(["--bisect"] if bisect else []), "--json", str(out), timeout=180)
    assert out.exists(), res.stdout[-3000:] + res.stderr[-3000:]
    return res, json.loads(out.read_text())


def _named(doc: dict) -> list[str]:
    return [c["name"] for c in doc["checks"] if c["status"] != "OK"]


@pytest.mark.alone  # 1 Gbit emulated links run at the host CPU's pace: another test's load skews them
@needs_netns
def test_pairs_names_the_node_whose_link_is_slow_and_nothing_else(tmp_path, no_leftovers):
    """Node 2's link at a quarter of the others': its three pairs at ~0.03 GB/s, named as its link
    against the median of the nodes; no other node, no single link, no compute."""
    res, doc = _pairs(tmp_path, "--rate", "1gbit,1gbit,250mbit,1gbit")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert _named(doc) == ["comm.pairs node 2 link"], doc["checks"]
    finding = doc["checks"][0]
    assert "node 2 (" in finding["summary"] and "to every peer against a median of" in finding["summary"]
    assert finding["summary"].endswith("its link") and finding["where"] == {"node": 2}
    rows = doc["tables"]["pairs"]["rows"]
    assert len(rows) == 6 and sorted({r["round"] for r in rows}) == [0, 1, 2]  # 3 rounds of 2 pairs
    slow = [r for r in rows if 2 in (r["node_a"], r["node_b"])]
    assert all(0.02 < r["a_to_b_gbps"] < 0.04 and 0.02 < r["b_to_a_gbps"] < 0.04 for r in slow), slow
    shares = {r["node"]: r["pair_share"] for r in doc["tables"]["pair_nodes"]["rows"]}
    assert shares[2] < 0.4 and all(shares[n] > 0.8 for n in (0, 1, 3)), shares


@pytest.mark.alone  # 1 Gbit emulated links run at the host CPU's pace: another test's load skews them
@needs_netns
def test_pairs_on_a_uniform_cluster_names_nothing(tmp_path, no_leftovers):
    res, doc = _pairs(tmp_path, "--rate", "1gbit")
    assert res.returncode == 0 and _named(doc) == [], doc["checks"]
    assert "no node, link or rank under 0.7x the median of its peers" in doc["checks"][0]["summary"]


@pytest.mark.alone  # 1 Gbit emulated links run at the host CPU's pace: another test's load skews them
@needs_netns
@needs_cpu_controller
def test_pairs_names_a_slow_hosts_compute_not_its_link(tmp_path, no_leftovers):
    """Node 1 held to a quarter of a core, every link equal: its compute is named, no link (its
    transfers may be slower too: a starved host sends slowly)."""
    res, doc = _pairs(tmp_path, "--rate", "1gbit", "--cpu", "2,0.25,2,2")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert _named(doc) == ["comm.pairs node 1 compute"], doc["checks"]
    assert "compute" in doc["checks"][0]["summary"] and doc["checks"][0]["summary"].endswith("not a link")


@pytest.mark.alone  # 1 Gbit emulated links run at the host CPU's pace: another test's load skews them
@needs_netns
def test_bisection_finds_the_slow_node_in_log2_rounds(tmp_path, no_leftovers):
    """4 nodes: halves {0,1} and {2,3}, then {2} and {3} each with a cleared witness (node 0)."""
    res, doc = _pairs(tmp_path, "--rate", "1gbit,1gbit,250mbit,1gbit", bisect=True)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    rounds = doc["tables"]["pair_bisect"]["rows"]
    assert [(r["half_a"], r["half_b"], r["slower"]) for r in rounds] == [("0,1", "2,3", 1), ("2", "3", 0)]
    assert _named(doc) == ["comm.pairs node 2 bisect"]
    assert "the slower half at every one of 2 rounds" in doc["checks"][0]["summary"]
