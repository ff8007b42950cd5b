"""The command line as a user meets it: real subprocesses, real files, exit codes."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import free_port, run_cli


@pytest.mark.parametrize("args, message", [
    (["comm", "check", "--ops", "all_reduce,allreduce"], "unknown op 'allreduce'"),
    (["comm", "check", "-d", "float8"], "unknown dtype 'float8'"),
    (["comm", "check", "--nproc", "0"], "--nproc must be at least 1"),
    (["comm", "check", "--counts", "7,x"], "--counts: 'x' is not a whole number"),
    (["comm", "bench", "-b", "64M", "-e", "1M"], "-b 64M is larger than -e 1M"),
    (["comm", "bench", "-b", "12Q"], "-b '12Q' does not parse as a size"),
    (["comm", "bench", "--ops", "all_reduce,foo"], "unknown op 'foo'"),
    (["comm", "bench", "-d", "complex64"], "unknown dtype 'complex64'"),
    (["comm", "bench", "--timeout", "soon"], "--timeout 'soon' does not parse"),
    (["comm", "bench", "--backend", "nccl"], "backend 'nccl'"),
    (["comm", "bench", "--bogus"], "No such option: --bogus"),
    (["comm", "bench", "--nproc", "2", "-r", "2"], "-r 2 is not a rank of a world of 2"),
])
def test_bad_input_is_one_line_exit_2(args, message, tmp_path, cli):
    out = tmp_path / "out.json"
    res = cli(*args, "--json", str(out))  # in process: these end before any worker starts
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distval: error: ") and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path, message", [
    ("/etc/hostname/b.json", "'/etc/hostname' exists and is not a directory"),
    ("/proc/nope/b.json", "'/proc/nope' cannot be created"),
    ("/proc/b.json", "is not writable"),
    (".", "is a directory"),
])
def test_unwritable_output_path_is_rejected_before_running(path, message, cli):
    res = cli("comm", "bench", "--json", path)  # in process: rejected before any worker starts
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_run_out_that_is_a_file_is_rejected(tmp_path, cli):
    f = tmp_path / "file"
    f.write_text("keep me")
    res = cli("run", "--out", str(f))
    assert res.returncode == 2 and "exists and is not a directory" in res.stderr
    assert f.read_text() == "keep me"


def test_bench_command_from_the_issue(tmp_path):
    b, c = tmp_path / "b.json", tmp_path / "b.csv"
    res = run_cli(
        "comm",
        "bench",
        "--nproc",
        "2",
        "-b",
        "1M",
        "-e",
        "16M",
        "-f",
        "4",
        "--json",
        str(b),
        "--csv",
        str(c),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "# Out of bounds values : 0 OK" in res.stdout and "busbw" in res.stdout
    doc = json.loads(b.read_text())
    assert doc["schema"] == "distval.report/1" and doc["command"] == "comm bench"
    assert set(doc) >= {"schema", "command", "meta", "checks", "tables"}
    assert doc["meta"]["world_size"] == 2 and doc["meta"]["backend"] == "gloo" and doc["meta"]["copy_ceiling_gbps"] > 0
    rows = doc["tables"]["bench"]["rows"]
    assert [r["bytes"] for r in rows] == [2**20, 4 * 2**20, 16 * 2**20]
    for r in rows:
        assert set(r) >= {
            "op",
            "dtype",
            "bytes",
            "count",
            "inplace",
            "time_us_p50",
            "time_us_p95",
            "algbw_gbps",
            "busbw_gbps",
            "wrong",
        }
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2)  # all_reduce factor at n = 2
    (fit,) = doc["tables"]["alpha_beta"]["rows"]
    assert set(fit) >= {"op", "alpha_us", "beta_gbps", "r2", "n_half_bytes"} and fit["beta_gbps"] > 0
    assert len(c.read_text().splitlines()) == 4


def test_check_json_reports_each_case_and_details_when_wrong(tmp_path):
    out = tmp_path / "c.json"
    res = run_cli("comm", "check", "--nproc", "2", "--ops", "all_gather", "-d", "int32", "--counts", "1,100",
                  "--json", str(out), env={"DISTVAL_FAULT": "op=all_gather,rank=1,index=50"}, timeout=120)
    assert res.returncode == 1, res.stderr
    doc = json.loads(out.read_text())
    by_count = {c["where"]["count"]: c for c in doc["checks"]}
    assert by_count[1]["status"] == "OK"  # index 50 does not exist in a 2-element output
    bad = by_count[100]
    assert bad["status"] == "FAIL" and bad["details"]["rank"] == 1 and bad["details"]["index"] == 50
    assert {"expected", "got", "num_wrong"} <= set(bad["details"])
    assert "FAIL" in res.stdout and "rank 1" in res.stdout


# `comm check` jobs that fail: a rank that raises, dies, hangs, or outlasts the deadline. Each waits
# on a timeout more than it computes, so they run three at a time, once for the module.
FAILING = {
    "raise": ("3", "all_reduce,broadcast", "float32", "4s", "op=broadcast,rank=2,action=raise,nth=4"),
    "kill-2-1": ("2", "all_reduce,all_gather", "int8", "4s", "op=all_gather,rank=1,action=kill,nth=2"),
    "kill-3-1": ("3", "all_reduce,all_gather", "int8", "4s", "op=all_gather,rank=1,action=kill,nth=2"),
    "hang-2-1": ("2", "all_reduce,all_gather", "int8", "4s", "op=all_gather,rank=1,action=hang,nth=2"),
    "hang-3-1": ("3", "all_reduce,all_gather", "int8", "4s", "op=all_gather,rank=1,action=hang,nth=2"),
    "hang-3-0": ("3", "all_reduce,all_gather", "int8", "4s", "op=all_gather,rank=0,action=hang,nth=2"),
    "deadline": ("2", "all_reduce", "float32", "60s", "op=all_reduce,rank=0,action=hang,nth=3"),
}


@pytest.fixture(scope="module")
def failing_checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, dict | None]]:
    """name -> (exit code, output, JSON report or None)."""
    tmp_path = tmp_path_factory.mktemp("failing")

    def check(name: str) -> tuple[int, str, dict | None]:
        nproc, ops, dtype, timeout, fault = FAILING[name]
        out = tmp_path / f"{name}.json"
        deadline = ("--deadline", "5s") if name == "deadline" else ()
        res = run_cli("comm", "check", "--nproc", nproc, "--ops", ops, "-d", dtype, "--timeout", timeout, *deadline,
                      "--json", str(out), env={"DISTVAL_FAULT": fault}, timeout=120)
        return res.returncode, res.stdout + res.stderr, json.loads(out.read_text()) if out.exists() else None

    with ThreadPoolExecutor(3) as pool:
        return dict(zip(FAILING, pool.map(check, FAILING)))


def _failed_check(failing_checks: dict, name: str) -> tuple[dict, dict]:
    """The job's report and its one check: an ERROR, exit 3, no traceback."""
    code, text, doc = failing_checks[name]
    assert code == 3 and doc is not None, text[-3000:]
    assert "Traceback" not in text
    (check,) = doc["checks"]
    return doc, check


def test_crashing_rank_is_named_with_its_last_status(failing_checks):
    doc, check = _failed_check(failing_checks, "raise")
    assert doc["meta"]["world_size"] == 3 and doc["meta"]["backend"] == "gloo"
    assert check["status"] == "ERROR" and check["where"]["rank"] == 2
    assert "injected failure at broadcast" in check["summary"]
    assert "comm check broadcast float32" in check["where"]["status"]


@pytest.mark.parametrize("name, rank, expect", [
    ("kill-2-1", 1, "killed by SIGKILL"),
    ("kill-3-1", 1, "killed by SIGKILL"),
    ("hang-2-1", 1, "stopped after"),
    ("hang-3-1", 1, "stopped after"),
    ("hang-3-0", 0, "stopped after"),
])
def test_dead_or_hung_rank_becomes_an_error_not_a_wait(failing_checks, name, rank, expect):
    _, check = _failed_check(failing_checks, name)
    assert check["where"]["rank"] == rank and expect in check["summary"], check["summary"]
    assert "all_gather int8" in check["where"]["status"]


def test_deadline_stops_a_slow_job_and_names_where_each_rank_was(failing_checks):
    _, check = _failed_check(failing_checks, "deadline")
    assert "deadline of 5s" in check["summary"] and check["where"]["rank"] == 0
    assert "all_reduce" in check["where"]["status"]


def test_world_of_one_fails_fast(tmp_path):
    out = tmp_path / "w.json"
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    res = run_cli("comm", "check", "--expect-world", "4", "--json", str(out), env=env, timeout=60)
    assert res.returncode == 3 and "ERROR" in res.stdout
    (check,) = json.loads(out.read_text())["checks"]
    assert check["status"] == "ERROR"
    assert (
        "expected a world of 4 ranks but this process sees WORLD_SIZE=1" in check["summary"]
        and "alone" in check["summary"]
    )


def test_expect_world_in_local_mode(tmp_path):
    out = tmp_path / "w.json"
    res = run_cli("comm", "check", "--nproc", "2", "--expect-world", "4", "--json", str(out), timeout=60)
    assert res.returncode == 3
    assert (
        "expected a world of 4 ranks but this process sees WORLD_SIZE=2"
        in json.loads(out.read_text())["checks"][0]["summary"]
    )


def test_version_and_help():
    assert run_cli("--version").stdout.strip().startswith("distval ")
    res = run_cli()
    assert res.returncode == 0 and "comm" in res.stdout and "run" in res.stdout
