"""The health monitor of a launched script (health/probe.py, health/script.py) and the live
metrics endpoint (health/metrics.py): a user's own DDP loop (examples/ddp_health.py) under
`distval launch`: a NaN gradient on one rank (scraped while it runs); a rank's parameters
perturbed and another leaking, in one job."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import run_cli

SCRIPT = (Path(__file__).parent.parent / "examples" / "ddp_health.py").read_text()  # nan, drift, leak, slow

CASES = {  # case (examples/ddp_health.py's faults): (ranks, steps, distval launch flags)
    "nan,slow": ("2", "600", ("--check-nan-every", "1", "--metrics-port", "0")),  # scraped while it runs
    "drift,leak": ("3", "160", ()),  # rank 1 drifts, rank 0 leaks
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict, str, dict]]:
    """Each case's exit code, report, stderr and (for the clean one) what its endpoint served."""
    tmp = tmp_path_factory.mktemp("script_health")
    (tmp / "user.py").write_text(SCRIPT)

    def launch(case: str) -> tuple[int, dict, str, dict]:
        nproc, steps, flags = CASES[case]
        out = tmp / f"{case.replace(',', '_')}.json"
        proc = subprocess.Popen([sys.executable, "-m", "distval", "launch", "--nproc", nproc, *flags, "--json",
                                 str(out), str(tmp / "user.py"), steps, case],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            scraped = _scrape_while_running(proc) if "--metrics-port" in flags else {}
            _, stderr = proc.communicate(timeout=180)
        finally:
            proc.kill()
        return proc.returncode, json.loads(out.read_text()), stderr, scraped

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(CASES, pool.map(launch, CASES)))


def _scrape_while_running(proc: subprocess.Popen) -> dict[tuple[str, tuple], float]:
    """The first line on stderr names the endpoint: scraped until a finding is counted (by then
    every rank's step figures are there)."""
    line = proc.stderr.readline()
    match = re.search(r"metrics at http://\S+:(\d+)/metrics", line)
    assert match, line
    url, scraped = f"http://127.0.0.1:{match.group(1)}/metrics", {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(k[0] == "distval_findings_total" for k in scraped):
        time.sleep(0.3)
        scraped = _scrape(url)
    return scraped


def _checks(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


def test_a_nan_gradient_on_one_rank_is_named_with_the_rank_step_and_parameter(runs):
    code, doc, err, _ = runs["nan,slow"]
    check = _checks(doc)["health numerics"]
    assert code == 1 and check["status"] == "FAIL", check
    assert check["where"] == {"rank": 1, "step": 33} and check["details"]["parameter"] == "2.weight", check
    assert "distval: health FAIL: first non-finite value at step 33: a gradient of rank 1 is nan" in err


def test_a_rank_whose_parameters_drifted_is_named_outside_the_majority(runs):
    code, doc, err, _ = runs["drift,leak"]
    checks = _checks(doc)
    check = checks["health replicas"]
    assert code == 1 and check["status"] == "FAIL" and check["where"] == {"rank": 1, "step": 100}, check
    assert "rank 1 holds other values of 0.bias (the other ranks agree)" in check["summary"]
    assert checks["health numerics"]["status"] == "OK"


def test_a_leak_is_named_with_its_rank_and_growth(runs):
    code, doc, err, _ = runs["drift,leak"]
    growth = [f for f in doc["tables"]["health"]["rows"] if f["kind"] == "memory_growth"]
    assert len(growth) == 1 and growth[0]["ranks"] == [0] and growth[0]["step"] <= 120, growth
    # the script leaks 4 MiB a step; the slope of its resident memory carries the allocator's noise
    rate = re.search(r"rank 0's memory grows ([0-9.]+) MiB per step", growth[0]["summary"])
    assert rate and 3.6 <= float(rate.group(1)) <= 4.4, growth[0]["summary"]
    assert _checks(doc)["health memory"]["status"] == "WARN" and "health WARN: rank 0's memory grows" in err


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_metrics_of_a_running_script_are_scraped_and_agree_with_its_report(runs):
    """`--metrics-port 0`: the endpoint is up before the ranks start and says what the report
    says at the end: the job, every rank's heartbeat, its step, its memory, the findings. (A clean
    script raises nothing: the launch tests of test_hang.py.)"""
    code, doc, err, scraped = runs["nan,slow"]
    assert code == 1, err[-2000:]
    assert scraped[("distval_job_info", (("command", "launch"), ("world_size", "2")))] == 1
    assert all(0 <= scraped[("distval_heartbeat_age_seconds", (("rank", str(r)),))] < 5 for r in (0, 1))
    assert 0 < scraped[("distval_step", ())] < 600
    assert scraped[("distval_findings_total", (("kind", "nonfinite"), ("status", "FAIL")))] == 1
    for row in doc["tables"]["rank_health"]["rows"]:
        rank = ("rank", str(row["rank"]))
        assert 0 < scraped[("distval_rank_memory_bytes", (("kind", "peak"), rank))] <= row["peak_mem_bytes"]
        assert 0 <= scraped[("distval_rank_compute_share", (rank,))] <= 1
        assert 0.5 < scraped[("distval_rank_straggler_score", (rank,))] < 2


def test_a_busy_metrics_port_is_one_line_and_exit_2(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        (tmp_path / "user.py").write_text(SCRIPT)
        (tmp_path / "tmp").mkdir()
        res = run_cli("launch", "--nproc", "2", "--metrics-port", str(s.getsockname()[1]), str(tmp_path / "user.py"),
                      "5", env={"TMPDIR": str(tmp_path / "tmp")})
    assert res.returncode == 2 and "--metrics-port" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not list((tmp_path / "tmp").iterdir())  # nothing left behind, not even the agent's run folder


class _Reader:
    def __init__(self, step: dict):
        self.step = step

    def all(self, world: int, kind: str) -> dict:
        return {r: {"time": time.time() - 1.0, "step": 7} for r in range(world)}

    def latest(self, rank: int, kind: str) -> dict | None:
        return self.step if kind == "step" else None


def test_distval_trains_rank_0_payload_fills_the_same_families():
    """`distval train`: rank 0 publishes the step's per-rank rows and findings (train/loop.py)."""
    from distval.health.metrics import MetricsExporter, rank_row

    rows = [rank_row({"step_s": 0.1, "compute_s": 0.08, "blocked_s": 0.02, "mem_current": 5.0, "mem_peak": 9.0}, 1.0),
            rank_row({"step_s": 0.1, "compute_s": 0.1, "blocked_s": 0.0, "mem_current": 6.0, "mem_peak": 8.0}, 1.3)]
    exporter = MetricsExporter(2, 0, "train", addr="127.0.0.1").start()
    try:
        exporter.tick(_Reader({"step": 41, "tokens_per_s": 5000.0, "ranks": rows,
                               "findings": {"straggler/WARN": 1}}))
        scraped = _scrape(f"http://127.0.0.1:{exporter.port}/metrics")
    finally:
        exporter.close()
    assert scraped[("distval_step", ())] == 41 and scraped[("distval_tokens_per_second", ())] == 5000
    assert scraped[("distval_rank_wait_share", (("rank", "0"),))] == pytest.approx(0.2)
    assert scraped[("distval_rank_straggler_score", (("rank", "1"),))] == pytest.approx(1.3)
    assert scraped[("distval_rank_memory_bytes", (("kind", "peak"), ("rank", "1")))] == 8.0
    assert scraped[("distval_findings_total", (("kind", "straggler"), ("status", "WARN")))] == 1
    assert 0.5 < scraped[("distval_heartbeat_age_seconds", (("rank", "1"),))] < 5
