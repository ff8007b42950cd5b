"""The fork server distval's own workers start from where that is safe (launch/local.py
`_start_method`): multiprocessing's, started once per launching process, with torch and distval's
trainer imported before its first fork, so that a worker starts with them (2-3 s of a core each,
most of a short job's start-up) without being a copy of the launching process. That process has
threads (torch's agent, the stores' servers, the monitor) whose locks a plain fork would copy
held: a forked rank was once seen stuck connecting to a store. The fork server has no thread.

This module imports neither torch nor distval's heavy parts: the command line starts the server
before it imports them itself, so the two imports share the cores instead of following each other.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal

PRELOAD = ["distval.launch.worker", "distval.train.loop"]  # torch, torch.distributed, the trainer and strategies


# Signals the server never receives (blocked from its start, as multiprocessing's resource
# tracker does): a SIGTERM to the job's process group (a scheduler's, a user's `kill -- -PGID`)
# must reach the launcher and the workers, which save and stop, not end the server, whose end
# the launcher would read as the death of every worker at once. A worker unblocks it first.
BLOCKED = {signal.SIGTERM}


def start() -> None:
    """The fork server, running from now on (nothing if it already is); it imports PRELOAD by
    itself while this process goes on."""
    multiprocessing.forkserver.set_forkserver_preload(PRELOAD)
    multiprocessing.resource_tracker.ensure_running()  # first: it unblocks SIGTERM after starting its own process
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)  # inherited by the server, kept across its exec
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    atexit.unregister(_stop)  # registered once, however often this runs
    atexit.register(_stop)


def _stop() -> None:
    """At this process's exit, the server ends at once. On its own it ends once it sees this
    process gone, then unloads torch (half a second to a second), holding this process's stdout
    and stderr all the while: whoever reads them to their end (a test, a pipe) waits for it."""
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if pid:
        with contextlib.suppress(ProcessLookupError):  # ended already
            os.kill(pid, signal.SIGKILL)  # its workers have ended with the jobs


class Environ:
    """This process's environment, put in place in a worker as the worker reads its arguments,
    before torch's agent adds the rank's own variables. A worker from the fork server starts with
    the server's environment, the one this process had when the server started; a spawned or
    forked one has this process's, which may have changed since (the launcher sets the rank
    channel's address and the thread count; a test sets its own)."""

    def __init__(self) -> None:
        self.env = dict(os.environ)

    def __reduce__(self) -> tuple:
        return _put_environ, (self.env,)


def _put_environ(env: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env)
