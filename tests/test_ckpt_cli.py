"""`distval train` with checkpoints from the command line: bad input (one line, exit 2, nothing
written) and a job that survives a worker SIGKILLed from outside, ending with the same per-step
losses as a run never interrupted."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distval.ckpt import state, store
from distval.train.config import OptimConfig, TrainConfig

from conftest import REPO, run_cli


def _fake_checkpoint(ckpt_dir: Path, cfg: TrainConfig, world_size: int = 2) -> None:
    tmp = store.tmp_path(ckpt_dir, 5, "a0")
    tmp.mkdir()
    files = {"model.safetensors": store.write_tensors(tmp, "model.safetensors", {})}
    store.commit(tmp, ckpt_dir, 5, files, {"fields": state.fingerprint_fields(cfg, world_size)})


@pytest.fixture
def read_only_dir(tmp_path):
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() == 0:  # permissions do not stop root: a read-only mount does
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "distval-test", str(path)]).returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs")
        yield path
        subprocess.run(["umount", str(path)])
    else:
        path.chmod(0o500)
        yield path
        path.chmod(0o700)


def _bad_cases(tmp_path: Path, read_only: Path) -> list[tuple[list[str], str]]:
    other = tmp_path / "other"
    other.mkdir()
    _fake_checkpoint(other, TrainConfig(optim=OptimConfig(lr=1e-3), model="tiny"))
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return [
        (["--ckpt-dir", str(a_file)], "exists and is not a directory"),
        (["--ckpt-dir", "/proc/distval-ckpt"], "cannot be created"),
        (["--ckpt-dir", str(read_only)], "is not writable"),
        (["--max-restarts", "-1"], "--max-restarts must be 0 or more (got -1)"),
        (["--ckpt-dir", str(other), "--resume", "auto"],
         "is from a different config: lr 0.001 (checkpoint) vs 0.003 (this run)"),
        (["--resume", "auto"], "--resume auto needs --ckpt-dir"),
        (["--resume", str(tmp_path / "nowhere")], "is not a checkpoint directory"),
        (["--ckpt-dir", str(tmp_path), "--ckpt-every", "0"], "--ckpt-every must be at least 1"),
    ]


def test_bad_checkpoint_input_is_one_line_exit_2(tmp_path, read_only_dir, cli):
    out = tmp_path / "t.json"
    out.write_text("keep me")
    for args, message in _bad_cases(tmp_path, read_only_dir):
        res = cli("train", "--nproc", "2", "--steps", "2", *args, "--json", str(out))
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and message in lines[0], (args, res.stderr)
        assert lines[0].startswith("distval: error: ")
        assert out.read_text() == "keep me"
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["latest", "step-00000005"]  # untouched


def _children(parent: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                pids.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def _workers(parent: int) -> list[int]:
    """The training workers the local agent started: its fork server's children, or its own
    (spawned: multiprocessing's spawn_main), not multiprocessing's resource tracker. The fork
    server is multiprocessing's interpreter, or the launcher forked (its command line)."""
    pids, launcher = [], Path(f"/proc/{parent}/cmdline").read_bytes()
    for pid in _children(parent):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing.forkserver" in cmd or cmd == launcher:
            pids += _children(pid)
        elif b"resource_tracker" not in cmd:
            pids.append(pid)
    return sorted(pids)


def test_sigkilled_worker_is_restarted_and_the_losses_are_unchanged(tmp_path):
    common = ["train", "--nproc", "2", "--model", "tiny", "--strategy", "simple_ddp", "--steps", "60"]
    base = tmp_path / "base.json"
    assert run_cli(*common, "--json", str(base), timeout=180).returncode == 0
    ckpt, out = tmp_path / "ckpt", tmp_path / "t.json"
    ckpt.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DISTVAL_", "TORCHELASTIC", "RANK", "WORLD_SIZE", "MASTER_"))
    }
    proc = subprocess.Popen([sys.executable, "-m", "distval", *common, "--ckpt-dir", str(ckpt), "--ckpt-every", "5",
                             "--max-restarts", "3", "--resume", "auto", "--json", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        deadline = time.time() + 120
        while not list(ckpt.glob("runs/*.json")) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)  # training has started once the journal exists
        time.sleep(random.uniform(0.0, 0.4))  # "at any moment" of the run
        victims = _workers(proc.pid)
        assert len(victims) == 2, victims
        os.kill(random.choice(victims), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    doc = json.loads(out.read_text())
    attempts = doc["tables"]["attempts"]["rows"]
    assert len(attempts) == 2 and attempts[0]["outcome"] == "failed" and attempts[1]["outcome"] == "finished"
    assert doc["meta"]["restarts"] == 1
    resumed = attempts[1]["resumed_from_step"] or 0
    assert resumed % 5 == 0 and resumed <= attempts[0]["last_step"]
    assert attempts[1]["recovery_s"] > 0
    losses = [r["loss"] for r in doc["tables"]["steps"]["rows"]]
    expected = [r["loss"] for r in json.loads(base.read_text())["tables"]["steps"]["rows"]]
    assert len(losses) == 60 and losses == expected
    assert doc["meta"]["param_checksum"] == json.loads(base.read_text())["meta"]["param_checksum"]


def test_a_crash_loop_stops_before_the_restarts_run_out(tmp_path):
    """A fault that returns after every restart at the same step: two attempts resume from the
    same checkpoint and fail at the same step, and the job stops with 3 of 5 restarts unused."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "t.json"
    ckpt.mkdir()
    res = run_cli("train", "--nproc", "2", "--model", "tiny", "--strategy", "simple_ddp", "--steps", "8",
                  "--ckpt-dir", str(ckpt), "--ckpt-every", "3", "--no-ckpt-async", "--max-restarts", "5",
                  "--resume", "auto", "--json", str(out),
                  env={"DISTVAL_FAULT": "step=4,rank=1,action=raise,attempt=-1"}, timeout=240)
    assert res.returncode == 3, res.stderr[-2000:]
    doc = json.loads(out.read_text())
    error = next(c for c in doc["checks"] if c["status"] == "ERROR")
    assert (
        "no progress across restarts: attempts 1 and 2 both resumed from step 3 and failed at step 4"
        in error["summary"]
    )
    assert [(a["resumed_from_step"], a["last_step"]) for a in doc["tables"]["attempts"]["rows"]] == [
        (None, 4),
        (3, 4),
        (3, 4),
    ]
