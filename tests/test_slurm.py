"""`distval slurm`: the sbatch script's content and syntax, bad input, and the script itself run
end to end on this machine with a fake `srun` and `scontrol` on PATH (1 node x 2 workers)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import pytest

from distval.launch.slurm import SlurmJob, check_syntax, sbatch_script

from conftest import free_port, run_cli


def test_script_content():
    text = sbatch_script(SlurmJob(("comm", "bench", "--json", "out dir/b.json"), num_nodes=4, gpus_per_node=8,
                                  partition="gpu", time="01:00:00", ifname="ib0"))
    check_syntax(text)
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=01:00:00",
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        "export GLOO_SOCKET_IFNAME=ib0",
        "export NCCL_SOCKET_IFNAME=ib0",
        "srun --nodes=4 --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
    ):
        assert line in text.splitlines(), line
    assert '--nnodes=4 --nproc-per-node=8' in text
    assert '--rdzv-backend=c10d --rdzv-endpoint="$HEAD_NODE:$RDZV_PORT" --rdzv-id="$SLURM_JOB_ID"' in text
    assert text.rstrip().endswith("-m distval comm bench --json 'out dir/b.json'")  # quoted for the shell
    plain = sbatch_script(SlurmJob(("run",)))
    assert "SOCKET_IFNAME" not in plain and "--gpus-per-node" not in plain and "--nproc-per-node=1" in plain


def test_cli_writes_an_executable_script(tmp_path):
    out = tmp_path / "job.sbatch"
    res = run_cli("slurm", "--nodes", "2", "--gpus-per-node", "4", "--ifname", "eth0", "--out", str(out), "--",
                  "comm", "check", "--ops", "all_reduce", timeout=60)
    assert res.returncode == 0, res.stderr
    assert f"wrote {out}; submit it with: sbatch {out}" in res.stdout
    assert os.stat(out).st_mode & stat.S_IXUSR
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    printed = run_cli("slurm", "--", "distval", "run", "--quick", timeout=60)  # no --out: the script on stdout
    assert (
        printed.returncode == 0
        and printed.stdout.startswith("#!/bin/bash")
        and "-m distval run --quick" in printed.stdout
    )


@pytest.mark.parametrize("args,message", [
    (["--nodes", "0", "--", "run"], "--nodes must be at least 1 (got 0)"),
    (["--time", "soon", "--", "run"], "--time 'soon' is not a Slurm time"),
    (["--ifname", "eth 0", "--", "run"], "--ifname 'eth 0': 'eth 0' is not an interface name"),
    (["--ifname", "^docker", "--", "run"], "is not an interface name"),
    (["--partition", "a b", "--", "run"], "--partition 'a b' is not a Slurm partition name"),
    ([], "distval slurm needs a distval command after `--`"),
    (["--", "emulate", "--nodes", "2"], "`distval emulate` cannot run inside distval slurm"),
    (["--", "nope"], "'nope' after `--` is not a distval command"),
])
def test_bad_input_one_line_exit_2(args, message, tmp_path):
    out = tmp_path / "job.sbatch"
    res = run_cli("slurm", "--out", str(out), *args, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("distval: error: ") and res.stderr.count("\n") == 1 and message in res.stderr
    assert not out.exists()


FAKE_SRUN = """#!/bin/bash
# A stand-in for srun: one task per node of the (fake) allocation, with the variables srun sets.
nodes=1
while [[ "$1" == --* ]]; do
  case "$1" in --nodes=*) nodes="${1#--nodes=}";; esac
  shift
done
pids=()
for ((i = 0; i < nodes; i++)); do
  SLURM_PROCID=$i SLURM_NODEID=$i SLURM_LOCALID=0 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=$nodes \
SLURM_STEP_NUM_NODES=$nodes \\
    SLURM_STEP_NODELIST="$SLURM_JOB_NODELIST" "$@" &
  pids+=($!)
done
code=0
for p in "${pids[@]}"; do wait "$p" || code=$?; done
exit $code
"""

FAKE_SCONTROL = """#!/bin/bash
# scontrol show hostnames LIST: this machine only
[[ "$1 $2" == "show hostnames" ]] && echo localhost
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_generated_script_runs_with_fake_srun(tmp_path):
    """The script as Slurm would run it on a 1-node allocation: srun starts torchrun, torchrun
    hosts the c10d rendezvous on the first node of the list and starts 2 workers, distval runs
    in torchrun mode and rank 0 writes the report."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "check.json"
    job = tmp_path / "job.sbatch"
    res = run_cli("slurm", "--nodes", "1", "--nproc-per-node", "2", "--ifname", "lo", "--out", str(job), "--",
                  "comm", "check", "--ops", "all_reduce", "-d", "int64", "--counts", "5", "--expect-world", "2",
                  "--json", str(out), timeout=60)
    assert res.returncode == 0, res.stderr
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_"))
    }
    env.update(PATH=f"{bin_dir}:{env['PATH']}", SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID="4242",
               RDZV_PORT=str(free_port()))
    ran = subprocess.run(["bash", str(job)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["launch"] == "torchrun" and doc["meta"]["world_size"] == 2 and doc["summary"]["OK"] == 4
    assert doc["meta"]["env"]["GLOO_SOCKET_IFNAME"] == "lo" and doc["meta"]["env"]["NCCL_SOCKET_IFNAME"] == "lo"
