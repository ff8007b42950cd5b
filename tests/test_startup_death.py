"""A rank that dies during start-up (before its first optimizer step) under `distval launch`:
named in one line with the last line of its exception, or its exit code, within seconds of its
death, on stderr and in the report; not restarted into the same death (health/diagnose.py,
launch/shim.py, launch/local.py)."""

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from distval.health.diagnose import diagnose, first_line, in_startup
from distval.launch.local import _StartupLoop

# rank 1 dies (its death time and each attempt's start noted in `marks`) while the others wait in
# init_process_group ("before_init", "exit": os._exit(3), no exception) or in the first all_reduce
SCRIPT = """
import os, sys, time
import torch
import torch.distributed as dist

case, marks = sys.argv[1], sys.argv[2]
rank, attempt = int(os.environ["RANK"]), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
open(os.path.join(marks, f"attempt.{rank}.{attempt}"), "w").close()


def dying():
    with open(os.path.join(marks, f"died.{rank}.{attempt}"), "w") as f:
        f.write(repr(time.time()))


if rank == 1 and case in ("before_init", "exit"):
    dying()
    if case == "exit":
        os._exit(3)
    open("data/shard1.bin", "rb")
dist.init_process_group("gloo")
if rank == 1 and case == "after_init":
    dying()
    open("data/shard1.bin", "rb")
t = torch.ones(4)
dist.all_reduce(t)
dist.destroy_process_group()
"""
MISSING = "FileNotFoundError: [Errno 2] No such file or directory: 'data/shard1.bin'"
# name: (script case, --nproc, --max-restarts)
CASES = {"before_init": ("before_init", "2", "2"), "after_init": ("after_init", "3", "0"),
         "exit": ("exit", "2", "0"), "exit_restarted": ("exit", "2", "3")}


def _launch(tmp_path: Path, name: str) -> dict:
    """One `distval launch`, its stderr read as it comes (each line's arrival time)."""
    case, nproc, restarts = CASES[name]
    folder = tmp_path / name
    (folder / "marks").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    cmd = [sys.executable, "-m", "distval", "launch", "--nproc", nproc, "--max-restarts", restarts,
           "--json", str(folder / "r.json"), str(tmp_path / "script.py"), case, str(folder / "marks")]
    started = time.time()
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    out: list[str] = []
    readers = [threading.Thread(target=lambda: lines.extend((time.time(), line) for line in proc.stderr)),
               threading.Thread(target=lambda: out.append(proc.stdout.read()))]
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
    for r in readers:
        r.join()
    stdout = "".join(out)
    marks = folder / "marks"
    deaths = sorted(float(p.read_text()) for p in marks.glob("died.*"))
    report = json.loads((folder / "r.json").read_text()) if (folder / "r.json").exists() else None
    return {"code": proc.returncode, "started": started, "lines": lines, "stdout": stdout, "report": report,
            "deaths": deaths, "attempts": sorted({p.name.split(".")[2] for p in marks.glob("attempt.*")})}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every launch of this module side by side (each waits on its processes more than it computes)."""
    tmp_path = tmp_path_factory.mktemp("startup")
    (tmp_path / "script.py").write_text(SCRIPT)
    with ThreadPoolExecutor(len(CASES)) as pool:
        return dict(zip(CASES, pool.map(lambda name: _launch(tmp_path, name), CASES)))


def _verdict(run: dict) -> tuple[float, str]:
    """distval's one line on stderr: when it came, and what it says."""
    said = [(t, line.strip()) for t, line in run["lines"] if line.startswith("distval: ")]
    assert len(said) == 1, (said, "".join(line for _, line in run["lines"])[-3000:])
    return said[0]


def _check(run: dict) -> dict:
    (check,) = [c for c in run["report"]["checks"] if c["status"] != "OK"]
    return check


def _assert_named(run: dict, verdict: str, restarts: int = 0) -> None:
    text = "".join(line for _, line in run["lines"])
    assert run["code"] == 3, text[-3000:]
    at, said = _verdict(run)
    assert said == f"distval: {verdict}", said
    # within seconds of the death (the last one where the job was restarted), whatever start-up cost
    assert run["deaths"] and at - run["deaths"][-1] < 15, (at - run["deaths"][-1], at - run["started"])
    check = _check(run)
    assert check["status"] == "ERROR" and check["name"] == "launch ranks" and check["summary"] == verdict
    assert check["where"]["rank"] == 1 and check["details"]["startup"]["ranks"] == [1]
    assert "ChildFailedError" not in text and "[rank1]: [rank1]:" not in text and "shim.py" not in text


def test_a_rank_raising_before_init_process_group_is_named_and_not_restarted(runs):
    run = runs["before_init"]  # --max-restarts 2: the script would raise it again in every attempt
    _assert_named(run, f"rank 1 died during start-up: {MISSING}")
    assert run["attempts"] == ["0"], run["attempts"]
    check = _check(run)
    assert check["details"]["startup"]["cause"] == MISSING
    assert "open(\"data/shard1.bin\", \"rb\")" in check["details"]["startup"]["traceback"]
    # the rank's own traceback, once, from the script's own frame (not distval's shim's)
    text = "".join(line for _, line in run["lines"])
    assert text.count("[rank1]: Traceback (most recent call last)") == 1
    assert 'script.py", line ' in text and '[rank1]:     open("data/shard1.bin", "rb")' in text


def test_a_rank_raising_after_init_process_group_is_named_not_its_peers_closed_connections(runs):
    run = runs["after_init"]  # 3 ranks: 0 and 2 wait in the first all_reduce and fail on the closed pair
    _assert_named(run, f"rank 1 died during start-up: {MISSING}")
    details = _check(run)["details"]["ranks"]
    assert all("Connection closed" in (details[r]["error"] or "") or details[r]["error"] is None for r in ("0", "2"))


def test_a_rank_exiting_without_an_exception_is_named_with_its_exit_code(runs):
    _assert_named(runs["exit"], "rank 1 died during start-up: exited with code 3 without an exception")


def test_a_rank_dying_the_same_way_in_two_attempts_is_not_restarted_again(runs):
    run = runs["exit_restarted"]  # --max-restarts 3: failed at the second death, not after the fourth
    _assert_named(run, "rank 1 died during start-up: exited with code 3 without an exception; the same in the "
                       "attempt before: not restarted again")
    assert run["attempts"] == ["0", "1"], run["attempts"]  # one restart, judged before the agent's second


def _state(t: float, error: str | None = None, step: int | None = 0) -> dict:
    state = {"time": t, "error": error, "issued": 0, "status": "running s.py", "pending": [], "traceback": "tb"}
    return state if step is None else {**state, "script_step": step}


def test_the_diagnosis_of_start_up_deaths():
    script = {"status": "running s.py", "script": True}
    # the first line of an error of its own, before its first step
    failure = diagnose({0: _state(1.0, "RuntimeError: Connection closed by peer"),
                        1: _state(2.0, "ValueError: bad shard\nmore detail")}, {})
    assert str(failure) == "rank 1 died during start-up: ValueError: bad shard" and failure.rank == 1
    # every rank the same: said once
    failure = diagnose({r: _state(1.0 + r, "ModuleNotFoundError: No module named 'x'") for r in range(3)}, {})
    assert str(failure) == "every rank died during start-up: ModuleNotFoundError: No module named 'x'"
    assert failure.rank is None and failure.details["startup"]["ranks"] == [0, 1, 2]
    # after its first step, or a distval worker's (no script_step): the failure as before
    assert str(diagnose({0: _state(1.0), 1: _state(2.0, "ValueError: bad", step=4)}, {})).startswith("rank 1 failed")
    assert str(diagnose({0: _state(1.0), 1: _state(2.0, "ValueError: bad", step=None)}, {})).startswith("rank 1 failed")
    # no state: its exit code or signal, start-up known from its status and heartbeat
    statuses = {0: script, 1: script}
    failure = diagnose({0: _state(1.0), 1: None}, statuses, {0: 143, 1: 3})
    assert str(failure) == "rank 1 died during start-up: exited with code 3 without an exception"
    failure = diagnose({0: None, 1: None}, statuses, {0: -15, 1: -9}, beats={1: {"step": 0}})
    assert str(failure) == "rank 1 died during start-up: killed by SIGKILL"
    failure = diagnose({0: _state(1.0), 1: None}, statuses, {0: -15, 1: 3}, beats={1: {"step": 7}})
    assert str(failure) == "rank 1 failed: exited with code 3 without an exception (last status: running s.py)"
    stepped = {0: script, 1: {**script, "stepped": True}}  # its first step, said before a heartbeat counted it
    failure = diagnose({0: _state(1.0), 1: None}, stepped, {1: -9}, beats={1: {"step": 0}})
    assert str(failure).startswith("rank 1 failed: killed by SIGKILL")
    assert not in_startup(1, {}, {1: {"status": "train step 3", "step": 0}}, {})  # distval's own worker
    assert first_line("x" * 400).endswith("...") and len(first_line("x" * 400)) == 300


class _Reader:
    def __init__(self, statuses: dict, beats: dict):
        self.kinds = {"status": statuses, "heartbeat": beats}

    def all(self, world: int, kind: str) -> dict:
        return {r: self.kinds[kind].get(r) for r in range(world)}


def test_the_same_start_up_death_in_two_attempts_stops_the_job():
    """The agent's report of each failed attempt ({rank: (pid, exit code)}), judged while the
    ranks' statuses are still that attempt's (pids 10, 11 in the first, ...)."""
    def attempt(pids: tuple[int, int], deaths: dict[int, tuple[int, int]], step: int = 0) -> bool:
        statuses = {r: {"status": "s.py", "pid": pid, "script": True} for r, pid in enumerate(pids)}
        loop.reader = _Reader(statuses, {1: {"pid": pids[1], "step": step}})
        return loop.failed(deaths)

    loop = _StartupLoop(_Reader({}, {}), 2)
    assert not attempt((10, 11), {1: (11, 3), 0: (10, 143)})  # rank 1 exits 3 in start-up, rank 0 is torn down
    assert not attempt((20, 21), {1: (21, -9)}) and loop.found is None  # another death: restarted again
    assert attempt((30, 31), {1: (31, -9)}) and loop.found == (1, -9)  # the same twice running: not restarted
    loop = _StartupLoop(_Reader({}, {}), 2)
    assert not attempt((40, 41), {1: (41, 3)})
    assert not attempt((50, 51), {1: (51, 3)}, step=5)  # it got past start-up: a restart may resume
    assert not attempt((60, 61), {1: (61, 3)}) and loop.found is None
    # a death before the shim said anything (no status of that process): in start-up
    loop = _StartupLoop(_Reader({}, {}), 2)
    assert not attempt((70, 71), {1: (99, 3)})
    assert attempt((80, 81), {1: (98, 3)}) and loop.found == (1, 3)
