"""The suite's two tiers. A test that starts a process (ranks, the CLI in a subprocess, torchrun)
is a `job`; `make test-fast` runs every other test and the `smoke` jobs (one per command),
`make test` runs everything.

Which tests start processes is recorded, not guessed: `make jobs-list` runs the whole suite with
DISTVAL_TEST_RECORD naming a file; every process started while a test or a fixture sets up or runs
is caught where Python forks (`subprocess`, `multiprocessing` and torch's elastic agent all go
through `_posixsubprocess.fork_exec`, `os.fork` or `os.posix_spawn`; a process that
multiprocessing's fork server starts is caught at `Process.start`), and the file lists the tests and fixtures that
started one (tests/jobs.txt). At collection a test listed there, or using a listed fixture, is
marked `job`. In the fast tier (DISTVAL_TEST_TIER=fast) a test that starts a process without being
marked fails and names the command that updates the list: the tier cannot grow unnoticed.
"""

from __future__ import annotations

import _posixsubprocess
import multiprocessing.process
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

JOBS = Path(__file__).with_name("jobs.txt")
RECORD = "DISTVAL_TEST_RECORD"  # a file: write the tests and fixtures that started a process to it
TIER = "DISTVAL_TEST_TIER"  # "fast": a test not marked `job` or `smoke` may not start a process

# the one job per command the fast tier keeps (the quickest real run of each; drill has none under a minute)
SMOKE = {
    "comm check": "tests/test_cli.py::test_check_json_reports_each_case_and_details_when_wrong",
    "comm bench": "tests/test_bench_multiproc.py::"
                  "test_burst_timing_on_cpu_is_named_in_the_header_and_obeys_the_formulas",
    "comm pairs": "tests/test_scale.py::test_pairs_on_three_local_ranks",
    "scale --expect": "tests/test_scale.py::test_bench_expectations_pass_and_fail",
    "plan": "tests/test_plan_cli.py::test_real_process_plan_and_bad_input",
    "train": "tests/test_train_cli.py::test_train_reports_every_step",
    "train --resume": "tests/test_ckpt_resume.py::test_ddp_family_resumes_bitwise",
    "compare": "tests/test_train_cli.py::test_compare_command_from_the_issue",
    "run": "tests/test_ladder.py::test_a_bad_gloo_socket_ifname_stops_the_ladder_at_the_doctor",
    "launch": "tests/test_kubernetes.py::test_two_pods_with_only_the_operators_variables_meet_and_run",
    "doctor": "tests/test_doctor_cli.py::test_two_local_ranks_probe_the_rendezvous",
    "trace": "tests/test_trace_analyze.py::test_trace_diff_names_what_moved_and_tests_it_over_steps",
    "emulate": "tests/test_emulate.py::test_sigterm_removes_the_cluster",
    "slurm": "tests/test_slurm.py::test_generated_script_runs_with_fake_srun",
}

_running: list[tuple[str, bool]] = []  # the tests and fixtures being set up or run: (id, may start processes)
_started: set[str] = set()


def _listed() -> set[str]:
    if not JOBS.exists():
        return set()
    return {line.strip() for line in JOBS.read_text().splitlines() if line.strip() and not line.startswith("#")}


def _fixture_id(fixturedef: Any) -> str:
    return f"{fixturedef.baseid}::{fixturedef.argname}"


# a system tool a library asks once a process (platform's `uname -p`, a GPU query): no job
UTILITIES = {"uname", "getconf", "nproc", "hostname", "ip", "ethtool", "lscpu", "ldconfig", "git", "id", "ps",
             "nvidia-smi", "rocm-smi", "amd-smi", "which"}


def _program(args: tuple) -> str:
    """The program a fork-and-exec starts (its first argument's first word), "" when unknown."""
    first = args[0] if args else None
    if isinstance(first, (list, tuple)) and first:
        first = first[0]
    return os.path.basename(os.fsdecode(first)) if isinstance(first, (str, bytes)) else ""


def starting(program: str = "") -> None:
    """Called as this process forks: note who did; in the fast tier, fail an unmarked test."""
    if not _running or program in UTILITIES:
        return
    who, allowed = _running[-1]
    _started.add(who)
    if os.environ.get(TIER) == "fast" and not allowed:
        pytest.fail(f"{who} starts a process but is not marked `job`: run `make jobs-list` to record it in "
                    f"tests/jobs.txt (or mark it smoke)", pytrace=False)


def _wrap(fn: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        starting(_program(args))
        return fn(*args, **kwargs)

    wrapped.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapped


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "job: starts processes (ranks, the CLI, torchrun): recorded in tests/jobs.txt")
    config.addinivalue_line("markers", "smoke: the one job per command that the fast tier keeps")
    _posixsubprocess.fork_exec = _wrap(_posixsubprocess.fork_exec)  # multiprocessing's spawn
    subprocess._fork_exec = _wrap(subprocess._fork_exec)  # type: ignore[attr-defined] (bound at its import)
    for name in ("fork", "posix_spawn", "posix_spawnp"):
        setattr(os, name, _wrap(getattr(os, name)))
    # a process started by multiprocessing's fork server is forked there, not here
    multiprocessing.process.BaseProcess.start = _wrap(multiprocessing.process.BaseProcess.start)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    listed, smoke = _listed(), set(SMOKE.values())
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        fixtures = {_fixture_id(fd[-1]) for fd in defs.values() if fd}
        if item.nodeid in listed or fixtures & listed:
            item.add_marker(pytest.mark.job)
        if item.nodeid in smoke:
            item.add_marker(pytest.mark.smoke)


def _allowed(item: pytest.Item) -> bool:
    return item.get_closest_marker("job") is not None or item.get_closest_marker("smoke") is not None


def _as_item(item: pytest.Item):
    _running.append((item.nodeid, _allowed(item)))
    try:
        yield
    finally:
        _running.pop()


pytest_runtest_setup = pytest.hookimpl(hookwrapper=True)(_as_item)
pytest_runtest_call = pytest.hookimpl(hookwrapper=True)(_as_item)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest):
    allowed = _running[-1][1] if _running else True  # as the test being set up: a module's fixture is its job
    _running.append((_fixture_id(fixturedef), allowed))
    try:
        yield
    finally:
        _running.pop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get(RECORD)
    if not path:
        return
    lines = ["# Tests and fixtures that start a process (ranks, the CLI, torchrun): `make jobs-list` writes",
             "# this from a whole run of the suite; tests/tiers.py marks them `job`.", *sorted(_started)]
    Path(path).write_text("\n".join(lines) + "\n")
