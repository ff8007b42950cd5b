"""The suite on two workers. `make test` runs it in worker processes of pytest-xdist, a test file
to a worker (its module-scoped jobs stay one per file): many tests wait (on a timeout, a hang's
threshold, a rank's sleep) while the cores idle, so two workers take about three quarters of the
time of one (docs/results/2026-11-29-suite-on-two-workers.md).

A test marked `alone` measures what another test's load would skew: this host's CPU itself (the
kernel's shares of a stopped, queued or throttled process; the CPU of a busy neighbour, loading
every core meanwhile), links emulated at a rate the host's CPU paces (`comm pairs` across emulated
nodes), the ladder's bench fits and the plan it must meet, a traced step's breakdown, or `comm
bench`'s overlap probe. It runs with the host to itself.
Every test, from its fixtures' set-up to their teardown, holds a lock the workers share; an
`alone` test holds it exclusively. A turnstile before the lock keeps an `alone` test from waiting
for ever: once it waits, no other test starts. Run serially (`-n 0`), nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

LOCKS = pytest.StashKey[str]()  # the controller's folder of the two lock files, handed to each worker
WORKER_KEY = "distval_locks"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "alone: measures what another test's load would skew; runs while no other does")
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        config.stash[LOCKS] = tempfile.mkdtemp(prefix="distval-suite-")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # (pytest-xdist's hook: a worker about to start)
    node.workerinput[WORKER_KEY] = node.config.stash[LOCKS]


def pytest_unconfigure(config: pytest.Config) -> None:
    if LOCKS in config.stash:
        shutil.rmtree(config.stash[LOCKS], ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    where = getattr(item.config, "workerinput", {}).get(WORKER_KEY)
    if where is None:
        return (yield)
    with _hold(Path(where), exclusive=item.get_closest_marker("alone") is not None):
        return (yield)


@contextlib.contextmanager
def _hold(where: Path, exclusive: bool) -> Iterator[None]:
    """The workers' readers-writer lock: the turnstile taken, then the room (shared, or alone), then
    the turnstile let go; a test that waits for the room alone holds the turnstile meanwhile."""
    with open(where / "turnstile", "a") as turnstile, open(where / "room", "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
