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
import sys
import traceback

from distval import channel as channels
from distval.health.heartbeat import Heartbeat, enable_flight_recorder
from distval.health.steps import StepClock
from distval.rank import state_payload
from distval.trace.capture import from_env


def main(argv: list[str]) -> None:
    """`script.py ARGS...`, or `-m module ARGS...` (as python runs it)."""
    module = argv[0] == "-m"
    script, *args = argv[1:] if module else argv
    rank = int(os.environ.get("RANK", "0"))
    enable_flight_recorder()
    channel = channels.for_worker(rank)
    status = f"running {script if module else os.path.basename(script)}"
    channel.publish("status", {"status": status}, flush=True)
    heartbeat = Heartbeat(channel, lambda: (status, {})).start()
    steps = StepClock(channel).start()  # the script's optimizer steps, for the straggler rule (health/steps.py)
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
        error = f"{type(e).__name__}: {e}".strip()
        channel.publish("state", state_payload(rank, status, [], error, traceback.format_exc(limit=8)), flush=True)
        raise
    finally:
        if tracer:
            tracer.close()
        steps.close()
        heartbeat.close()
        channel.flush()


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
