"""Launching under torchrun and Slurm, and reading their variables."""

import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from distval.launch import LaunchOptions, check_world, detect_mode, first_slurm_host, forkserver, run, worker_env
from distval.launch.local import _Ended, _ExitPeek, _run, _start_method, _Stopped
from distval.results import CannotRun

from conftest import free_port, run_cli


def test_modes_are_detected_from_the_environment():
    assert detect_mode({}) == "local"
    assert detect_mode({"RANK": "1", "WORLD_SIZE": "4"}) == "torchrun"
    slurm = {"SLURM_PROCID": "3", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
             "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4242"}
    assert detect_mode(slurm) == "slurm"
    assert worker_env("slurm", slurm) == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                          "MASTER_ADDR": "gpu07", "MASTER_PORT": str(29500 + 4242 % 1000)}
    # a batch script's own shell (no step) or a one-task step is not a multi-rank job
    assert detect_mode({"SLURM_PROCID": "0", "SLURM_JOB_ID": "1"}) == "local"
    assert detect_mode({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}) == "mpi"
    with pytest.raises(CannotRun, match="MASTER_ADDR is not set"):
        worker_env("mpi", {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})


def test_slurm_node_lists():
    assert first_slurm_host("gpu[03-05,9],cpu1") == "gpu03"
    assert first_slurm_host("node7") == "node7"
    assert first_slurm_host("a-b-1,a-b-2") == "a-b-1"


def test_world_check():
    check_world(4, 4, {})
    check_world(1, None, {})
    with pytest.raises(CannotRun, match="found itself alone"):
        check_world(1, 8, {})
    with pytest.raises(CannotRun, match="expected a world of 2 ranks but this process sees WORLD_SIZE=3"):
        check_world(3, 2, {})


def _sockets(pid: int | str) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return {target for target in found if target.startswith("socket:")}


def _disposition(sig: int) -> str:
    handler = signal.getsignal(sig)
    return {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored"}.get(handler, "a Python handler")


def _how_started(ctx, launcher: int) -> dict:
    import torch

    server = Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[1]  # its parent: the launcher
    return {"from_server": int(server) == launcher,
            "threads": torch.get_num_threads(), "sighup": _disposition(signal.SIGHUP),
            "sigterm_blocked": signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []),
            "agents_sockets": sorted(_sockets("self") & _sockets(launcher)),
            "env": {k: os.environ.get(k) for k in ("DISTVAL_TEST_MARK", "RANK")}}


def test_distvals_own_workers_start_from_a_fork_server_with_the_launchers_environment(monkeypatch):
    """On a CPU host with one intra-op thread per worker distval's workers start from a fork
    server (torch already imported), not as copies of the launching process: one thread, default
    signal handlers, none of the launcher's sockets, and the launcher's environment as it is now
    (the server started with an older one) with the rank's own variables on top. The server
    outlives a SIGTERM to the job's process group (the launcher and the workers save and stop);
    a worker does not."""
    run(_how_started, os.getpid(), LaunchOptions(nproc=2, timeout_s=60))  # the server runs from here on
    monkeypatch.setenv("DISTVAL_TEST_MARK", "set after the server started")
    monkeypatch.setenv("RANK", "7")  # the rank's own wins
    job = run(_how_started, os.getpid(), LaunchOptions(nproc=2, timeout_s=60))
    assert [r.pop("env") for r in job.results] == [{"DISTVAL_TEST_MARK": "set after the server started", "RANK": str(r)}
                                                  for r in range(2)]
    # SIGHUP as an exec'd worker would have it: default, or ignored where this process ignores it
    # (started under nohup); never a handler of the launcher's
    sighup = "ignored" if _disposition(signal.SIGHUP) == "ignored" else "default"
    assert job.results == [{"from_server": True, "threads": 1, "sighup": sighup, "sigterm_blocked": False,
                            "agents_sockets": []}] * 2, job.results
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGTERM)
    time.sleep(0.2)
    assert os.waitpid(server, os.WNOHANG) == (0, 0)  # still running


FORKED = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from distval.launch import LaunchOptions, forkserver, run
forkserver.start(fork=True)  # as the command line does, before any thread
from test_launch import _how_started
job = run(_how_started, os.getpid(), LaunchOptions(nproc=2, timeout_s=60))
print(json.dumps(job.results))
"""


def test_a_fork_server_forked_from_the_command_line_starts_workers_alike(tmp_path):
    """The command line forks the server from itself once torch is imported (torch imported once
    per job, not twice): its workers start as those of multiprocessing's own server do."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTVAL_TEST_MARK": "mine"}
    env = {k: v for k, v in env.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    res = subprocess.run([sys.executable, "-c", FORKED, str(Path(__file__).parent)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads(res.stdout.strip().splitlines()[-1])
    sighup = "ignored" if _disposition(signal.SIGHUP) == "ignored" else "default"
    assert results == [{"from_server": True, "threads": 1, "sighup": sighup, "sigterm_blocked": False,
                        "agents_sockets": [], "env": {"DISTVAL_TEST_MARK": "mine", "RANK": str(r)}}
                       for r in range(2)], results


FRESH_LOOKING = """
import atexit, multiprocessing as mp, os, sys, threading, time
import numpy as np
import torch, torch.distributed as dist
import helper  # beside the script


def child(q):
    q.put(helper.X)


returned = threading.Event()


def late(rank):  # a non-daemon thread still running as the script returns: the interpreter waits for it
    returned.wait()
    time.sleep(0.3)
    print(f"rank {rank} thread done", flush=True)


def main():
    mp.set_start_method("spawn")  # a new interpreter has not chosen one yet
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    atexit.register(print, f"rank {rank} atexit", flush=True)
    threading.Thread(target=late, args=(rank,)).start()
    q = mp.Queue()
    p = mp.Process(target=child, args=(q,))  # a spawned child imports this script as __mp_main__
    p.start()
    got = q.get(timeout=60)
    p.join()
    draws = [None, None]
    dist.all_gather_object(draws, int(np.random.randint(1 << 30)))
    print(f"rank {rank} forked={mp.parent_process() is not None} threads={torch.get_num_threads()} child={got} "
          f"exit={p.exitcode} same_numpy={draws[0] == draws[1]} cwd={os.getcwd() == sys.argv[1]}", flush=True)
    dist.destroy_process_group()
    returned.set()
    return int(sys.argv[2])


if __name__ == "__main__":
    sys.exit(main())
"""


@pytest.mark.parametrize("code", [0, 3])
def test_a_scripts_rank_from_the_fork_server_runs_and_ends_as_in_a_new_interpreter(tmp_path, code):
    """`distval launch` forks a script's ranks from the fork server (Linux, no GPU, one thread):
    each looks like a new interpreter (its start method its own to choose, numpy seeded apart,
    the working directory, one thread) and ends like one (threads joined, atexit run, the
    script's `sys.exit` code)."""
    (tmp_path / "train.py").write_text(FRESH_LOOKING)
    (tmp_path / "helper.py").write_text("X = 7\n")
    res = run_cli("launch", "--nproc", "2", str(tmp_path / "train.py"), str(tmp_path), str(code), cwd=tmp_path)
    out = res.stdout + res.stderr
    for rank in (0, 1):
        assert (f"[rank{rank}]: rank {rank} forked=True threads=1 child=7 exit=0 same_numpy=False cwd=True"
                in out), out[-3000:]
        said = [line for line in out.splitlines() if line.startswith(f"[rank{rank}]: rank {rank} ")]
        assert said[-2:] == [f"[rank{rank}]: rank {rank} thread done", f"[rank{rank}]: rank {rank} atexit"], said
    assert res.returncode == (0 if code == 0 else 3), out[-3000:]
    if code:
        assert "SystemExit: 3" in out, out[-3000:]


def test_the_fork_server_only_where_it_is_safe(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert _start_method() == "forkserver"
    for threads in ("2", None):  # the server's OpenMP read its thread count before the job chose one
        if threads is None:
            monkeypatch.delenv("OMP_NUM_THREADS")
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", threads)
        assert _start_method() == "spawn"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)  # GPUs: as torchrun starts them
    assert _start_method() == "spawn"


def _die(code: int) -> None:
    if code < 0:
        os.kill(os.getpid(), -code)
    raise SystemExit(code)


def test_how_a_job_ended_counts_a_stop_that_arrives_as_the_watchers_close():
    """A watcher that acted as the job ended (a verdict's SIGTERM) can stop it while the agent's
    cleanup runs: the job was stopped, whether the agent had failed or returned."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failure = ProcessFailure(local_rank=1, pid=123, exitcode=-9, error_file="")

    def failed() -> dict:
        raise ChildFailedError("job", {1: failure})

    def stopped_late() -> None:
        raise SignalException("got signal: 15", signal.SIGTERM)

    assert _run(lambda: {0: "ok"}, lambda: None) == _Ended(results={0: "ok"})
    assert _run(failed, lambda: None) == _Ended(exitcodes={1: -9})
    assert _run(failed, stopped_late) == _Ended(stopped=True)
    assert _run(lambda: {0: "ok"}, stopped_late) == _Ended(stopped=True)

    def stopped_early() -> dict:
        raise _Stopped()

    closed = []
    assert _run(stopped_early, lambda: closed.append(True)) == _Ended(stopped=True) and closed == [True]


def test_the_first_rank_killed_by_a_signal_is_seen_in_the_order_of_deaths():
    """torch's agent names one failure, the first it finds: a peer's error after a rank was
    SIGKILLed may come first. The launcher sees the order of deaths as they happen, and leaves
    each exit code to the agent (a fork server's worker's code can be read once)."""
    forkserver.start()
    context = multiprocessing.get_context("forkserver")
    watch = _ExitPeek()
    try:
        killed = context.Process(target=_die, args=(-signal.SIGKILL,))
        killed.start()
        time.sleep(1.0)
        failed = context.Process(target=_die, args=(1,))
        failed.start()
        time.sleep(1.0)
        assert [[p.pid for p in seen] for _, seen in watch.deaths] == [[killed.pid], [failed.pid]]
        killed.join(), failed.join()  # the agent reads the codes
        assert (killed.exitcode, failed.exitcode) == (-signal.SIGKILL, 1)
        here = socket.gethostname()
        beats = {0: {"pid": failed.pid, "host": here}, 1: {"pid": killed.pid, "host": here}, 2: None}
        assert watch.first_killed(beats) == {1: -signal.SIGKILL}
        assert watch.first_killed({0: {"pid": failed.pid, "host": here}}) == {}  # an exit code is not a signal
        assert watch.first_killed({0: {"pid": killed.pid, "host": "elsewhere"}}) == {}  # another node's pid
        watch.deaths[:] = [(0.0, [failed, killed])]  # seen at one look (a loaded host): the signal came first
        assert watch.first_killed(beats) == {1: -signal.SIGKILL}
        watch.deaths[:] = [(0.0, [failed]), (0.4, [killed])]  # the fork server reported the peer first
        assert watch.first_killed(beats) == {1: -signal.SIGKILL}
        watch.deaths[:] = [(0.0, [failed]), (5.0, [killed])]  # a kill well after the first death came later
        assert watch.first_killed(beats) == {}
        watch._stop.set(), watch._thread.join()
        watch.deaths.clear()  # the agent ended the job before this thread had a turn (a loaded host)
        watch.close()  # what it had not seen is seen together, last
        assert sorted(p.pid for p in watch.deaths[0][1]) == sorted([failed.pid, killed.pid])
        assert watch.first_killed(beats) == {1: -signal.SIGKILL}
    finally:
        watch.close()
    assert type(multiprocessing.process._children) is set  # multiprocessing's own set back, once closed twice


def test_a_worker_that_starts_and_dies_between_two_looks_is_seen_at_close():
    """On a loaded host the agent can start workers, find them dead and join them between two of
    the watch's looks: every worker is recorded as it starts, so close() still sees its death."""
    forkserver.start()
    context = multiprocessing.get_context("forkserver")
    watch = _ExitPeek(every_s=60)  # one look, before any worker starts: the next would be in a minute
    try:
        time.sleep(0.2)
        killed = context.Process(target=_die, args=(-signal.SIGKILL,))
        killed.start()
        killed.join()  # the agent's join: multiprocessing forgets it
        assert killed not in multiprocessing.process._children and watch.deaths == []
    finally:
        watch.close()
    assert [[p.pid for p in seen] for _, seen in watch.deaths] == [[killed.pid]]
    here = socket.gethostname()
    assert watch.first_killed({1: {"pid": killed.pid, "host": here}}) == {1: -signal.SIGKILL}


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "distval"]


@pytest.fixture(scope="module")
def torchrun_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """The torchrun jobs of this module, side by side (each waits on its processes more than it
    computes), once: name -> (exit code, output, its folder)."""
    tmp_path = tmp_path_factory.mktemp("torchrun")
    jobs = {"reports": _reports, "failed": _failed, "watch": _two_nodes_with_a_stopped_rank}

    def one(name: str) -> tuple[int, str, Path]:
        (tmp_path / name).mkdir()
        try:
            return (*jobs[name](tmp_path / name), tmp_path / name)
        except subprocess.TimeoutExpired as e:
            return -1, f"timed out after {e.timeout} s", tmp_path / name

    with ThreadPoolExecutor(len(jobs)) as pool:
        return dict(zip(jobs, pool.map(one, jobs)))


def _reports(tmp_path) -> tuple[int, str]:
    res = run_cli("comm", "check", "--ops", "all_reduce,all_gather,sendrecv", "-d", "float32,bfloat16",
                  "--counts", "7,1000", "--expect-world", "2", "--json", str(tmp_path / "c.json"), prefix=TORCHRUN,
                  timeout=180)
    return res.returncode, res.stdout + "\n" + res.stderr


def test_under_torchrun_rank_0_reports(torchrun_runs):
    code, output, where = torchrun_runs["reports"]
    assert code == 0, output[-3000:]
    doc = json.loads((where / "c.json").read_text())
    assert doc["meta"]["launch"] == "torchrun" and doc["meta"]["world_size"] == 2
    assert doc["summary"]["FAIL"] == 0 and doc["summary"]["OK"] == 7 * 2 * 2 - 0
    assert output.count("distval comm check") == 1  # only rank 0 renders


def test_as_srun_tasks(tmp_path):
    """Two processes with the variables srun sets (and no torch ones) form one world."""
    out = tmp_path / "s.json"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))}
    base.update(
        {
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_JOB_ID": "17",
            "SLURM_STEP_NODELIST": "localhost",
            "MASTER_PORT": str(free_port()),
        }
    )
    procs = []
    for rank in range(2):
        env = {**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)}
        cmd = [sys.executable, "-m", "distval", "comm", "check", "--ops", "all_reduce", "-d", "int64", "--counts", "5",
               "--json", str(out)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    doc = json.loads(out.read_text())
    assert doc["meta"]["launch"] == "slurm" and doc["meta"]["world_size"] == 2 and doc["summary"]["OK"] == 4


def _failed(tmp_path) -> tuple[int, str]:
    res = run_cli("comm", "check", "--ops", "all_reduce,broadcast", "-d", "float32", "--counts", "7",
                  "--timeout", "20s", "--json", str(tmp_path / "e.json"), prefix=TORCHRUN, timeout=120,
                  env={"DISTVAL_FAULT": "op=broadcast,rank=1,action=raise,nth=2"})
    return res.returncode, res.stdout + "\n" + res.stderr


def test_under_torchrun_rank_0_names_the_rank_that_failed(torchrun_runs):
    """The rank channel over torchrun's own store: rank 1's state reaches rank 0, whose report
    blames rank 1, not its own error waiting for it. (A rank killed without a word is named the
    same way, from its silence: tests/test_diagnose.py.)"""
    code, output, where = torchrun_runs["failed"]
    assert code != 0
    (check,) = json.loads((where / "e.json").read_text())["checks"]
    assert check["status"] == "ERROR" and check["where"]["rank"] == 1, check
    assert "injected failure at broadcast on rank 1" in check["summary"], check
    assert "comm check broadcast float32" in check["where"]["status"], check
    assert check["details"]["ranks"]["0"]["error"]  # rank 0's own error (the peer's closed connection) is there too


def test_node_watcher_plans_from_torchrun_and_slurm_variables():
    from distval.health.config import HangPolicy
    from distval.launch.watcher import plan

    policy = HangPolicy(floor_s=3.0)
    torchrun = {"RANK": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "16", "GROUP_RANK": "2",
                "MASTER_ADDR": "n0", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "1"}
    spec = plan(torchrun, policy)
    assert spec["node"] == 2 and spec["nodes"] == 4 and spec["ranks"] == [8, 9, 10, 11] and spec["attempt"] == 1
    assert spec["store"] == "n0:29500" and spec["floor_s"] == 3.0
    assert plan({**torchrun, "LOCAL_RANK": "1", "RANK": "9"}, policy) is None  # only local rank 0 starts one
    slurm = {"RANK": "6", "LOCAL_RANK": "0", "WORLD_SIZE": "12", "SLURM_STEP_TASKS_PER_NODE": "3(x4)",
             "SLURM_NODEID": "2", "MASTER_ADDR": "n0", "MASTER_PORT": "29500"}
    assert plan(slurm, policy)["ranks"] == [6, 7, 8] and plan(slurm, policy)["node"] == 2
    assert plan({**slurm, "SLURM_STEP_TASKS_PER_NODE": "4,2(x4)"}, policy) is None  # nodes of different sizes


def _two_nodes_with_a_stopped_rank(tmp_path) -> tuple[int, str]:
    """Two torchrun agents (two nodes, here on one host, c10d rendezvous) of `distval train`;
    rank 1 stops (SIGSTOP) at step 5. Exit code: the worse agent's."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTVAL_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update({"DISTVAL_FAULT": "step=5,rank=1,action=stop", "PYTHONUNBUFFERED": "1"})

    def agent(n: int) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "watch",
               "--max-restarts", "0", "-m", "distval", "train", "--model", "tiny", "--steps", "3000",
               "--hang-after", "3s", "--json", str(tmp_path / f"t{n}.json")]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    agents = [agent(n) for n in (0, 1)]
    try:
        outputs = [a.communicate(timeout=150)[0] for a in agents]
    finally:
        for a in agents:
            a.kill()
    codes = [a.returncode for a in agents]
    return min(codes) if 0 in codes else max(codes), "\n".join(outputs)


def test_under_torchrun_across_two_nodes_the_node_watchdogs_end_a_stopped_rank(torchrun_runs):
    """No rank can report a stopped rank; each node's watchdog process can: node 0's leader names
    rank 1 stopped from the digests, both nodes stop their ranks, and both agents exit non-zero."""
    code, text, _ = torchrun_runs["watch"]
    assert code != 0, text[-3000:]
    lines = [line for line in text.splitlines() if "watchdog:" in line]
    assert any(line.startswith("distval: node 0 watchdog: hang after") for line in lines), text[-3000:]
    assert any(line.startswith("distval: node 1 watchdog:") for line in lines), text[-3000:]
    assert all("rank 1 stopped (SIGSTOP" in line for line in lines), lines
    stalled = float(next(line for line in lines if "hang after" in line).split("hang after ")[1].split(" s")[0])
    assert stalled < 15, lines


def test_the_command_line_starts_the_fork_server_for_the_commands_that_start_workers_here(monkeypatch):
    """Forked from the command line before it starts any thread (torch imported once per job);
    not where it would not be used."""
    from distval.cli import _start_fork_server

    started = []
    monkeypatch.setattr("distval.launch.forkserver.start", lambda fork=False: started.append(fork))
    cases = {("train", "--nproc", "2"): True, ("compare", "--model", "tiny"): True, ("run",): True,
             ("doctor", "--nproc", "2"): True, ("doctor",): False,
             ("train", "--nproc", "1"): False, ("train", "--nproc=1"): False, ("train", "--help"): False,
             ("plan",): False, ("launch", "train.py"): True, ("launch", "--nproc-per-node", "1", "train.py"): False,
             ("launch", "--nproc-per-node=1", "train.py"): False, (): False}
    for args, expected in cases.items():
        started.clear()
        _start_fork_server(list(args))
        assert started == ([True] if expected else []), args
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # a worker of torchrun's: it starts none
    _start_fork_server(["train"])
    assert started == []


def test_a_long_tmpdir_does_not_break_the_fork_servers_socket(tmp_path):
    """The fork server's AF_UNIX socket lives under the temp folder: a TMPDIR whose path leaves it
    over the limit (a job's scratch path) moves its folder under /tmp instead of failing to bind."""
    long = tmp_path / ("scratch-" + "x" * max(1, 100 - len(str(tmp_path))))
    long.mkdir()
    res = run_cli("comm", "check", "--nproc", "2", "--ops", "all_reduce", "-d", "float32", "--counts", "7",
                  env={"TMPDIR": str(long)}, timeout=120)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert len(os.fsencode(os.path.join(str(long), "pymp-xxxxxxxx", "listener-xxxxxxxx"))) >= forkserver.SUN_PATH_MAX
