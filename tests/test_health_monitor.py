"""The training health monitor in real `distval train` jobs (Gloo, 2 and 3 ranks): a slowed
rank (its compute stretched, or stopped from outside its process), a drifted replica, a NaN loss
and a leak are each named with the right rank and step; a clean run of the same length stays
quiet. The jobs run side by side."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from distval.ckpt.store import step_name

from conftest import run_cli

CASES = {  # name: (fault, ranks, steps)
    "clean": ("", "2", "140"),
    "slow": ("step=30,rank=1,action=slow,percent=100", "2", "140"),  # onset: within 15 steps (5 jobs share 2 cores)
    "throttled": ("step=30,rank=1,action=throttle,percent=100", "2", "140"),  # stopped 50 of every 100 ms
    "desync": ("step=20,rank=2,action=perturb", "3", "40"),
    "grad_desync": ("step=15,rank=0,action=grad_drift", "3", "30"),  # figures read one step late, as on a GPU
    "nan": ("step=15,rank=1,action=nan", "2", "20"),
    "leak": ("step=10,rank=0,action=leak,mib=8", "2", "80"),
    "nan_stop": ("step=7,rank=1,action=nan", "2", "20"),  # with --on-nan stop and a checkpoint every 5 steps
}


def test_each_health_finding_names_the_rank_and_the_step_and_a_clean_run_is_quiet(tmp_path):
    def train(name: str) -> tuple[int, dict, str]:
        fault, nproc, steps = CASES[name]
        out, log = tmp_path / f"{name}.json", tmp_path / f"{name}.jsonl"
        stop = ("--on-nan", "stop", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "5") \
            if name == "nan_stop" else ("--metrics-readback", "late") if name == "grad_desync" else ()
        res = run_cli("train", "--nproc", nproc, "--model", "tiny", "--strategy", "simple_ddp", "--steps", steps,
                      "--check-replicas-every", "10", "--log-jsonl", str(log), "--json", str(out), *stop,
                      env={"DISTVAL_FAULT": fault} if fault else {}, timeout=300)
        return res.returncode, json.loads(out.read_text()), res.stderr

    with ThreadPoolExecutor(len(CASES)) as pool:
        runs = dict(zip(CASES, pool.map(train, CASES)))
    findings = {name: {f["kind"]: f for f in doc["tables"].get("health", {}).get("rows", [])}
                for name, (_, doc, _) in runs.items()}

    code, doc, _ = runs["clean"]
    assert code == 0 and findings["clean"] == {}, findings["clean"]
    statuses = {c["name"]: c["status"] for c in doc["checks"] if c["name"].startswith("health")}
    assert statuses == {"health stragglers": "OK", "health numerics": "OK", "health memory": "OK",
                        "health replicas": "OK"}

    slow = findings["slow"]["straggler"]
    assert slow["ranks"] == [1] and 15 <= slow["step"] <= 45 and "rank 1 is a straggler" in slow["summary"]
    assert runs["slow"][0] == 0 and "distval: health WARN: rank 1 is a straggler" in runs["slow"][2]  # live

    throttled = [c for c in runs["throttled"][1]["checks"] if c["name"] == "health stragglers"]
    outside = [c for c in throttled if c["details"].get("decided_by") == ["lost_time"]]
    assert runs["throttled"][0] == 0 and {c["where"]["rank"] for c in throttled} == {1}, throttled
    assert outside and 20 <= outside[0]["where"]["step"] <= 60, outside
    assert 0.3 < outside[0]["details"]["stopped_share"] < 0.6, outside
    assert "distval: health WARN: rank 1 is a straggler slowed from outside its process" in runs["throttled"][2]

    desync = findings["desync"]["replicas"]
    assert runs["desync"][0] == 1 and desync["ranks"] == [2] and desync["step"] == 29  # the first check after 20
    assert "tok_emb.weight" in desync["summary"] and "(gradient)" not in desync["summary"]
    grads = findings["grad_desync"]["replicas"]  # the gradients as synchronised differ: named as such
    assert runs["grad_desync"][0] == 1 and grads["ranks"] == [0] and grads["step"] == 19, grads
    assert "tok_emb.weight (gradient)" in grads["summary"]
    assert [s["step"] for s in runs["grad_desync"][1]["tables"]["steps"]["rows"]] == list(range(30))

    nan = findings["nan"]["nonfinite"]
    assert runs["nan"][0] == 1 and nan["ranks"] == [1] and nan["step"] == 15 and "tok_emb.weight" in nan["summary"]
    lines = [json.loads(x) for x in (tmp_path / "nan.jsonl").read_text().splitlines()]
    assert any(x.get("health") and x["step"] == 15 for x in lines)  # the finding in the JSONL sink, at its step

    assert findings["leak"]["memory_growth"]["ranks"] == [0]
    (check,) = [c for c in runs["leak"][1]["checks"] if "bytes_per_step" in c["details"]]
    assert check["where"]["rank"] == 0 and 6 < check["details"]["bytes_per_step"] / 2**20 < 10, check["summary"]

    code, doc, _ = runs["nan_stop"]  # stopped before the update, rank 1 named; the last checkpoint is step 5's
    (check,) = [c for c in doc["checks"] if c["status"] == "FAIL"]
    assert code == 1 and check["where"]["rank"] == 1 and "step 7: the loss of rank 1 is nan" in check["summary"]
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step"))
    assert saved == [step_name(5)], saved
