"""The fork server distval's own workers start from where that is safe (launch/local.py
`_start_method`): multiprocessing's, started once per launching process, with torch and distval's
trainer imported before its first fork, so that a worker starts with them (2-3 s of a core each,
most of a short job's start-up) without being a copy of the launching process. That process has
threads (torch's agent, the stores' servers, the monitor) whose locks a plain fork would copy
held: a forked rank was once seen stuck connecting to a store. The fork server has no thread.

The command line starts the server before it starts any thread (`start(fork=True)`): it imports
PRELOAD itself, then forks the server from itself, so torch is imported once per job rather than
twice (the command line needs it for torch's agent anyway). Elsewhere, or where this Python's
multiprocessing differs from the one this was written against, the server is multiprocessing's
own: a new interpreter that imports PRELOAD by itself.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading

PRELOAD = ["distval.launch.worker", "distval.train.loop", "distval.launch.shim"]  # torch, torch.distributed,
# the trainer and strategies, what a launched script runs in


# Signals the server never receives (blocked from its start, as multiprocessing's resource
# tracker does): a SIGTERM to the job's process group (a scheduler's, a user's `kill -- -PGID`)
# must reach the launcher and the workers, which save and stop, not end the server, whose end
# the launcher would read as the death of every worker at once. A worker unblocks it first.
BLOCKED = {signal.SIGTERM}


def in_worker() -> None:
    """First thing in a worker the server forked: SIGTERM no longer blocked, one intra-op thread
    (the server imported torch before the job set OMP_NUM_THREADS=1)."""
    import torch

    signal.pthread_sigmask(signal.SIG_UNBLOCK, BLOCKED)
    torch.set_num_threads(1)


def end_like_interpreter() -> None:
    """What an interpreter does as it ends, short of tearing its modules down (torch's take 0.7 s
    and a forked process ends by `os._exit` after this): its non-daemon threads joined, its atexit
    functions run, its standard streams flushed. For a process forked from a server, which would
    otherwise skip all three."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()


SUN_PATH_MAX = 104  # bytes of an AF_UNIX socket's path with its NUL: macOS's limit (Linux's is 108)


def _short_socket_folder() -> None:
    """multiprocessing binds the fork server's socket in a folder it makes under the temp folder;
    where TMPDIR is long (a job's scratch path) that path outgrows AF_UNIX's limit and the bind
    fails. Then the folder goes under /tmp, private and removed at exit as multiprocessing's own
    (what Python 3.13's multiprocessing does by itself)."""
    config = multiprocessing.process.current_process()._config  # type: ignore[attr-defined]
    longest = os.path.join(tempfile.gettempdir(), "pymp-xxxxxxxx", "listener-xxxxxxxx")
    if config.get("tempdir") is not None or len(os.fsencode(longest)) < SUN_PATH_MAX or not os.path.isdir("/tmp"):
        return
    folder = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-100)
    config["tempdir"] = folder


def start(fork: bool = False) -> None:
    """The fork server, running from now on (nothing if it already is). `fork`: forked from this
    process once it has imported PRELOAD (by a caller that has started no thread yet), else
    started as a new interpreter that imports PRELOAD by itself while this process goes on."""
    _short_socket_folder()
    multiprocessing.forkserver.set_forkserver_preload(PRELOAD)
    multiprocessing.resource_tracker.ensure_running()  # first: it unblocks SIGTERM after starting its own process
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)  # inherited by the server, kept across its exec
    try:
        if not (fork and _forked()):
            multiprocessing.forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    atexit.unregister(_stop)  # registered once, however often this runs
    atexit.register(_stop)


def _forked() -> bool:
    """multiprocessing's fork server, forked from this process with PRELOAD imported: what its
    ensure_running() does, with a fork for its exec. False (nothing done) where a server runs
    already, this process has a thread of Python's, or multiprocessing's server takes other
    arguments than Python 3.11-3.12's (3.13's and later authenticate their clients)."""
    server = multiprocessing.forkserver._forkserver  # type: ignore[attr-defined]
    known = all(hasattr(server, f) for f in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid"))
    if not known or hasattr(server, "_forkserver_authkey") or server._forkserver_pid is not None \
            or threading.active_count() > 1:
        return False
    for name in PRELOAD:
        importlib.import_module(name)
    sys.stdout.flush()  # else every worker would write this process's buffered output again at its end
    sys.stderr.flush()
    with socket.socket(socket.AF_UNIX) as listener:
        address = multiprocessing.connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        if not multiprocessing.util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # the server ends when its write end (this process's) closes
        pid = os.fork()
        if pid == 0:
            try:
                os.close(alive_w)
                multiprocessing.forkserver.main(listener.fileno(), alive_r, [])
            finally:
                os._exit(0)  # never back into the command line's code
        os.close(alive_r)
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    return True


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
