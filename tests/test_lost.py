"""health/lost.py: a rank slowed from outside its process is named from the time it could not run
(stopped, or queued for a CPU beyond its peers' ratio); a busy host, a rank that alone works and
a host that stops every rank are not. The shares are measured on real processes by the kernel."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distval.health.faults import throttle
from distval.health.lost import HostCpu, _Rank
from distval.health.monitor import HealthConfig
from distval.health.slowed import PERSIST, WINDOW, Slowed


def bucket(stopped: float = 0.0, queued: float = 0.08, runnable: float = 0.25, throttled: float = 0.0):
    return {"stopped": stopped, "throttled": throttled, "queued": queued, "runnable": runnable}


def feed(rule: Slowed, buckets: int, shares, seed: int = 0, foreign=None) -> list:
    """`shares(i, rng)`: bucket i's shares by rank; the job makes 10 steps a bucket; `foreign(i)`:
    the CPUs other processes used in bucket i (None: unknown)."""
    rng, found = random.Random(seed), []
    for i in range(buckets):
        f = rule.update(10 * i + 1, shares(i, rng), foreign(i) if foreign else None)
        if f is not None:
            found.append(f)
    return found


def noisy(rng: random.Random, world: int = 3) -> dict[int, dict[str, float]]:
    return {r: bucket(queued=rng.uniform(0.04, 0.14), runnable=rng.uniform(0.18, 0.3)) for r in range(world)}


@pytest.mark.parametrize("seed", range(5))
def test_a_clean_busy_host_names_nobody(seed):
    assert feed(Slowed(HealthConfig()), 300, lambda i, rng: noisy(rng), seed) == []


def test_a_rank_stopped_from_outside_is_named_from_the_bucket_it_began():
    def shares(i, rng):
        out = noisy(rng)
        if i >= 40:  # stopped 17% of the time: 20% slower
            out[2]["stopped"] = rng.uniform(0.13, 0.21)
        return out

    rule = Slowed(HealthConfig())
    (found,) = feed(rule, 120, shares)
    assert found.kind == "straggler" and found.ranks == [2] and found.details["decided_by"] == ["lost_time"]
    assert 390 <= found.step <= 420 and found.details["detected_step"] <= 401 + 10 * (WINDOW // 2 + PERSIST), \
        found.details
    assert 0.13 < found.details["stopped_share"] < 0.21 and 1.15 < found.details["slowdown"] < 1.3
    assert f"rank 2 is a straggler slowed from outside its process since step {found.step}: stopped 1" \
        in found.summary


def test_a_rank_on_a_busy_core_is_named_but_not_a_rank_that_alone_works_on_a_busy_host():
    def neighbour(i, rng):  # rank 1 waits for a CPU half of its runnable time, its peers 5% of theirs
        out = {r: bucket(queued=0.015, runnable=0.3) for r in (0, 2)}
        out[1] = bucket(queued=0.3 if i >= 20 else 0.015, runnable=0.6 if i >= 20 else 0.3)
        return out

    (found,) = feed(Slowed(HealthConfig()), 60, neighbour, foreign=lambda i: 0.6 if i >= 20 else 0.0)
    assert found.ranks == [1], found
    assert "its threads waiting for a CPU 0.30 s a second, 50% of their runnable time against its peers' 5%, while " \
        "other processes used 0.6 CPUs" in found.summary, found.summary

    def evaluation(i, rng):  # every 40 buckets rank 0 evaluates alone for 20 (the others blocked, not runnable)
        out = noisy(rng)
        if i % 40 >= 20:
            q = rng.uniform(0.28, 0.48)  # the host's queue ratio (the noisy buckets' median: 0.38)
            out = {0: bucket(queued=q * 0.95, runnable=0.95), 1: bucket(runnable=0.0, queued=0.0),
                   2: bucket(runnable=0.0, queued=0.0)}
        return out

    assert feed(Slowed(HealthConfig()), 200, evaluation) == []


def test_a_queue_the_job_causes_itself_names_nobody_and_the_host_is_said_once():
    """Two ranks and the launcher on two cores, nothing else running: the scheduler lets one rank wait
    38% of its runnable time and the other 13% for as long as the job runs (a false alarm once); no
    other process took a CPU, so the queue is the job's own, not a straggler's."""
    def lopsided(i, rng):
        return {0: bucket(queued=0.13 * 1.1, runnable=1.1), 1: bucket(queued=0.38 * 1.2, runnable=1.2)}

    rule = Slowed(HealthConfig())
    assert feed(rule, 200, lopsided, foreign=lambda i: 0.03) == []
    note = rule.host_note(2)
    assert note.startswith("the host is oversubscribed: every rank waited for a CPU 26% of its runnable time") \
        and "the job's ranks and their threads want more than its 2 CPUs" in note, note
    assert Slowed(HealthConfig()).host_note(2) is None
    quiet = Slowed(HealthConfig())
    feed(quiet, 100, lambda i, rng: {r: bucket(queued=rng.uniform(0.01, 0.04)) for r in range(2)},
         foreign=lambda i: 0.0)
    assert quiet.host_note(2) is None  # 4-16% queued: not worth a line


def test_evidence_must_last_in_seconds_and_steps_and_start_up_is_not_judged():
    def burst(i, rng):  # stopped half the time for 5 s, once
        out = noisy(rng)
        if 30 <= i < 35:
            out[1]["stopped"] = 0.5
        return out

    assert feed(Slowed(HealthConfig()), 100, burst) == []
    rule = Slowed(HealthConfig())  # a rank stopped for 20 s, but the job made one step a second: not enough steps
    for i in range(20):
        assert rule.update(i + 1, {r: bucket(stopped=0.4 if r == 1 else 0.0) for r in range(3)}) is None
    assert rule.update(0, {r: bucket(stopped=0.4 if r == 1 else 0.0) for r in range(3)}) is None
    assert len(rule.host) == 20  # step 0 (start-up) is not judged
    assert rule.update(40, {r: bucket(stopped=0.4 if r == 1 else 0.0) for r in range(3)}).ranks == [1]


@pytest.mark.alone  # (tests/parallel.py)
def test_the_foreign_cpu_is_a_busy_neighbour_s_and_not_the_job_s():
    """A child of this process spinning is the job's own; a process outside the job's family (an
    orphan, as another user's job is) is foreign."""
    spin = f"{sys.executable} -c 'while True: pass'"
    mine = subprocess.Popen(["sh", "-c", f"exec {spin}"])
    outside = int(subprocess.run(["sh", "-c", f"{spin} >/dev/null 2>&1 & echo $!"], capture_output=True,
                                 text=True).stdout)
    try:
        apart, within = HostCpu(), HostCpu()  # the same second, the outsider counted out and in
        apart.take({mine.pid})
        within.take({mine.pid, outside})
        time.sleep(1.0)
        foreign, rest = apart.take({mine.pid}), within.take({mine.pid, outside})
    finally:
        os.kill(outside, 9)
        mine.kill()
        mine.wait()
    assert 0.4 < foreign - rest < 1.1, (foreign, rest)  # the outsider's CPU (most of a core), never the child's


def test_a_rank_whose_cgroup_quota_throttles_it_is_named_and_a_shared_quota_names_none():
    def quota(i, rng, everyone=False):
        out = noisy(rng)
        for r in (range(3) if everyone else [1]):
            out[r]["throttled"] = 0.3 if i >= 20 else 0.0
        return out

    (found,) = feed(Slowed(HealthConfig()), 60, quota)
    assert found.ranks == [1] and "throttled by its cgroup's CPU quota 30% of the time" in found.summary
    assert feed(Slowed(HealthConfig()), 60, lambda i, rng: quota(i, rng, everyone=True)) == []


def test_a_host_that_stops_every_rank_names_none_and_a_finding_ends_when_the_stops_do():
    assert feed(Slowed(HealthConfig()), 100, lambda i, rng: {r: bucket(stopped=0.3) for r in range(3)}) == []

    def stops(i, rng):
        out = noisy(rng)
        if 20 <= i < 60:
            out[0]["stopped"] = 0.4
        return out

    rule = Slowed(HealthConfig())
    (found,) = feed(rule, 100, stops)
    assert found.ranks == [0] and 600 <= found.details["until_step"] <= 700, found.details


@pytest.mark.alone  # (tests/parallel.py)
def test_the_kernel_shares_of_a_stopped_and_of_a_queued_process():
    """A busy child stopped 1/3 of the time by the throttle fault's process; a busy child pinned on one
    core with another busy process: half of its runnable time queued."""
    busy = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"
    stopped = subprocess.Popen([sys.executable, "-c", busy, "0"])
    queued = subprocess.Popen([sys.executable, "-c", busy, "1"])
    rival = subprocess.Popen([sys.executable, "-c", busy, "1"])
    stopper = throttle(stopped.pid, 50)  # stopped 33 of every 100 ms
    try:
        time.sleep(0.3)
        ranks = [_Rank(stopped.pid), _Rank(queued.pid)]
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            for r in ranks:
                r.sample()
            time.sleep(random.uniform(0.005, 0.015))
        first, second = (r.take() for r in ranks)
    finally:
        for p in (stopper, stopped, queued, rival):
            p.kill()
            p.wait()
    assert 0.2 < first["stopped"] < 0.6, first  # 1/3, more where a loaded host delays the SIGCONT
    assert 0.3 < second["queued"] / second["runnable"] < 0.8 and second["stopped"] == 0, second
    assert os.cpu_count() >= 2


@pytest.mark.alone  # (tests/parallel.py)
def test_the_kernel_share_of_a_process_throttled_by_its_cgroup(tmp_path):
    """A busy child in a cpu cgroup whose quota is 30 ms of every 100 ms: throttled ~70% of the time
    on an idle host (less on a loaded one, where it also waits for a CPU), never running more than 30%."""
    v1 = Path("/sys/fs/cgroup/cpu")
    group = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / f"distval_test_{os.getpid()}"
    try:
        group.mkdir()
    except OSError as e:
        pytest.skip(f"no writable cpu cgroup here: {e.strerror}")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        if v1.is_dir():
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text("30000")
            (group / "tasks").write_text(str(busy.pid))
        else:
            (group / "cpu.max").write_text("30000 100000")
            (group / "cgroup.procs").write_text(str(busy.pid))
        rank = _Rank(busy.pid)
        time.sleep(1.0)
        rank.sample()
        shares = rank.take()
    finally:
        busy.kill()
        busy.wait()
        time.sleep(0.1)
        group.rmdir()
    assert 0.2 < shares["throttled"] < 0.85 and shares["runnable"] - shares["queued"] < 0.36, shares


def test_a_longer_compute_the_host_scheduling_explains_is_no_straggler_but_a_neighbours_is():
    """Seen in the corpus (a Trainer-shaped script, 2 ranks at 20 ms, nothing else running): the
    compute rule named rank 0 "1.25x the compute time of its peers". Compute is wall time; rank 0
    waited for a CPU 30% of its runnable time against its peer's 10%, which alone makes it
    0.9/0.7 = 1.29x slower. With other processes taking the CPU it is a straggler slowed from
    outside after all; with equal queues its longer compute is its own."""
    from distval.health.stragglers import Stragglers

    def lopsided(i, rng):
        return {0: bucket(queued=0.30, runnable=1.0), 1: bucket(queued=0.10, runnable=1.0)}

    own = Slowed(HealthConfig())
    feed(own, 30, lopsided, foreign=lambda i: 0.02)
    assert own.by_host(0, 1.25) and not own.by_host(0, 1.8)  # 1.29x explains 1.25x, not most of 1.8x
    busy = Slowed(HealthConfig())
    feed(busy, 30, lopsided, foreign=lambda i: 0.8)
    assert not busy.by_host(0, 1.25)
    even = Slowed(HealthConfig())
    feed(even, 30, lambda i, rng: {r: bucket(queued=0.2, runnable=1.0) for r in range(2)}, foreign=lambda i: 0.0)
    assert not even.by_host(0, 1.25)
    assert not Slowed(HealthConfig()).by_host(0, 1.25)  # nothing sampled: the compute rule decides alone

    def run(by_host):
        rule, found = Stragglers(HealthConfig(), by_host), []
        for step in range(600):  # rank 0 computes 25 ms to its peer's 20 ms: 1.25x, 12 s of 20 ms steps
            rows = [{"step_s": 0.025, "compute_s": 0.025, "blocked_s": 0.0},
                    {"step_s": 0.025, "compute_s": 0.020, "blocked_s": 0.005}]
            found += [f] if (f := rule.update(step, rows, None)) else []
        return found

    assert run(own.by_host) == []
    assert [f.ranks for f in run(busy.by_host)] == [[0]] and [f.ranks for f in run(None)] == [[0]]
