"""distval launch in a Kubernetes pod (Kubeflow's PyTorchJob, TrainJob): torchrun's PET_*
environment read as torchrun reads it, flags winning; two "pods" meet with nothing else set."""

from __future__ import annotations

import json
import re
import textwrap
from concurrent.futures import ThreadPoolExecutor

from distval.cli import petenv

from conftest import free_port, run_cli


def test_pet_variables_are_torchruns_flags():
    env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "trainer-master-0",
           "PET_MASTER_PORT": "23456", "PET_MAX_RESTARTS": "3"}
    assert petenv.flags(env) == ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "3",
                                 "--rdzv-endpoint", "trainer-master-0:23456"]
    elastic = {"PET_RDZV_ENDPOINT": "etcd:2379", "PET_RDZV_ID": "job-7", "PET_RDZV_BACKEND": "static",
               "PET_MASTER_ADDR": "ignored"}
    assert petenv.flags(elastic) == ["--rdzv-endpoint", "etcd:2379", "--rdzv-id", "job-7", "--rdzv-backend", "c10d"]
    assert petenv.flags({}) == []


def test_the_pet_environment_is_read_and_typed_flags_win(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("PET_NNODES", "2")
    res = cli("launch", str(tmp_path / "train.py"))
    assert res.returncode == 2 and "--nnodes 2 needs --rdzv-endpoint" in res.stderr, res.stderr
    res = cli("launch", "--nnodes", "1", str(tmp_path / "train.py"))  # typed: one node, then the missing script
    assert res.returncode == 2 and "no such script" in res.stderr, res.stderr


SCRIPT = textwrap.dedent("""\
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert int(t.item()) == dist.get_world_size() == 2
    print("rank", dist.get_rank(), "of", dist.get_world_size(), "node", os.environ["GROUP_RANK"])
    dist.destroy_process_group()
    """)


def test_two_pods_with_only_the_operators_variables_meet_and_run(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    port = free_port()

    def pod(rank: int) -> tuple[int, str, str]:
        out = tmp_path / f"pod{rank}.json"
        env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(rank),
               "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
        res = run_cli("launch", "--json", str(out), str(tmp_path / "train.py"), env=env, timeout=180)
        return res.returncode, out.read_text() if out.exists() else "", res.stdout + res.stderr

    with ThreadPoolExecutor(2) as pool:
        pods = list(pool.map(pod, (0, 1)))
    for code, report, text in pods:
        assert code == 0, text[-2000:]
        assert "ended on all 2 ranks" in json.loads(report)["checks"][0]["summary"], report[:2000]
    nodes = re.findall(r"rank \d of 2 node (\d)", "".join(text for _, _, text in pods))  # each pod, its node
    assert sorted(nodes) == ["0", "1"], nodes
