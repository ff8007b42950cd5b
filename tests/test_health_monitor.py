"""The training health monitor in real `distval train` jobs (Gloo, 2 and 3 ranks): a slowed
rank (its compute stretched, or stopped from outside its process), a drifted replica, a NaN loss
and a leak are each named with the right rank and step; a clean run of the same length stays
quiet. The jobs run once, side by side, for the whole module; each case is its own test."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest

from distval.ckpt.store import step_name

from conftest import run_cli

CASES = {  # name: (fault, ranks, steps)
    "clean": ("", "2", "100"),
    # onset: within 15 steps of the slowdown at 30. Eight jobs side by side (17 ranks on 2 cores) can
    # hold the rank's compute over its one peer's by more than the rule's 1.15 before the slowdown;
    # the onset's reference rises over that level (health/findings.py `onset`; pinned on known series
    # in tests/test_monitor.py). Named once its window's median has held for 50 steps and 8 s:
    # 14-60 ms steps (alone, shared), named by step 190-600 on a slow host; on a fast one (14 ms steps)
    # 650 steps ended 9 s after the slowdown, before the 8 s held past the window: 1,200 steps
    "slow": ("step=30,rank=1,action=slow,percent=100", "2", "1200"),
    # stopped 50 of every 100 ms; named ~10 s after (the lost-time rule's 9 s window held 6 s): 400 steps
    "throttled": ("step=30,rank=1,action=throttle,percent=100", "2", "400"),
    "desync": ("step=20,rank=2,action=perturb", "3", "40"),
    "grad_desync": ("step=15,rank=0,action=grad_drift", "3", "30"),  # figures read one step late, as on a GPU
    "nan_leak": ("step=15,rank=1,action=nan;step=10,rank=0,action=leak,mib=8", "2", "80"),  # two faults, one job
    "nan_stop": ("step=7,rank=1,action=nan", "2", "20"),  # with --on-nan stop and a checkpoint every 5 steps
}


class Job(NamedTuple):
    code: int
    doc: dict
    stderr: str
    dir: Path  # where the job wrote its report, JSONL log and checkpoints


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict | None, str, Path]]:
    """Every case's `distval train` job, all side by side in one pool, once for the module:
    name -> (exit code, JSON report or None when none was written, stderr, directory)."""
    tmp_path = tmp_path_factory.mktemp("health")

    def train(name: str) -> tuple[int, dict | None, str, Path]:
        fault, nproc, steps = CASES[name]
        out, log = tmp_path / f"{name}.json", tmp_path / f"{name}.jsonl"
        stop = ("--on-nan", "stop", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "5") \
            if name == "nan_stop" else ("--metrics-readback", "late") if name == "grad_desync" else ()
        try:
            res = run_cli("train", "--nproc", nproc, "--model", "tiny", "--strategy", "bucket_ddp_async", "--steps",
                          steps, "--check-replicas-every", "10", "--log-jsonl", str(log), "--json", str(out), *stop,
                          env={"DISTVAL_FAULT": fault} if fault else {}, timeout=300)
        except subprocess.TimeoutExpired as e:  # fails this case only
            return -1, None, f"timed out after {e.timeout} s", tmp_path
        return res.returncode, json.loads(out.read_text()) if out.exists() else None, res.stderr, tmp_path

    with ThreadPoolExecutor(len(CASES)) as pool:
        return dict(zip(CASES, pool.map(train, CASES)))


def _job(runs: dict, name: str) -> Job:
    """One case's job; a job that wrote no report fails its own case only."""
    code, doc, stderr, where = runs[name]
    assert doc is not None, f"{name}: no report (exit {code}): {stderr[-3000:]}"
    return Job(code, doc, stderr, where)


def _findings(doc: dict) -> dict[str, dict]:
    return {f["kind"]: f for f in doc["tables"].get("health", {}).get("rows", [])}


def _finding(runs: dict, name: str, kind: str) -> dict:
    """The case's finding of this kind; missing, the failure says what the job did instead."""
    job = _job(runs, name)
    found = _findings(job.doc)
    trouble = [(c["name"], c["status"], c["summary"]) for c in job.doc["checks"] if c["status"] != "OK"]
    assert kind in found, f"{name}: no {kind} finding (exit {job.code}; findings {sorted(found)}; " \
        f"checks not OK {trouble}): {job.stderr[-2000:]}"
    return found[kind]


def test_a_clean_run_is_quiet(runs):
    code, doc, _, _ = _job(runs, "clean")
    assert code == 0 and _findings(doc) == {}, _findings(doc)
    statuses = {c["name"]: c["status"] for c in doc["checks"] if c["name"].startswith("health")}
    assert statuses == {"health stragglers": "OK", "health numerics": "OK", "health memory": "OK",
                        "health replicas": "OK"}


def test_a_slowed_rank_is_a_straggler_named_live(runs):
    code, doc, stderr, _ = _job(runs, "slow")
    slow = _finding(runs, "slow", "straggler")
    assert slow["ranks"] == [1] and 15 <= slow["step"] <= 45 and "rank 1 is a straggler" in slow["summary"]
    assert code == 0 and "distval: health WARN: rank 1 is a straggler" in stderr  # live


def test_a_rank_stopped_from_outside_is_a_straggler_by_its_lost_time(runs):
    code, doc, stderr, _ = _job(runs, "throttled")
    throttled = [c for c in doc["checks"] if c["name"] == "health stragglers"]
    outside = [c for c in throttled if c["details"].get("decided_by") == ["lost_time"]]
    assert code == 0 and {c["where"]["rank"] for c in throttled} == {1}, throttled
    assert outside and 20 <= outside[0]["where"]["step"] <= 60, outside
    assert 0.3 < outside[0]["details"]["stopped_share"] < 0.6, outside
    assert "distval: health WARN: rank 1 is a straggler slowed from outside its process" in stderr


def test_a_drifted_replica_is_named_at_the_first_check_after(runs):
    code, doc, _, _ = _job(runs, "desync")
    desync = _finding(runs, "desync", "replicas")
    assert code == 1 and desync["ranks"] == [2] and desync["step"] == 29, desync  # the first check after 20
    assert "tok_emb.weight" in desync["summary"] and "(gradient)" not in desync["summary"]


def test_drifted_gradients_are_named_as_gradients(runs):
    code, doc, _, _ = _job(runs, "grad_desync")
    grads = _finding(runs, "grad_desync", "replicas")  # the gradients as synchronised differ: named as such
    assert code == 1 and grads["ranks"] == [0] and grads["step"] == 19, grads
    assert "tok_emb.weight (gradient)" in grads["summary"]
    assert [s["step"] for s in doc["tables"]["steps"]["rows"]] == list(range(30))


def test_a_nan_loss_is_named_with_its_rank_step_and_in_the_jsonl_sink(runs):
    code, doc, _, where = _job(runs, "nan_leak")
    nan = _finding(runs, "nan_leak", "nonfinite")
    assert code == 1 and nan["ranks"] == [1] and nan["step"] == 15 and "tok_emb.weight" in nan["summary"], nan
    lines = [json.loads(x) for x in (where / "nan_leak.jsonl").read_text().splitlines()]
    assert any(x.get("health") and x["step"] == 15 for x in lines)  # the finding in the JSONL sink, at its step


def test_a_leak_is_named_with_its_rank_and_rate(runs):
    _, doc, _, _ = _job(runs, "nan_leak")  # a non-finite loss from step 15 does not hide the leak
    assert _finding(runs, "nan_leak", "memory_growth")["ranks"] == [0]
    (check,) = [c for c in doc["checks"] if "bytes_per_step" in c["details"]]
    assert check["where"]["rank"] == 0 and 6 < check["details"]["bytes_per_step"] / 2**20 < 10, check["summary"]


def test_on_nan_stop_ends_before_the_update_and_keeps_the_last_checkpoint(runs):
    # stopped before the update, rank 1 named; the last checkpoint is step 5's
    code, doc, _, where = _job(runs, "nan_stop")
    (check,) = [c for c in doc["checks"] if c["status"] == "FAIL"]
    assert code == 1 and check["where"]["rank"] == 1 and "step 7: the loss of rank 1 is nan" in check["summary"]
    saved = sorted(p.name for p in (where / "ckpt").iterdir() if p.name.startswith("step"))
    assert saved == [step_name(5)], saved
