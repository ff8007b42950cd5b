"""Shared helpers: run the real CLI in a process of its own with a hard timeout, so a hang fails
the test instead of the suite (forked from a warm interpreter where that runs it as a fresh one
would: tests/cliserver.py); train the one-process reference the multi-rank tests compare against."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cliserver import CliServer

REPO = Path(__file__).resolve().parents[1]
pytest_plugins = ("tiers", "parallel")  # the fast tier and the `job` marker; the suite on two workers


def run_cli(*args: str, timeout: float = 180, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**_base_env(), **(env or {})}
    if prefix is None and _server().serves(full_env):
        from tiers import starting  # (the plugin's module, loaded by then)

        starting("distval")  # the fork is the server's: the test starts a process all the same
        return _server().run(list(args), full_env, cwd, timeout)
    cmd = (prefix or [sys.executable, "-m", "distval"]) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)


def _base_env() -> dict[str, str]:
    """This process's environment less what would make a command a rank of some job."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "DISTVAL_FAULT"))}


_servers: list[CliServer] = []


def _server() -> CliServer:
    """The suite's command server, started at the first command."""
    if not _servers:
        _servers.append(CliServer(_base_env()))
    return _servers[0]


def pytest_sessionfinish(session: pytest.Session) -> None:
    for server in _servers:
        server.close()


def reference_run(cfg, world: int, **changes) -> dict:
    """What `world` ranks of micro-batch B train (a TrainConfig), trained by one process on
    micro-batch world x B: the same global batch, accumulation, seed and data, as `distval compare`
    trains its reference. Returns rank 0's result: "steps" (each step's loss, grad_norm, ...) and,
    with return_params, "params" (the final parameters, flattened). The strategy is simple_ddp_ga
    unless `changes` names another; `changes` replace any other field of `cfg` too."""
    import dataclasses

    from distval.launch import LaunchOptions, run
    from distval.train.loop import train_rank

    ref = dataclasses.replace(cfg, **{"strategy": "simple_ddp_ga", "micro_batch": cfg.micro_batch * world, **changes})
    return run(train_rank, ref, LaunchOptions(nproc=1, timeout_s=60)).results[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session", autouse=True)
def suite_tmpdir(tmp_path_factory: pytest.TempPathFactory):
    """Every process the suite starts keeps its temporary files in a folder of the suite's own,
    which pytest prunes with its other temporary folders: torch's elastic agent leaves a torchelastic_*
    folder in the temporary folder for every torchrun the tests start as a user would, and a
    pytorch-errorfile-*.pickle for every worker it kills; in /tmp they piled up, suite after suite."""
    folder = tmp_path_factory.mktemp("tmpdir")
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    yield folder
    if before is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = before


@pytest.fixture
def cli(capsys, monkeypatch):
    """`distval ARGS` in this process (no interpreter and torch start-up per call): for bad-input
    cases, which end before any worker starts (so no fork server is started for them either).
    Returns what run_cli returns."""
    monkeypatch.setattr("distval.cli._start_fork_server", lambda args: None)

    def call(*args: str) -> subprocess.CompletedProcess:
        from distval.cli import main

        code = 0
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(["distval", *args], code, captured.out, captured.err)

    return call


def run_check(cfg, opts):
    """`distval comm check` as cli/comm.py runs it, in this process's launcher."""
    import functools

    from distval.comm import check
    from distval.launch.execute import execute

    return execute("comm check", check.check_rank, cfg, opts, functools.partial(check.build_report, cfg=cfg))


def run_bench(cfg, opts):
    """`distval comm bench` as cli/comm.py runs it."""
    import functools

    from distval.comm import bench
    from distval.launch.execute import execute

    return execute("comm bench", bench.bench_rank, cfg, opts, functools.partial(bench.build_report, cfg=cfg))
