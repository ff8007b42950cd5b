"""AMD Instinct and ROCm without an AMD GPU: every parser on real tool outputs (tests/data/rocm,
with their sources in README.md and README_rccl.md), detection with a ROCm torch faked, the
doctor end to end on a simulated 8 x MI300X host (an `amd-smi` stand-in on PATH), RCCL logs, the
ROCm trace of HTA's test data, and the planner's AMD presets and xGMI mesh."""

from __future__ import annotations

import json
import types

import pytest
import torch

from distval import device as devices
from distval import meta
from distval.doctor import amd
from distval.doctor.nccl_log import nccl_checks, parse_nccl_log
from distval.doctor.topofile import load_topo
from distval.plan import presets
from distval.plan.config import PlanConfig
from distval.plan.model import build_network
from distval.report import terminal
from distval.report.views import nccl_text
from distval.results import Report, Status, Table
from distval.rocm import env as rocm_env
from distval.rocm import platform, smi
from distval.trace.report import analyze
from test_trace_analyze import write, x

from conftest import REPO, run_cli

ROCM = REPO / "tests" / "data" / "rocm"
SIM = ROCM / "sim_8xmi300x"
HTA_AMD = REPO / "tests" / "data" / "hta" / "amd_trace"


def text(name: str) -> str:
    return (ROCM / name).read_text()


def by_name(checks):
    return {c.name: c for c in checks}


# -- rocm-smi and amd-smi outputs -----------------------------------------------------------------


def test_rocm_smi_showtopo_of_8_mi300x_is_a_full_xgmi_mesh_over_two_numa_nodes():
    topo = smi.parse_rocm_smi_topo(text("rocmsmi_showtopo_8xmi300x.txt"))
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert set(topo.link_type.values()) == {"XGMI"} and len(topo.link_type) == 56
    assert set(topo.weight.values()) == {15} and set(topo.hops.values()) == {1}
    assert topo.numa == {f"GPU{i}": 0 if i < 4 else 1 for i in range(8)}
    assert not any(topo.crosses_socket(a, b) for a, b, _ in topo.gpu_pairs())  # xGMI crosses no socket
    # the 12-partition MI300 of rocm_smi_lib's known issue: link types under the weight title, XXXX between
    # partitions of one GPU, no weights
    edge = smi.parse_rocm_smi_topo(text("rocmsmi_showtopo_12part_mi300_tpx_error_edgecase.txt"))
    assert len(edge.gpus) == 12 and edge.link("GPU1", "GPU2") == "SAME" and edge.link("GPU0", "GPU1") == "XGMI"
    assert edge.weight == {}
    with pytest.raises(ValueError, match="no 'Link Type between two GPUs' matrix"):
        smi.parse_rocm_smi_topo(text("rocmsmi_showtoponuma_8xmi210.txt"))


def test_rocm_smi_sections_give_product_clocks_power_and_memory():
    gpus = smi.parse_rocm_smi(text("rocmsmi_showallinfo_4xmi300x_vm.txt"))
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    g0 = gpus[0]
    assert (g0.product, g0.driver, g0.sclk_mhz, g0.sclk_max_mhz, g0.busy_pct, g0.power_cap_w, g0.power_w, g0.temp_c) \
        == ("AMD Instinct MI300X OAM", "6.7.0", 137.0, 2100.0, 0.0, 750.0, 133.0, 35.0)
    assert platform.product_named(g0.product) == "MI300X"
    mi300a = smi.parse_rocm_smi(text("rocmsmi_showproductname_4xmi300a.txt"))
    assert {(g.product, g.arch) for g in mi300a} == {("Aqua Vanjaram [Instinct MI300A]", "gfx942")}
    assert platform.product_named(mi300a[0].product) == "MI300A"
    vram = smi.parse_rocm_smi(text("rocmsmi_use_meminfo_vram_8xmi308x.txt"))
    assert len(vram) == 8 and vram[0].vram_bytes == 206141652992 and vram[0].busy_pct == 0.0
    with pytest.raises(ValueError, match="no `GPU\\[i\\]"):
        smi.parse_rocm_smi("hello\n")


def test_amd_smi_topology_in_every_format():
    topo = smi.parse_amd_smi_topology(text("amdsmi_topology_8xmi300x.txt"))
    assert len(topo.gpus) == 8 and set(topo.link_type.values()) == {"XGMI"} and set(topo.weight.values()) == {15}
    assert topo.bus_ids["GPU0"] == "0000:0c:00.0" and topo.gpu_for_bus("c000") == "GPU0"  # RCCL prints 0[c000]
    assert topo.gpu_for_bus("df000") == "GPU7" and topo.gpu_for_bus("4a000") is None
    old = smi.parse_amd_smi_topology(text("amdsmi_topology_2gpu_pcie_old_format.json"))
    assert (old.link("GPU0", "GPU1"), old.weight[("GPU0", "GPU1")], old.hops[("GPU0", "GPU1")]) == ("PCIE", 40, 2)
    new = smi.parse_amd_smi_topology(text("amdsmi_topology_a_t_2gpu_pcie.json"))
    assert new.link("GPU1", "GPU0") == "PCIE" and new.bus_ids == {"GPU0": "0000:08:00.0", "GPU1": "0000:44:00.0"}
    for bad in ("amdsmi_topology_cndz_8xmi300x.txt", "amdsmi_list_2gpu_kfd.txt"):
        with pytest.raises(ValueError, match="no link types"):
            smi.parse_amd_smi_topology(text(bad))


def test_amd_smi_static_and_metric_json_and_text():
    (mi210,) = smi.parse_amd_smi(static=text("amdsmi_static_mi210_gpu_data.json"))  # {"gpu_data": [...]}, 26.x
    assert (mi210.product, mi210.arch, mi210.numa_node, mi210.power_cap_w) == ("AMD Instinct MI210", "gfx90a", 1, 300.0)
    assert mi210.vram_bytes == 65520 * 2**20  # amd-smi's "MB" are MiB
    (mi300a,) = smi.parse_amd_smi(static=text("amdsmi_static_mi300a_docs.txt"))
    assert (mi300a.product, mi300a.arch, mi300a.bus_id, mi300a.driver, mi300a.numa_node) == (
        "AMD Instinct MI300A", "gfx942", "0000:01:00.0", "6.14.4", 0)
    (idle,) = smi.parse_amd_smi(metric=text("amdsmi_metric_clock_1gpu_mi300.txt"))
    assert idle.sclk_max_mhz == 1800.0 and 112 < idle.sclk_mhz < 114  # the mean over the 8 XCDs
    (busy,) = smi.parse_amd_smi(metric=text("amdsmi_metric_mi300x_blog_truncated.txt"))
    assert (busy.busy_pct, busy.power_w, busy.sclk_max_mhz, busy.throttled) == (100.0, 234.0, 2102.0, [])
    (power,) = smi.parse_amd_smi(metric=text("amdsmi_metric_power_json_1gpu.json"))
    assert power.power_w == 10.0 and power.throttled == []  # "UNTHROTTLED"
    (ecc,) = smi.parse_amd_smi(metric=text("amdsmi_metric_ecc_blocks_1gpu_truncated.txt"))
    assert (ecc.ecc_correctable, ecc.ecc_uncorrectable) == (0, 0)
    with pytest.raises(ValueError, match="not valid JSON"):
        smi.parse_amd_smi(static='[{"gpu": 0,')
    with pytest.raises(ValueError, match="per-GPU JSON"):
        smi.parse_amd_smi(static=text("amdsmi_static_json_vram_fragment_mi300x.json"))


# -- the platform: products, versions, visibility ------------------------------------------------


def test_products_by_name_and_by_what_torch_reports():
    assert platform.gfx_arch("gfx942:sramecc+:xnack-") == "gfx942" and platform.gfx_arch("") is None
    assert platform.rocm_version("6.2.41133-dd7f95766") == "6.2" and platform.rocm_version(None) is None
    assert platform.product_named("AMD Instinct MI250X / MI250") == "MI250X"
    assert platform.product_named("MI300X-O") == "MI300X" and platform.product_named("AMD Radeon Graphics") is None
    mib = 2**20
    assert platform.identify("AMD Radeon Graphics", "gfx942:sramecc+:xnack-", 304, 196592 * mib) == "MI300X"
    assert platform.identify("AMD Radeon Graphics", "gfx942", 304, 256 * 10**9) == "MI325X"
    assert platform.identify("AMD Radeon Graphics", "gfx942", 228, 128 * 10**9) == "MI300A"
    # identical to torch: not guessed (MFU is then measured, not looked up)
    assert platform.identify("AMD Radeon Graphics", "gfx90a", 104, 64 * 10**9) is None  # MI210 or an MI250 GCD
    assert platform.identify("AMD Radeon Graphics", "gfx950", 256, 288 * 10**9) is None  # MI350X or MI355X
    assert platform.identify("AMD Instinct MI355X", "gfx950", 256) == "MI355X"


@pytest.mark.parametrize("env, gpus, visible, problem", [
    ({}, 8, [str(i) for i in range(8)], None),
    ({"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1,3"}, 8, ["5", "7"], None),
    ({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}, 8, ["0", "1"], None),
    ({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "2,3"}, 8, ["0", "1"], "disagree"),
    ({"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "4,5"}, 8, None, "leaves 2 GPU(s), numbered 0-1"),
    ({"ROCR_VISIBLE_DEVICES": "9"}, 8, None, "this host has 8"),
    ({"HIP_VISIBLE_DEVICES": "1,1"}, 8, None, "repeats 1"),
    ({"HIP_VISIBLE_DEVICES": "0,gpu1"}, 8, None, "neither a device index nor a GPU UUID"),
    ({"ROCR_VISIBLE_DEVICES": ""}, 8, [], "empty"),
    ({"ROCR_VISIBLE_DEVICES": "GPU-afff74a100001000"}, 8, ["GPU-afff74a100001000"], None),
])
def test_the_visible_devices_variables_as_rocr_hip_and_torch_apply_them(env, gpus, visible, problem):
    vis = platform.visibility(env, gpus)
    assert vis.physical == visible
    assert (problem is None and not vis.problems) or (problem is not None and problem in " ".join(vis.problems))


def test_detection_on_a_rocm_torch(monkeypatch):
    """torch.version.hip set (a ROCm build): RCCL, ROCm 6.2, and an MI300X found by its gfx target
    when the name says only "AMD Radeon Graphics"."""
    monkeypatch.setattr(torch.version, "hip", "6.2.41133-dd7f95766")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert devices.collective_library() == "RCCL" and devices.gpu_runtime() == "ROCm 6.2"
    v = meta.versions()
    assert (v["collectives"], v["runtime"], v["hip"]) == ("RCCL", "ROCm 6.2", "6.2.41133-dd7f95766")
    assert meta.stack_text({**v, "nccl": "2.20.5"}) == "RCCL 2.20.5, ROCm 6.2"
    props = types.SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-", multi_processor_count=304,
                                  total_memory=196592 * 2**20)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "AMD Radeon Graphics")
    identity = devices.gpu_identity(torch.device("cuda", 0))
    assert identity["arch"] == "gfx942:sramecc+:xnack-" and presets.preset_for(identity) == "MI300X"
    assert devices.gpu_identity(torch.device("cpu")) is None
    assert presets.preset_for({"name": "NVIDIA H100 80GB HBM3"}) == "H100"
    # the bench's nccl-tests header names the library the backend "nccl" really is
    versions = {**v, "nccl": "2.20.5"}
    header = nccl_text(Table("bench", [], title="x"), {"world_size": 8, "backend": "nccl", "versions": versions})
    assert header.splitlines()[0] == "# distval comm bench: 8 ranks, RCCL 2.20.5, ROCm 6.2, x"
    report = Report("comm check", meta={"world_size": 8, "backend": "nccl", "versions": versions})
    assert terminal.header(report) == "distval comm check · 8 ranks · backend nccl (RCCL 2.20.5, ROCm 6.2)"


# -- environment variables -------------------------------------------------------------------------


def test_misspelt_rccl_and_hsa_names_and_settings_known_to_hurt():
    found = rocm_env.unknown_names({"RCCL_MSCCL_ENABLED": "0", "HSA_FORCE_FINE_GRAIN_PCI": "1", "RCCL_TREES": "1",
                                    "HSA_OVERRIDE_GFX_VERSION_2": "9.4.2", "NCCL_DEBUG": "INFO",
                                    "RCCL_FROBNICATE": "1"})
    assert [(f.variable, "did you mean" in f.text) for f in found] == [
        ("HSA_FORCE_FINE_GRAIN_PCI", True), ("RCCL_FROBNICATE", False), ("RCCL_MSCCL_ENABLED", True)]
    assert "RCCL_MSCCL_ENABLE?" in found[2].text and "HSA_FORCE_FINE_GRAIN_PCIE?" in found[0].text
    hurt = rocm_env.advice({"NCCL_P2P_DISABLE": "1", "HSA_OVERRIDE_GFX_VERSION": "9.4.2", "HSA_ENABLE_SDMA": "0",
                            "RCCL_MSCCL_ENABLE": "1"}, products=["MI300X"] * 8, gpus_in_job=8, rocm=(6, 4), xgmi=True)
    assert [f.variable for f in hurt] == ["NCCL_P2P_DISABLE", "HSA_OVERRIDE_GFX_VERSION", "HSA_ENABLE_SDMA",
                                          "RCCL_MSCCL_ENABLE"]
    missing = rocm_env.advice({"NCCL_MIN_NCHANNELS": "16"}, products=["MI300X"] * 4, gpus_in_job=4, rocm=(6, 2),
                              xgmi=True)
    assert [f.variable for f in missing] == ["HSA_NO_SCRATCH_RECLAIM", "NCCL_MIN_NCHANNELS"]
    assert rocm_env.advice({"HSA_NO_SCRATCH_RECLAIM": "1", "NCCL_MIN_NCHANNELS": "32"}, products=["MI300X"] * 4,
                           gpus_in_job=4, rocm=(6, 2), xgmi=True) == []
    assert rocm_env.advice({}, products=["MI300X"] * 8, gpus_in_job=8, rocm=(6, 4), xgmi=True) == []


# -- doctor's checks ------------------------------------------------------------------------------


def sim_host() -> amd.AmdHost:
    return amd.AmdHost("amd-smi", smi.parse_amd_smi((SIM / "amd-smi-static.txt").read_text(),
                                                    (SIM / "amd-smi-metric.txt").read_text()), "6.2.2")


def test_doctor_checks_of_the_simulated_host_and_of_real_idle_ones(tmp_path):
    host = sim_host()
    topo = smi.parse_amd_smi_topology((SIM / "amd-smi-topology.txt").read_text())
    topo.numa = {f"GPU{g.index}": g.numa_node for g in host.gpus}
    paths = amd.check_paths(topo, {})
    assert paths.status is Status.WARN and paths.where == {"pairs": ["GPU2-GPU5"]}
    assert "GPU2-GPU5 (hops 3, weight 52) over PCIe while the other 27 pair(s) are xGMI" in paths.summary
    mesh = amd.check_paths(smi.parse_amd_smi_topology(text("amdsmi_topology_8xmi300x.txt")), {})
    assert mesh.status is Status.OK and mesh.summary == "28 GPU pair(s) over XGMI x28, weight 15: a fully connected " \
                                                          "xGMI mesh"
    pcie = smi.parse_amd_smi_topology(text("amdsmi_topology_2gpu_pcie_old_format.json"))
    pcie.numa = {"GPU0": 0, "GPU1": 1}
    assert amd.check_paths(pcie, {}).status is Status.WARN  # PCIe across the sockets
    assert "NCCL_P2P_DISABLE=1 keeps P2P off" in amd.check_paths(pcie, {"NCCL_P2P_DISABLE": "1"}).summary

    clocks = amd.check_clocks(host.gpus)
    assert clocks.status is Status.WARN and clocks.where == {"gpus": [5]}
    assert "GPU5 at 1300 of 2102 MHz" in clocks.summary
    idle = smi.parse_rocm_smi(text("rocmsmi_showallinfo_4xmi300x_vm.txt"))  # 137 of 2100 MHz, but idle
    assert amd.check_clocks(idle).status is Status.OK
    idle[2].power_cap_w = 500.0
    capped = amd.check_clocks(idle)
    assert capped.status is Status.WARN and "GPU2 capped at 500 W, the others up to 750 W" in capped.summary
    host.gpus[3].ecc_uncorrectable = 2
    assert amd.check_ras(host.gpus).status is Status.FAIL and amd.check_ras(idle).status is Status.SKIP

    # NIC placement from sysfs: NICs on NUMA node 0 only leave GPU4-7 far from the network
    for nic, node in (("mlx5_0", 0), ("mlx5_1", 0)):
        (tmp_path / "class" / "infiniband" / nic / "device").mkdir(parents=True)
        (tmp_path / "class" / "infiniband" / nic / "device" / "numa_node").write_text(f"{node}\n")
    far = amd.check_nic_affinity(topo, amd.nic_numa(tmp_path))
    assert far.status is Status.WARN and far.where == {"gpus": ["GPU4", "GPU5", "GPU6", "GPU7"]}
    (tmp_path / "class" / "infiniband" / "mlx5_1" / "device" / "numa_node").write_text("1\n")
    assert amd.check_nic_affinity(topo, amd.nic_numa(tmp_path)).status is Status.OK
    assert amd.check_nic_affinity(topo, {}).status is Status.SKIP

    (tmp_path / "numa_balancing").write_text("1\n")
    assert amd.check_numa_balancing(tmp_path / "numa_balancing").status is Status.WARN


def test_a_rocm_smi_only_host_is_read_and_checked(monkeypatch):
    outputs = {("rocm-smi", "--showallinfo"): text("rocmsmi_showallinfo_4xmi300x_vm.txt"),
               ("rocm-smi", "--showtopo"): text("rocmsmi_showtopo_8xmi300x.txt")}
    monkeypatch.setattr(amd, "tool_name", lambda: "rocm-smi")
    monkeypatch.setattr(amd, "_tool", lambda *args: outputs.get(args))
    host = amd.read_host()
    assert host.tool == "rocm-smi" and len(host.gpus) == 4 and host.rows()[0]["name"] == "AMD Instinct MI300X OAM"
    topo, error = amd.read_topology(host)
    assert error is None and len(topo.gpus) == 8
    checks = by_name(amd.host_checks(host, {}, xgmi=True))
    assert checks["doctor.amd gpus"].summary.startswith("4 x MI300X")
    assert checks["doctor.amd clocks"].status is Status.OK  # idle: low clocks are power saving
    assert checks["doctor.amd env"].where == {"variables": ["NCCL_MIN_NCHANNELS"]}  # 4 MI300X in one job
    outputs[("rocm-smi", "--showtopo")] = "garbage"
    assert amd.read_topology(host)[1].startswith("rocm-smi --showtopo: no 'Link Type")


def test_doctor_on_a_simulated_8_mi300x_host(tmp_path):
    """The issue's case: an `amd-smi` stand-in prints the host's saved output; the doctor shows the
    topology, flags the PCIe pair, the HIP/CUDA visibility conflict and the throttled GPU, and reads
    an RCCL log given as a file; topology files of rocm-smi and amd-smi load as --topo-file."""
    out = tmp_path / "d.json"
    env = {"PATH": f"{SIM}:/usr/bin:/bin", "HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "2,3",
           "RCCL_MSCCL_ENABLED": "0"}
    res = run_cli("doctor", "--json", str(out), "--nccl-log", str(ROCM / "rccl_8gpu_p2p_msccl.log"), env=env,
                  timeout=60)
    doc = json.loads(out.read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert res.returncode == 1, res.stderr  # the visibility conflict is a FAIL
    assert checks["doctor.amd gpus"]["summary"].startswith("8 x MI300X (gfx942), 192 GiB each, ROCm 6.2.2")
    assert checks["doctor.topo gpu-paths"]["status"] == "WARN" and checks["doctor.topo gpu-paths"]["where"]["pairs"] \
        == ["GPU2-GPU5"]
    assert checks["doctor.amd clocks"]["where"]["gpus"] == [5]
    assert checks["doctor.amd visible-devices"]["status"] == "FAIL" and "disagree" in \
        checks["doctor.amd visible-devices"]["summary"]
    assert "did you mean RCCL_MSCCL_ENABLE?" in checks["doctor.amd env"]["summary"]
    assert "RCCL 2.21.5 (ROCm 6.3.0)" in checks["doctor.nccl transports"]["summary"]
    assert "8 rank(s) initialised" in checks["doctor.nccl transports"]["summary"]
    assert "RCCL" in checks["doctor.versions"]["summary"] and len(doc["meta"]["amd"]["gpus"]) == 8
    tables = doc["tables"]
    assert tables["topo"]["rows"][2]["GPU5"] == "PCIE 52" and len(tables["amd_gpus"]["rows"]) == 8
    assert "PCIE 52" in res.stdout and "AMD GPUs (amd-smi)" in res.stdout

    topo = load_topo(ROCM / "rocmsmi_showtopo_8xmi300x.txt")  # --topo-file takes rocm-smi's and amd-smi's too
    assert isinstance(topo, smi.AmdTopology) and amd.check_paths(topo, {}).summary.endswith("a fully connected "
                                                                                              "xGMI mesh")
    assert isinstance(load_topo(SIM / "amd-smi-topology.txt"), smi.AmdTopology)


def test_rccl_logs_of_one_and_two_nodes_and_their_failures():
    eight = parse_nccl_log(text("rccl_8gpu_p2p_msccl.log"))
    assert (eight.library, eight.rocm, len(eight.init_done), eight.num_ranks) == ("RCCL", "6.3.0", 8, 8)
    assert any(m.startswith("MSCCL++: Enabled") for m in eight.msccl)
    assert eight.env["NCCL_SOCKET_IFNAME"] == "eth0" and eight.env["NCCL_IB_DISABLE"] == "0"
    assert {c.transport for c in eight.connections} == {"P2P/IPC"}  # the `comm 0x.. nRanks 08` suffix is cut
    two = parse_nccl_log(text("rccl_2x7900xtx_p2p_ipc.log"))
    assert (two.version.split("-")[0], two.rocm, two.init_s, sorted(two.init_done)) == ("2.27.7", "7.2.0", 4.66, [0, 1])
    socket = parse_nccl_log(text("rccl_2node_socket_mi250x.log"))
    checks = by_name(nccl_checks(socket, None))
    assert socket.num_nodes == 2 and checks["doctor.nccl transports"].summary.startswith("RCCL 2.16.5 (HIP 5.6)")
    warn = checks["doctor.nccl warnings"]
    assert warn.summary.startswith("3 NCCL WARN line(s); 1 communicator(s) aborted, first: [Proxy Service 3] Failed")
    assert len(warn.details["advice"]) == 3 and "iommu=pt" in " ".join(warn.details["advice"])
    roce = parse_nccl_log(text("rccl_2node_roce_ucx_gdrdma_warn.log"))
    assert roce.network == "UCX" and {c.transport for c in roce.connections} == {"NET/UCX"} and roce.connections[0].gdr
    assert "hipIpcGetMemHandle failed" in by_name(nccl_checks(parse_nccl_log(
        text("rccl_warn_hipipc_mi350x_redacted.log")), None))["doctor.nccl warnings"].summary

    # P2P paths through bus ids: the 8-GPU log's devices are bus ids (0[200000]) that a topology keyed by
    # PCI address resolves; a cross-socket PCIe pair among them is the P2P hazard
    topo = smi.parse_amd_smi_topology(text("amdsmi_topology_8xmi300x.txt"))
    topo.bus_ids = {f"GPU{i}": f"000{i + 2}:00:00.0" for i in range(8)}  # what busId 200000..900000 are
    ok = by_name(nccl_checks(eight, topo))["doctor.nccl p2p-paths"]
    assert ok.status is Status.OK and "GPU4-GPU2 XGMI" in ok.summary
    topo.link_type[("GPU4", "GPU2")] = topo.link_type[("GPU2", "GPU4")] = "PCIE"
    topo.numa = {f"GPU{i}": i // 4 for i in range(8)}
    bad = by_name(nccl_checks(eight, topo))["doctor.nccl p2p-paths"]
    assert bad.status is Status.FAIL and bad.where["gpus"] == "GPU4->GPU2" and "path is PCIE" in bad.summary
    assert by_name(nccl_checks(eight, load_topo(REPO / "tests" / "data" / "topo_8xH100_nvlink.txt")))[
        "doctor.nccl p2p-paths"].status is Status.SKIP  # nvidia-smi's matrix has no bus ids


# -- traces, planner -------------------------------------------------------------------------------


def test_the_rocm_trace_breakdown_and_kernel_classes(tmp_path):
    """HTA's MI250 trace (ROCm 6.2): Tensile GEMMs (Cijk_*) are gemm, HIP's Memcpy HtoD is memory;
    ROCm's blit kernels (__amd_rocclr_copyBuffer) count as memcpy, not compute, unlike HTA's rule."""
    report = analyze([HTA_AMD])
    (row,) = report.table("trace_breakdown").rows
    assert (row["steps"], row["compute"], row["memcpy"], row["optimizer"]) == (2, 1.1, 0.41, 0.09)
    assert round(sum(row[c] for c in ("compute", "memcpy", "optimizer", "idle")), 1) == 100.0
    classes = {}
    for r in report.table("trace_ops").rows:
        classes.setdefault(r["class"], []).append(r["name"])
    assert [n[:5] for n in classes["gemm"]] == ["Cijk_", "Cijk_"] and classes["memory"] == ["Memcpy HtoD "]
    events = [x("ProfilerStep#1", 0, 1000, cat="user_annotation")]
    kernels = [("Cijk_Alik_Bljk_SB_MT64x16x32", 0, 400), ("__amd_rocclr_copyBuffer", 400, 200),
               ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", 600, 300)]
    for corr, (name, ts, dur) in enumerate(kernels):
        events.append(x(name, ts, dur, tid=7, cat="kernel", stream=7, correlation=corr))
    write(tmp_path / "rank0.json.gz", events, rank=0, world=1)
    step = analyze([tmp_path]).table("trace_steps").rows[0]
    assert (step["compute"], step["memcpy"], step["comm_exposed"], step["idle"]) == (0.4, 0.2, 0.3, 0.1)


def test_amd_presets_and_the_xgmi_mesh(tmp_path):
    assert presets.device("mi325x").memory_bytes == 256 * 2**30 and presets.device("MI355X").peak_tflops == 2516.6
    assert presets.device_named("AMD Instinct MI300X") == "MI300X"

    def intra_gbps(per_node: int, **kw) -> float:
        net = build_network(PlanConfig(model="llama-7b", device="mi300x", num_nodes=1, devices_per_node=per_node, **kw),
                            None)
        return net.link_for("intra", "all_reduce").bytes_per_s / 1e9

    # the device's fabric is the default intra link; 4 of 8 GPUs reach only 3 of their 7 links
    assert intra_gbps(8) == pytest.approx(448 * 0.85) and intra_gbps(4) == pytest.approx(3 * 64 * 0.85)
    assert intra_gbps(2) == pytest.approx(64 * 0.85)
    assert intra_gbps(4, intra_link="NVLink4") == pytest.approx(450 * 0.85)  # a switch: every GPU at the full rate
    run_cli("plan", "--model", "llama-7b", "--device", "mi300x", "--nodes", "1", "--devices-per-node", "4",
                  "--strategy", "fsdp", "--json", str(tmp_path / "plan.json"))
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert "xGMI (3 of 7 mesh links)" in json.dumps(doc["tables"]["assumptions"])
    levers = [r for r in doc["tables"]["levers"]["rows"] if r["lever"] == "faster link"]
    assert levers and all(r["setting"] == "xGMI-MI355X" for r in levers)  # an MI300X node gets no NVLink
    assert levers[0]["note"].startswith("229.5 GB/s line rate instead of xGMI (3 of 7 mesh links)")  # 3 x 76.5
