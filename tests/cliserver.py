"""A warm interpreter for the suite's command lines. Every `distval ...` a test runs would import
torch first (1.8 s of a core here, the largest share of a short command's CPU); the suite runs
about a hundred of them. This server imports torch once and forks a child for each command, which
runs `python -m distval ARGS` as that interpreter would (runpy, `__main__`, its own argv,
environment, working folder and standard streams, atexit), imports distval afresh with the
command's environment, and ends as the interpreter would (its threads joined, atexit, the
streams flushed) with the command's exit code, but without tearing its modules down (0.7 s with
torch loaded). What the child cannot take from a
warm interpreter falls back to a fresh one (`CliServer.serves`): interpreter-level variables
(PYTHON*, OpenMP's and torch's own, read as torch loads) that differ from the server's, another
program than distval, or DISTVAL_TEST_FRESH=1 for the whole suite.

Protocol: one Unix socket pair. A request is the command as JSON with three descriptors (stdout,
stderr: files the caller reads after; a status pipe): the server forks, writes `pid N` to the
status pipe, and once it has reaped the child `exit CODE` (as subprocess reports it: -SIGNAL when
killed), then closes its end. Children are reaped as they end: no zombie waits for a caller."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

FRESH = "DISTVAL_TEST_FRESH"  # "1": every command in a fresh interpreter
# read by the interpreter or as torch loads (the server's values hold in a forked child)
_AT_LOAD = ("PYTHON", "OMP_", "KMP_", "MKL_", "GOMP_", "LD_", "MALLOC_", "TORCH_", "CUDA_", "HIP_", "ROCR_")

_SERVER = r'''
import json, os, runpy, select, signal, socket, sys, traceback
import torch  # what every command pays; distval is imported by each child, with its own environment
sock = socket.socket(fileno=int(sys.argv[1]))
status = {}  # pid -> the caller's status pipe
woken, wake = os.pipe()  # a child's end wakes the loop at once (SIGCHLD through the wakeup fd)
os.set_blocking(wake, False)
os.set_blocking(woken, False)
signal.set_wakeup_fd(wake)
signal.signal(signal.SIGCHLD, lambda *_: None)
while True:
    ready, _, _ = select.select([sock, woken], [], [], 1.0)
    if woken in ready:
        os.read(woken, 4096)
    while status:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        w = status.pop(pid, None)
        if w is not None:
            os.write(w, b"exit %d\n" % os.waitstatus_to_exitcode(code))
            os.close(w)
    if sock not in ready:
        continue
    msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
    if not msg:
        break
    req = json.loads(msg)
    out, err, w = fds
    pid = os.fork()
    if pid:
        os.close(out)
        os.close(err)
        status[pid] = w
        os.write(w, b"pid %d\n" % pid)
        continue
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sock.close()
    for fd in [w, woken, wake, *status.values()]:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, std in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, std)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    if "tempfile" in sys.modules:  # its folder, if chosen, was the server's
        sys.modules["tempfile"].tempdir = None
    sys.argv = ["distval", *req["args"]]
    try:
        runpy.run_module("distval", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
    try:  # the interpreter's ending; whatever happens, this child never returns to the server's loop
        from distval.launch.forkserver import end_like_interpreter  # torch loaded: a cheap import
        end_like_interpreter()
    finally:
        os._exit(code if isinstance(code, int) else 0 if code is None else 1)
'''


class CliServer:
    """The server process and this side's end of its socket; `run` is subprocess.run's
    (capture_output=True, text=True) for `python -m distval ARGS`."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        mine, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                     env=self.env, stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock, self.lock = mine, threading.Lock()

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a forked child runs the command as a fresh interpreter would with `env`."""
        if self.proc.poll() is not None or env.get(FRESH) == "1":
            return False
        keys = {k for k in {*env, *self.env} if k.startswith(_AT_LOAD)}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def run(self, args: list[str], env: dict[str, str], cwd: str | os.PathLike | None,
            timeout: float) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "distval", *args]
        r, w = os.pipe()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            request = json.dumps({"args": list(args), "env": env, "cwd": os.fspath(cwd or os.getcwd())}).encode()
            try:
                with self.lock:
                    socket.send_fds(self.sock, [request], [out.fileno(), err.fileno(), w])
            finally:
                os.close(w)
            pid, code = None, None
            deadline = time.monotonic() + timeout
            with os.fdopen(r, "rb") as status:
                said = b""
                while code is None:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([status], [], [], left)[0]:
                        if pid is not None:
                            _kill(pid)
                        raise subprocess.TimeoutExpired(cmd, timeout, _read(out), _read(err))
                    data = status.read1(256)
                    if not data:
                        raise RuntimeError(f"the command server ended before `distval {' '.join(args)}` did")
                    said += data
                    while b"\n" in said:
                        line, said = said.split(b"\n", 1)
                        word, _, value = line.partition(b" ")
                        if word == b"pid":
                            pid = int(value)
                        elif word == b"exit":
                            code = int(value)
            return subprocess.CompletedProcess(cmd, code, _read(out), _read(err))

    def close(self) -> None:
        self.sock.close()  # the server's loop ends at the end of its socket
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _read(f: Any) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended as the time ran out
        os.kill(pid, signal.SIGKILL)
