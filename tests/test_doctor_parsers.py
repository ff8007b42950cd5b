"""The doctor's readers and rules without processes: the topology matrix, the NCCL log, the two
socket-interface grammars, and the comparison across ranks (fed with facts as ranks report them)."""

import socket
from pathlib import Path

import pytest

from distval.doctor import net, ranks
from distval.doctor.nccl_log import load_nccl_log, nccl_checks, parse_nccl_log
from distval.doctor.net import Interface
from distval.doctor.topo import parse_topo, topo_checks
from distval.doctor.topofile import load_topo
from distval.results import Status

DATA = Path(__file__).parent / "data"


def by_name(checks):
    return {c.name: c for c in checks}


# -- topology --------------------------------------------------------------------------------------


def test_seed_002_matrix_reads_every_cell_and_the_nic_legend():
    topo = load_topo(DATA / "topo_2xL4_sys.txt")
    assert topo.gpus == ["GPU0", "GPU1"] and topo.nics == ["NIC0", "NIC1", "NIC2"]
    assert topo.link("GPU0", "GPU1") == topo.link("GPU1", "GPU0") == "SYS"
    assert [topo.link("GPU1", n) for n in topo.nics] == ["NODE", "NODE", "SYS"]
    assert topo.link("NIC0", "NIC1") == "PIX"
    assert topo.nic_names == {"NIC0": "mlx5_2", "NIC1": "mlx5_3", "NIC2": "mlx5_bond_0"}
    assert topo.affinity["GPU1"]["cpu_affinity"] == "32-63,96-127" and topo.affinity["GPU1"]["numa_affinity"] == "1"


def test_seed_002_topology_flags_the_sys_pair_and_finds_each_gpus_nic():
    checks = by_name(topo_checks(load_topo(DATA / "topo_2xL4_sys.txt"), {}))
    paths = checks["doctor.topo gpu-paths"]
    assert paths.status is Status.WARN and paths.where["pairs"] == ["GPU0-GPU1"]
    assert "NCCL_P2P_DISABLE=1" in paths.hint and "NCCL_P2P_LEVEL" in paths.hint
    nics = checks["doctor.topo nic-affinity"]
    assert nics.status is Status.OK
    assert nics.details["nearest"] == {"GPU0": {"nics": ["mlx5_bond_0"], "link": "NODE"},
                                       "GPU1": {"nics": ["mlx5_2", "mlx5_3"], "link": "NODE"}}


def test_p2p_disable_or_a_safe_level_turns_the_sys_warning_into_ok():
    topo = load_topo(DATA / "topo_2xL4_sys.txt")
    for env in ({"NCCL_P2P_DISABLE": "1"}, {"NCCL_P2P_LEVEL": "NODE"}):
        check = by_name(topo_checks(topo, env))["doctor.topo gpu-paths"]
        assert check.status is Status.OK and "keeps P2P off GPU0-GPU1" in check.summary
    assert by_name(topo_checks(topo, {"NCCL_P2P_LEVEL": "SYS"}))["doctor.topo gpu-paths"].status is Status.WARN


def test_nvlink_node_and_pcie_workstation():
    h100 = load_topo(DATA / "topo_8xH100_nvlink.txt")
    assert len(h100.gpu_pairs()) == 28 and {link for *_, link in h100.gpu_pairs()} == {"NV18"}
    checks = by_name(topo_checks(h100, {}))
    assert checks["doctor.topo gpu-paths"].status is Status.OK
    assert checks["doctor.topo nic-affinity"].details["nearest"]["GPU5"] == {"nics": ["mlx5_2"], "link": "PXB"}
    pcie = by_name(topo_checks(load_topo(DATA / "topo_4gpu_pcie_phb.txt"), {}))
    assert pcie["doctor.topo gpu-paths"].status is Status.WARN
    assert pcie["doctor.topo gpu-paths"].where["pairs"] == [
        "GPU0-GPU2 PHB",
        "GPU0-GPU3 PHB",
        "GPU1-GPU2 PHB",
        "GPU1-GPU3 PHB",
    ]
    assert pcie["doctor.topo nic-affinity"].status is Status.SKIP


def test_gpu_without_a_nic_on_its_socket_and_an_hca_that_matches_nothing():
    text = (
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tSYS\tPIX\t0-15\t0\nGPU1\tSYS\t X \tSYS\t16-31\t1\nNIC0\tPIX\tSYS\t X \n"
        "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
    )
    topo = parse_topo(text)
    check = by_name(topo_checks(topo, {}))["doctor.topo nic-affinity"]
    assert check.status is Status.WARN and check.where == {"gpus": ["GPU1"]}
    check = by_name(topo_checks(topo, {"NCCL_IB_HCA": "=mlx5_4"}))["doctor.topo nic-affinity"]
    assert check.status is Status.WARN and "matches none" in check.summary


def test_space_separated_copy_with_colour_codes_and_old_soc_name_parses():
    text = ("\x1b[4m        GPU0    GPU1    CPU Affinity\x1b[0m\n"
            "GPU0     X      SOC     0-7\nGPU1    SOC      X      8-15\n")
    topo = parse_topo(text)
    assert topo.link("GPU0", "GPU1") == "SYS" and topo.affinity["GPU0"] == {"cpu_affinity": "0-7"}


@pytest.mark.parametrize("name, message", [
    ("topo_not_a_matrix.txt", "no `nvidia-smi topo -m` matrix"),
    ("topo_bad_cell.txt", "line 3: GPU1/GPU0 is 'SYX', not a topology link"),
])
def test_unparsable_topology_names_the_line(name, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("`", "`")):
        load_topo(DATA / name)


def test_x_off_the_diagonal_and_missing_rows_are_rejected():
    with pytest.raises(ValueError, match="X belongs on the diagonal"):
        parse_topo("\tGPU0\tGPU1\nGPU0\t X \t X \nGPU1\tSYS\t X \n")
    with pytest.raises(ValueError, match="no row for GPU1"):
        parse_topo("\tGPU0\tGPU1\nGPU0\t X \tSYS\n")


# -- NCCL log -------------------------------------------------------------------------------------


def test_seed_002_log_reads_transports_rings_gdr_and_interface():
    log = load_nccl_log(DATA / "nccl_2xL4_p2p_cumem.log")
    assert log.version == "2.21.5+cuda12.4" and log.num_ranks == 2 and log.num_nodes == 1
    assert [(c.channel, c.src_rank, c.dst_rank, c.transport) for c in log.connections] == [
        (0, 1, 0, "P2P/CUMEM"), (0, 0, 1, "P2P/CUMEM"), (1, 1, 0, "P2P/CUMEM"), (1, 0, 1, "P2P/CUMEM")]
    assert log.rings == {0: "0 1", 1: "0 1"} and log.num_trees == 2 and log.gdr is True
    assert log.socket_ifs == [{"index": "0", "interface": "eth0", "address": "172.19.0.2", "host": "l4-pod"}]
    assert log.network == "Socket" and log.hosts == {0: "l4-pod", 1: "l4-pod"}


def test_seed_002_pattern_fails_only_with_a_sys_topology():
    log = load_nccl_log(DATA / "nccl_2xL4_p2p_cumem.log")
    fail = by_name(nccl_checks(log, load_topo(DATA / "topo_2xL4_sys.txt")))["doctor.nccl p2p-paths"]
    assert fail.status is Status.FAIL and "P2P/CUMEM" in fail.summary and "SYS" in fail.summary
    assert fail.where == {"host": "l4-pod", "rank": 1, "peer": 0, "gpus": "GPU1->GPU0", "line": 30}
    assert "NCCL_P2P_DISABLE=1" in fail.hint and "NCCL_P2P_LEVEL" in fail.hint
    assert {c["gpus"] for c in fail.details["connections"]} == {"GPU0->GPU1", "GPU1->GPU0"}
    # the same log on an NVLink machine is fine; without a topology the check says what it needs
    assert (
        by_name(nccl_checks(log, load_topo(DATA / "topo_8xH100_nvlink.txt")))["doctor.nccl p2p-paths"].status
        is Status.OK
    )
    skip = by_name(nccl_checks(log, None))["doctor.nccl p2p-paths"]
    assert skip.status is Status.SKIP and "--topo-file" in skip.summary


def test_after_the_fix_the_log_shows_shm_and_passes():
    log = load_nccl_log(DATA / "nccl_2xL4_p2p_disabled.log")
    assert {c.transport for c in log.connections} == {"SHM"} and log.env == {"NCCL_P2P_DISABLE": "1"}
    checks = by_name(nccl_checks(log, load_topo(DATA / "topo_2xL4_sys.txt")))
    assert checks["doctor.nccl p2p-paths"].status is Status.OK and log.gdr is False


def test_two_node_ib_log():
    log = load_nccl_log(DATA / "nccl_2node_ib_gdr.log")
    checks = by_name(nccl_checks(log, load_topo(DATA / "topo_8xH100_nvlink.txt")))
    assert log.num_nodes == 2 and log.network == "IB" and log.version == "2.20.5+cuda12.4"
    counts = checks["doctor.nccl transports"].details["transports"]
    assert counts == {"NET/IB": 8, "P2P/IPC": 4}
    assert all(c.gdr for c in log.connections if c.transport == "NET/IB")
    assert {(h["hca"], h["link"]) for h in log.ib_hcas} == {("mlx5_0", "IB"), ("mlx5_1", "IB")}
    assert checks["doctor.nccl network"].status is Status.OK and "mlx5_0:1/IB" in checks["doctor.nccl network"].summary
    assert (
        checks["doctor.nccl p2p-paths"].status is Status.OK
        and "GPU0-GPU1 NV18" in checks["doctor.nccl p2p-paths"].summary
    )


def test_socket_over_docker0_and_warn_lines():
    checks = by_name(nccl_checks(load_nccl_log(DATA / "nccl_2node_socket_docker0.log"), None))
    network = checks["doctor.nccl network"]
    assert (
        network.status is Status.WARN
        and network.where == {"interface": "docker0"}
        and "NCCL_SOCKET_IFNAME" in network.hint
    )
    warn = checks["doctor.nccl warnings"]
    assert warn.status is Status.WARN and "Connect to 172.17.0.1<43517> failed" in warn.summary


def test_loopback_between_nodes_fails():
    log = parse_nccl_log("a:1:1 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>\n"
                         "a:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n")
    check = by_name(nccl_checks(log, None))["doctor.nccl network"]
    assert check.status is Status.FAIL and check.where == {"interface": "lo"}


def test_old_bus_id_devices_are_not_matched_to_gpu_indices():
    log = parse_nccl_log("h:1:2 [0] NCCL INFO Channel 00 : 0[7000] -> 1[a000] via P2P/IPC/read\n")
    assert log.connections[0].transport == "P2P/IPC"
    check = by_name(nccl_checks(log, load_topo(DATA / "topo_2xL4_sys.txt")))["doctor.nccl p2p-paths"]
    assert check.status is Status.SKIP and "bus id" in check.summary


def test_not_an_nccl_log():
    with pytest.raises(ValueError, match="no NCCL lines"):
        load_nccl_log(DATA / "not_an_nccl_log.log")


# -- socket interface variables ---------------------------------------------------------------------


IFACES = [Interface("lo", True, "UNKNOWN", 65536, ["127.0.0.1/8"], loopback=True),
          Interface("eth0", True, "UP", 1500, ["10.0.0.5/24"]),
          Interface("docker0", True, "UP", 1500, ["172.17.0.1/16"]),
          Interface("eth1", False, "DOWN", 1500, ["10.1.0.5/24"]),
          Interface("ib0", True, "UP", 2044, [])]
ROUTE = {"addr": "10.0.0.1", "dev": "eth0", "src": "10.0.0.5", "gateway": None, "local": False}


@pytest.mark.parametrize("gloo, status, text", [
    (None, Status.OK, "not set"),
    ("eth0", Status.OK, "Gloo binds eth0 (10.0.0.5)"),
    ("^lo", Status.FAIL, "NCCL's '^' syntax"),
    ("=eth0", Status.FAIL, "NCCL's '=' syntax"),
    ("eth0, docker0", Status.FAIL, "has spaces"),
    ("eth9", Status.FAIL, "no interface eth9"),
    ("ib0", Status.FAIL, "ib0 has no address"),
    ("eth1", Status.FAIL, "eth1 is down"),
    ("lo", Status.FAIL, "lo is loopback"),
    ("docker0", Status.WARN, "leaves by eth0, not docker0"),
    ("eth0,", Status.OK, "Gloo binds eth0"),
])
def test_gloo_grammar_and_interfaces(gloo, status, text):
    env = {} if gloo is None else {"GLOO_SOCKET_IFNAME": gloo}
    check = net.check_socket_ifname(env, IFACES, ROUTE)[0]
    assert check.name == "doctor.net GLOO_SOCKET_IFNAME" and check.status is status and text in check.summary


@pytest.mark.parametrize("nccl, status, selected", [
    ("eth", Status.OK, ["eth0"]),  # prefix; eth1 is down
    ("=eth0", Status.OK, ["eth0"]),
    ("^docker,lo", Status.OK, ["eth0"]),
    ("^=docker0", Status.WARN, ["lo", "eth0"]),  # keeps lo for traffic between hosts
    ("^lo", Status.WARN, ["eth0", "docker0"]),
    ("=eth", Status.FAIL, []),  # exact: no interface is called eth
    ("docker", Status.WARN, ["docker0"]),
    ("eth0:5000", Status.OK, ["eth0"]),
])
def test_nccl_grammar_selection(nccl, status, selected):
    check = net.check_socket_ifname({"NCCL_SOCKET_IFNAME": nccl}, IFACES, ROUTE)[1]
    assert check.status is status, check.summary
    assert check.details.get("selected", []) == selected


@pytest.mark.parametrize("value, message", [
    ("eth0,^lo", "inside the list"), ("eth0,=eth1", "inside the list"), ("^", "names no interface"),
    ("eth 0", "not an interface name"), ("eth0:x", "not an interface name"),
])
def test_nccl_grammar_errors(value, message):
    with pytest.raises(ValueError, match=message):
        net.parse_nccl_ifname(value)
    check = net.check_socket_ifname({"NCCL_SOCKET_IFNAME": value}, IFACES, ROUTE)[1]
    assert check.status is Status.FAIL and message in check.summary


def test_decoys_warn_until_both_variables_pin_the_route_interface():
    check = net.check_decoys(IFACES, ROUTE, {})
    assert check.status is Status.WARN and check.where == {"interfaces": ["docker0"]}
    assert "GLOO_SOCKET_IFNAME=eth0" in check.hint and "NCCL_SOCKET_IFNAME==eth0" in check.hint
    assert net.check_decoys(IFACES, ROUTE, {"GLOO_SOCKET_IFNAME": "eth0"}).status is Status.WARN
    assert (
        net.check_decoys(IFACES, ROUTE, {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth0"}).status
        is Status.OK
    )
    loop = {"addr": "127.0.0.1", "dev": "lo", "src": "127.0.0.1", "gateway": None, "local": True}
    assert net.check_decoys(IFACES, loop, {}).status is Status.OK  # a single-host job


def test_nccl_auto_detection_order():
    assert net.nccl_auto_candidates(IFACES) == ["eth0"]  # docker* and lo only as a last resort
    assert net.nccl_auto_candidates([IFACES[0], IFACES[2]]) == ["docker0"]
    with_ib = IFACES + [Interface("ib1", True, "UP", 2044, ["10.2.0.5/24"])]
    assert net.nccl_auto_candidates(with_ib) == ["ib1"]


def test_hostname_checks_against_this_hosts_addresses():
    ifaces = net.interfaces()
    check = net.check_hostname(ifaces, "localhost")
    assert check.status is Status.WARN and "loopback" in check.summary and "--local-addr" in check.hint
    assert net.check_hostname(ifaces, "no-such-host.invalid").status is Status.WARN


def test_hostname_on_another_interface_than_the_route_to_master_is_the_decoy_case(monkeypatch):
    ifaces = [
        Interface("eth0", True, "UP", 1500, ["10.77.0.2/24"]),
        Interface("decoy0", True, "UP", 1500, ["10.78.0.2/24"]),
    ]
    monkeypatch.setattr(net, "resolve", lambda host: ["10.78.0.2"])
    check = net.check_hostname(ifaces, "node1", {"dev": "eth0"})
    assert check.status is Status.WARN and "decoy0" in check.summary and "GLOO_SOCKET_IFNAME=eth0" in check.hint
    assert net.check_hostname(ifaces, "node1", {"dev": "decoy0"}).status is Status.OK
    assert net.check_hostname(ifaces, "node1").status is Status.OK  # no route known: nothing to compare


# -- comparison across ranks --------------------------------------------------------------------------


def facts(host="a", torch="2.13.0", python="3.11.7", nccl=None, env=None, dev="eth0", mtu=1500):
    return {
        "hostname": host,
        "versions": {"distval": "0.1", "python": python, "torch": torch, "nccl": nccl, "cuda": None},
        "env": env or {},
        "route_dev": dev,
        "route_mtu": mtu,
        "interfaces": {dev: mtu},
    }


def test_version_mismatch_is_a_failure_python_alone_a_warning():
    check = ranks.check_versions({0: facts(), 1: facts(torch="2.12.1")})
    assert check.status is Status.FAIL and "torch: 2.13.0 on rank 0, 2.12.1 on rank 1" in check.summary
    check = ranks.check_versions({0: facts(), 1: facts(), 2: facts(python="3.12.1")})
    assert check.status is Status.WARN and check.where == {"keys": ["python"]}
    assert ranks.check_versions({0: facts(), 1: facts()}).status is Status.OK


def test_interface_name_and_mtu_differences_across_hosts():
    check = ranks.check_interfaces({0: facts("a"), 1: facts("b", dev="enp5s0", mtu=9000)})
    assert (
        check.status is Status.WARN
        and "eth0 on a, enp5s0 on b" in check.summary
        and "MTU 1500 on a, 9000 on b" in check.summary
    )
    assert ranks.check_interfaces({0: facts("a"), 1: facts("a")}).status is Status.OK


def test_rendezvous_probe_names_loopback_bindings_across_hosts():
    infos = [{"rank": 0, "host": "a", "local_rank": 0, "pid": 1}, {"rank": 1, "host": "b", "local_rank": 0, "pid": 2}]
    bound = [{"listen": ["10.0.0.5:4000"], "addresses": ["10.0.0.5"], "store": "10.0.0.5", "peers": []},
             {"listen": ["127.0.0.1:4001"], "addresses": ["127.0.0.1"], "store": "10.0.0.6", "peers": []}]
    results = [{"seen": [0, 1], "bound": b, "facts": facts(h)} for b, h in zip(bound, "ab")]
    check = ranks.check_rendezvous(results, infos, 2, None)
    assert check.status is Status.FAIL and check.where == {"ranks": [1]}
    assert ranks.check_rendezvous(results, infos, 2, 3).status is Status.FAIL
    results[1]["bound"] = dict(bound[0], addresses=["10.0.0.6"])
    assert ranks.check_rendezvous(results, infos, 2, 2).status is Status.OK


def test_bound_sockets_reads_this_processes_listener_from_the_kernel():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            got = ranks.bound_sockets(store_port=None)
            assert f"127.0.0.1:{port}" in got["listen"] and "127.0.0.1" in got["addresses"]
            assert ranks.bound_sockets(store_port=port)["store"] == "127.0.0.1"
            assert client.getsockname()[0] == "127.0.0.1"


def test_check_socket_ifname_finds_the_route_from_master_addr():
    """What the launcher's pre-flight calls: only the environment."""
    gloo, nccl = net.check_socket_ifname(
        {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "=lo"}
    )
    assert gloo.status is Status.OK and nccl.status is Status.OK
    assert net.interface_for("127.0.0.1") == "lo" and net.interface_for("no-such-host.invalid") is None
    gloo, _ = net.check_socket_ifname({"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "no-such-if0"})
    assert gloo.status is Status.FAIL and "no interface no-such-if0" in gloo.summary


def test_without_iproute2_the_same_interfaces_and_routes(monkeypatch):
    """The fallback (socket module, /sys, /proc, ioctls, a connected UDP socket) against `ip -j`."""
    with_ip = net.interfaces()
    which = net.shutil.which
    monkeypatch.setattr(net.shutil, "which", lambda name: None if name == "ip" else which(name))
    without = net.interfaces()
    assert [(i.name, i.up, i.mtu, i.loopback) for i in without] == [(i.name, i.up, i.mtu, i.loopback) for i in with_ip]
    for a, b in zip(with_ip, without):
        v4 = [x for x in a.addresses if ":" not in x]
        assert [x for x in b.addresses if ":" not in x] == v4[
            :1
        ]  # the ioctl gives the first IPv4 address with its prefix
        assert {x for x in b.addresses if ":" in x} == {x for x in a.addresses if ":" in x}
    monkeypatch.setattr(net.shutil, "which", which)
    targets = ["127.0.0.1"] + [i.ips[0] for i in with_ip if i.up and i.ips and not i.loopback]
    expected = [net.route_to(t, with_ip)["dev"] for t in targets]
    monkeypatch.setattr(net.shutil, "which", lambda name: None if name == "ip" else which(name))
    assert [net.route_to(t, without)["dev"] for t in targets] == expected


def test_report_of_two_hosts_keeps_every_hosts_checks_and_interfaces():
    """Rank 0's report from what two hosts' first ranks sent (their facts as this host has them)."""
    import copy

    from distval.doctor.config import DoctorConfig
    from distval.doctor.report import build_ranks_report, host_checks
    from distval.launch import JobResult

    cfg = DoctorConfig(master_addr="127.0.0.1")
    checks, host_facts = host_checks(cfg)
    results, infos = [], []
    for rank, host in enumerate(("node-a", "node-b")):
        hf = copy.deepcopy(host_facts) | {"hostname": host}
        hc = [copy.deepcopy(c) for c in checks]
        for c in hc:
            c.where["host"] = host
        results.append(
            {
                "facts": facts(host, dev="lo"),
                "seen": [0, 1],
                "world_size": 2,
                "host": {"checks": hc, "facts": hf},
                "bound": {
                    "listen": [f"10.0.0.{rank + 1}:4000"],
                    "addresses": [f"10.0.0.{rank + 1}"],
                    "store": None,
                    "peers": [],
                },
            }
        )
        infos.append({"rank": rank, "local_rank": 0, "host": host, "pid": 100 + rank, "device": "cpu"})
    report = build_ranks_report(JobResult("torchrun", "gloo", 2, results, infos), cfg)
    doc = report.to_dict()
    assert [c["where"]["host"] for c in doc["checks"] if c["name"] == "doctor.net hostname"] == ["node-a", "node-b"]
    rows = doc["tables"]["interfaces"]["rows"]
    assert {r["host"] for r in rows} == {"node-a", "node-b"} and len(rows) == 2 * len(host_facts["interfaces"])
    assert set(doc["meta"]["nodes"]) == {"node-a", "node-b"} and doc["meta"]["hosts"] == {"node-a": [0], "node-b": [1]}
    by = by_name(report.checks)
    assert (
        by["doctor.rendezvous"].status is Status.OK
        and "0@node-a 10.0.0.1; 1@node-b 10.0.0.2" in by["doctor.rendezvous"].summary
    )
    assert [r["host"] for r in doc["tables"]["ranks"]["rows"]] == ["node-a", "node-b"]
