"""What each worker of `distval launch` runs: the user's script, unchanged, with distval around it.

    python -m distval.launch.shim script.py ARGS...
    python -m distval.launch.shim -m module ARGS...

Before the script starts: the Flight Recorder is switched on (so every collective the script's
process groups issue — its own dist.* calls, DDP's and FSDP's from C++ — is recorded) and the
heartbeat thread starts publishing this rank's progress on the rank channel of distval's
launcher, which runs the hang watchdog, and a step clock follows the script's optimizer steps
for the straggler rule (health/steps.py). The script runs as `__main__` with its own argv; an
exception it raises is published as this rank's `state` (for the failure diagnosis), then the
worker exits as Python would. Under `distval launch --trace SKIP:N` a profiler records N of the
script's optimizer steps after SKIP (trace/capture.py).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time
import traceback

from distval.health.heartbeat import Heartbeat, enable_flight_recorder, last_collectives
from distval.health.probe import Probe
from distval.health.probe import from_env as probe_settings
from distval.health.steps import StepClock
from distval.launch import channel as channels
from distval.rank import state_payload
from distval.trace.capture import from_env

TERM_GRACE_S = 1.0  # a SIGTERM the main thread cannot take (blocked in C) is answered from a thread after this


class LastWords:
    """This rank's `state`, published once, as it fails: the error, the traceback, and the
    fingerprints of its last collectives (the Flight Recorder's, a few ms).

    SIGTERM (torch's agent stopping the job after another rank failed) is taken by a handler
    that publishes and exits 128 + 15, as the default action would. A Python handler runs on
    the main thread only, once it is back in Python; a rank blocked in C (a collective that
    never returns, a CUDA synchronisation) would hold on until the agent's SIGKILL 30 s later,
    so a thread woken by the signal (the interpreter's wakeup fd) answers for it after
    TERM_GRACE_S. A script that installs its own SIGTERM handler keeps it: then neither acts."""

    def __init__(self, channel: channels.RankChannel, rank: int, status: str):
        self.channel, self.rank, self.status = channel, rank, status
        self._lock = threading.Lock()
        self._said = False

    def say(self, error: str | None, traceback_text: str = "") -> None:
        """`error`: None for a rank stopped from outside (SIGTERM), as a distval worker says it."""
        with self._lock:
            if self._said:
                return
            self._said = True
        state = {**state_payload(self.rank, self.status, [], error, traceback_text), "recent": last_collectives()}
        self.channel.publish("state", state, flush=True)

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
        finally:
            os._exit(128 + signal.SIGTERM)

    def _watch(self, read: int) -> None:
        while True:
            got = os.read(read, 64)
            if signal.SIGTERM in got and signal.getsignal(signal.SIGTERM) == self._on_term:
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
    channel.publish("status", {"status": status}, flush=True)
    last_words = LastWords(channel, rank, status).install()
    # the script's optimizer steps: stragglers, memory (health/steps.py); NaN/Inf, replicas (health/probe.py)
    steps = StepClock(channel, probe=Probe(*probe_settings())).start()
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
        raise
    except BaseException as e:
        last_words.say(f"{type(e).__name__}: {e}".strip(), traceback.format_exc(limit=8))
        raise
    finally:
        if tracer:
            tracer.close()
        steps.close()
        heartbeat.close()
        channel.close()


def _finished(channel: channels.RankChannel, status: str) -> None:
    """The script returned: what is left is the interpreter's exit, which the watchdog must not
    take for a hang when it is slow (a busy host)."""
    channel.publish("status", {"status": f"{status}: finished, exiting", "done": True}, flush=True)


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
