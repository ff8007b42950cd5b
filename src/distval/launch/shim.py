"""What each worker of `distval launch` runs: the user's script, unchanged, with distval around it.

    python -m distval.launch.shim script.py ARGS...
    python -m distval.launch.shim -m module ARGS...

Before the script starts: the Flight Recorder is switched on (so every collective the script's
process groups issue — its own dist.* calls, DDP's and FSDP's from C++ — is recorded) and the
heartbeat thread starts publishing this rank's progress on the rank channel of distval's
launcher, which runs the hang watchdog, and a step clock follows the script's optimizer steps
for the straggler rule (health/steps.py). The script runs as `__main__` with its own argv; an
exception it raises (or a script's sys.exit with a non-zero code) is published as this rank's
`state` for the failure diagnosis, with the optimizer steps it had finished (none: it died during
start-up); an exception's traceback is printed from the script's own first frame, and the worker
exits 1 as Python would. An exception of its own raised before the first optimizer step, where
the agent would restart the workers, also asks the launcher not to (a `note`): the script would
raise it again in every attempt. Under `distval launch --trace SKIP:N` a profiler records N of
the script's optimizer steps after SKIP (trace/capture.py).
"""

from __future__ import annotations

import inspect
import os
import runpy
import signal
import socket
import sys
import threading
import time
import traceback
from types import TracebackType
from typing import Any, Callable

from distval.health.diagnose import secondary
from distval.health.heartbeat import Heartbeat, enable_flight_recorder, last_collectives, write_dump
from distval.health.probe import Probe
from distval.health.probe import from_env as probe_settings
from distval.health.steps import StepClock
from distval.launch import channel as channels
from distval.protocol import Kind
from distval.rank import state_payload
from distval.trace.capture import from_env

TERM_GRACE_S = 1.0  # a SIGTERM the main thread cannot take (blocked in C) is answered from a thread after this
# a rank that asked not to be restarted waits this long for the launcher to stop the job, so that
# the agent, which sees the exit and not the note, does not restart every worker first
NO_RESTART_WAIT_S = 5.0


class LastWords:
    """This rank's `state`, published once, as it fails: the error, the traceback, the script's
    optimizer steps so far (`script_step`: 0 is a death during start-up) and the fingerprints of
    its last collectives (the Flight Recorder's, a few ms), after its whole Flight Recorder dump
    where the launcher asked for one (`write_dump`, first: it needs no store; on SIGTERM the
    thread below writes it at once too, since a spinning main thread on a loaded host has been
    seen to take its handler too late, past the stop's grace).

    SIGTERM (torch's agent stopping the job after another rank failed) is taken by a handler
    that publishes and exits 128 + 15, as the default action would. A Python handler runs on
    the main thread only, once it is back in Python; a rank blocked in C (a collective that
    never returns, a CUDA synchronisation) would hold on until the agent's SIGKILL 30 s later,
    so a thread woken by the signal (the interpreter's wakeup fd) answers for it after
    TERM_GRACE_S. Whichever comes second waits for the first to finish speaking before the process
    ends. A script that installs its own SIGTERM handler keeps it: then neither acts."""

    def __init__(self, channel: channels.RankChannel, rank: int, status: str, steps: StepClock):
        self.channel, self.rank, self.status, self.steps = channel, rank, status, steps
        self._lock = threading.Lock()
        self._said = False
        self._spoken = threading.Event()

    def say(self, error: str | None, traceback_text: str = "") -> None:
        """`error`: None for a rank stopped from outside (SIGTERM), as a distval worker says it."""
        with self._lock:
            if self._said:
                return
            self._said = True
        try:
            write_dump(self.rank)
            state = {**state_payload(self.rank, self.status, [], error, traceback_text),
                     "recent": last_collectives(), "script_step": self.steps.step}
            self.channel.publish(Kind.STATE, state, flush=True)
        finally:
            self._spoken.set()

    def install(self) -> LastWords:
        signal.signal(signal.SIGTERM, self._on_term)
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read,), name="distval-last-words", daemon=True).start()
        return self

    def _on_term(self, signum: int, frame: object) -> None:
        self._term()

    def _term(self) -> None:
        try:
            self.say(None)
            self._spoken.wait(TERM_GRACE_S)  # the other caller's words, under way, are not cut short
        finally:
            os._exit(128 + signal.SIGTERM)

    def _watch(self, read: int) -> None:
        while True:
            got = os.read(read, 64)
            if signal.SIGTERM in got and signal.getsignal(signal.SIGTERM) == self._on_term:
                write_dump(self.rank)  # at once, from this thread: the main thread may not get the CPU in time
                time.sleep(TERM_GRACE_S)  # the main thread's handler ends the process first if it can
                self._term()


def main(argv: list[str]) -> None:
    """`script.py ARGS...`, or `-m module ARGS...` (as python runs it)."""
    module = argv[0] == "-m"
    script, *args = argv[1:] if module else argv
    rank = int(os.environ.get("RANK", "0"))
    enable_flight_recorder()
    channel = channels.for_worker(rank)
    status = f"running {script if module else os.path.basename(script)}"
    # `script`: this rank runs a launched script (a death before its first optimizer step is one
    # during start-up: health/diagnose.py); pid and host name it
    said = {"status": status, "pid": os.getpid(), "host": socket.gethostname(), "script": True}
    channel.publish(Kind.STATUS, said, flush=True)
    _say_first_step(channel, said)
    # the script's optimizer steps: stragglers, memory (health/steps.py); NaN/Inf, replicas (health/probe.py)
    steps = StepClock(channel, probe=Probe(*probe_settings())).start()
    last_words = LastWords(channel, rank, status, steps).install()
    # the step in the heartbeat tells the watchdog the script's loop runs (health/hang.py Watchdog)
    heartbeat = Heartbeat(channel, lambda: (status, {"step": steps.step})).start()
    _beat_before_destroy(heartbeat)
    tracer = from_env(rank)  # `distval launch --trace`: the script's optimizer steps are the steps
    sys.argv = [script, *args]
    if not module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        if module:  # distval's own commands too: a distval worker takes this heartbeat over (launch/worker.py)
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
        _finished(channel, status)
    except SystemExit as e:
        if e.code in (None, 0):
            _finished(channel, status)
        elif not module:  # a script's sys.exit(2) or sys.exit("no data"), named as its error
            last_words.say(f"SystemExit: {e.code}")  # (under -m, a distval job has said its own)
        raise
    except Exception as e:
        _failed(e, last_words, steps.step)
        sys.exit(1)  # as Python exits on an uncaught exception, its traceback printed already
    except BaseException as e:  # KeyboardInterrupt: Python's own exit (the status of SIGINT)
        last_words.say(f"{type(e).__name__}: {e}".strip(), _format(e, e.__traceback__))
        raise
    finally:
        if tracer:
            tracer.close()
        steps.close()
        heartbeat.close()
        channel.close()


def from_server(argv: list[str], cwd: str) -> None:
    """`main(argv)` in a worker forked from the launcher's fork server (launch/forkserver.py)
    instead of the new interpreter `python -m distval.launch.shim ARGV`, which it is first made to
    look like: SIGTERM no longer blocked, one intra-op thread (`forkserver.in_worker`),
    multiprocessing's start method not chosen yet (a script may choose it), numpy's global generator
    seeded afresh (a new interpreter seeds it from the OS; forked ranks would share the server's
    stream; Python's `random` reseeds itself at a fork), the job's working directory first on
    sys.path as under `python -m`. It ends as that interpreter would: non-daemon threads joined,
    then the atexit functions run (the server would skip them), with the exit status it would give
    (the script's sys.exit code, 1 after an uncaught exception, SIGINT's after a KeyboardInterrupt),
    and at once: a rank whose script returned early (it skipped a collective) must not linger, its
    connections open, until every rank has returned, as torch's function workers do
    (`_returned`)."""
    import multiprocessing.context

    from distval.launch import forkserver

    forkserver.in_worker()
    multiprocessing.context._default_context._actual_context = None  # type: ignore[attr-defined]
    if "numpy.random" in sys.modules:  # imported by the server (today it is not: a rank imports it afresh)
        sys.modules["numpy.random"].seed()
    os.chdir(cwd)
    sys.path[0] = cwd
    code: Any = 0
    interrupted = False
    try:
        main(argv)
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt as e:
        interrupted = True
        sys.excepthook(type(e), e, e.__traceback__)
    finally:
        forkserver.end_like_interpreter()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    if code not in (None, 0):
        raise SystemExit(code)  # multiprocessing's exit: the code, or 1 after printing a message
    _returned()


def _returned() -> None:
    """The script returned: this worker's result (None) handed to torch's agent, then its exit. A
    function worker of torch's agent otherwise waits after returning until every worker has (its
    `_wrap`); found by its frame, where torch keeps the result's queue. Without it (another torch)
    the worker returns and waits as torch's do."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "_wrap" and "ret_val_" in frame.f_locals):
        frame = frame.f_back
    if frame is not None:
        frame.f_locals["ret_val_"].put(None)
        os._exit(0)


def _say_first_step(channel: channels.RankChannel, said: dict[str, Any]) -> None:
    """The script's first optimizer step, written at once (`stepped`): a rank killed soon after it
    did not die during start-up, though its last heartbeat (every 0.5 s, not flushed) says step 0."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    first = threading.Event()

    def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not first.is_set():  # the hook stays: torch iterates its hooks as it calls them, so none may go
            first.set()
            channel.publish(Kind.STATUS, {**said, "stepped": True}, flush=True)

    register_optimizer_step_post_hook(stepped)


def _failed(e: Exception, last_words: LastWords, step: int) -> None:
    """The script raised: its state, a note where a restart could only raise it again (an error
    of its own before the first optimizer step), then its traceback as Python prints it, from
    the script's own first frame."""
    error = f"{type(e).__name__}: {e}".strip()
    tb = _script_frames(e.__traceback__)
    last_words.say(error, _format(e, tb))
    asked = step == 0 and not secondary(error) and _restarts_left()
    if asked:  # the launcher stops the job at this note (launch/local.py): no attempt raises it again
        last_words.channel.publish(Kind.NOTE, {"no_restart": f"died during start-up: {error}", "exit_code": 3,
                                            "rank": last_words.rank, "startup": True}, flush=True)
    _excepthook()(type(e), e.with_traceback(tb), tb)  # Python's hook prints the exception's own traceback
    sys.stderr.flush()
    if asked:
        time.sleep(NO_RESTART_WAIT_S)  # ended sooner by the launcher's SIGTERM (LastWords: exit 143)


def _format(e: BaseException, tb: TracebackType | None) -> str:
    return "".join(traceback.format_exception(type(e), e, tb, limit=-8))  # its last frames: where it was raised


def _script_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame: the frames above it (this module's, runpy's)
    are distval's, not the user's."""
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
        tb = tb.tb_next
    return tb or first


def _excepthook() -> Callable[..., Any]:
    """sys.excepthook, without the wrapper torch's init_process_group puts around it to prefix
    each line with `[rankN]:`: the agent prefixes every line of a worker's output already."""
    hook = sys.excepthook
    while getattr(hook, "__name__", "") == "_distributed_excepthook":
        hook = inspect.getclosurevars(hook).nonlocals.get("old_hook", sys.__excepthook__)
    return hook


def _restarts_left() -> bool:
    """Whether torch's agent would restart the workers after this one fails (it tells every worker
    its limit and the attempt it runs)."""
    env = os.environ
    return int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")) > int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _finished(channel: channels.RankChannel, status: str) -> None:
    """The script returned: what is left is the interpreter's exit, which the watchdog must not
    take for a hang when it is slow (a busy host)."""
    channel.publish(Kind.STATUS, {"status": f"{status}: finished, exiting", "done": True}, flush=True)


def _beat_before_destroy(heartbeat: Heartbeat) -> None:
    """A last heartbeat when the script tears its process group down: a rank that ends early
    (it skipped a collective the others still wait in) leaves its exact counts behind."""
    import torch.distributed as dist

    destroy = dist.destroy_process_group

    def destroy_process_group(*args: object, **kwargs: object) -> None:
        heartbeat.last_beat()
        destroy(*args, **kwargs)

    dist.destroy_process_group = destroy_process_group


if __name__ == "__main__":
    main(sys.argv[1:])
