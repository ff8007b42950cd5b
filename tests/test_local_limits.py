"""What a host cannot run is said before any worker starts: more NCCL ranks than GPUs,
more workers than the memory holds; a one-rank bench says bus bandwidth is not defined there."""

from __future__ import annotations

import json

import pytest

from distval import device as devices

from conftest import run_cli


def test_more_nccl_ranks_than_gpus_is_refused_naming_both(monkeypatch):
    monkeypatch.setattr(devices, "cuda_usable", lambda: True)
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"--nproc 2 with NCCL needs 2 GPUs and this host has 1: use --nproc 1, "
                                         r"or --backend gloo"):
        devices.check_local_workers(2, "nccl")
    devices.check_local_workers(1, "nccl")
    devices.check_local_workers(2, "gloo")


def test_more_workers_than_the_host_holds_is_one_line_exit_2(tmp_path, cli):
    for args in (["comm", "bench", "--nproc", "100000"], ["launch", "--nproc", "100000", __file__]):
        res = cli(*args, "--json", str(tmp_path / "x.json"))
        assert res.returncode == 2 and res.stderr.count("\n") == 1, (args, res.stderr)
        assert "--nproc 100000: this host cannot start that many workers" in res.stderr and "--nnodes" in res.stderr
        assert not (tmp_path / "x.json").exists()


def test_a_one_rank_bench_says_bus_bandwidth_is_not_defined(tmp_path):
    res = run_cli("comm", "bench", "--nproc", "1", "--ops", "all_reduce", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1",
                  "--json", str(tmp_path / "b.json"))
    (check,) = [c for c in json.loads((tmp_path / "b.json").read_text())["checks"]
                if c["name"].startswith("comm.bench all_reduce")]
    assert res.returncode == 0 and "bus bandwidth is not defined on one rank" in check["summary"], check
    assert "raise -e" not in check["summary"]
