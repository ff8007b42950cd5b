"""What a per-rank function gets: `RankContext`, below the collective layer and the launcher
(both use it; it imports neither at run time).

A context carries the rank's identity and device, the instrumented `Comm` of the measured group
and of the Gloo control group, the rank channel (`channel.py`: status, step, state, note), the
one registry of the worker's signal handlers, and the test/drill faults armed on this rank.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from distval.protocol import Kind

if TYPE_CHECKING:
    from distval.comm.layer import Comm
    from distval.health.faults import Faults
    from distval.launch.channel import RankChannel


class PeerFailed(RuntimeError):
    """Raised on the ranks that were fine when another rank failed: not the cause."""


SignalHandler = Callable[[int], bool]  # True: handled (the default action does not run now)


class Signals:
    """The one owner of a worker's signal handlers. Parts register a handler per signal
    (the checkpointer: SIGTERM → save at the next step boundary); the newest runs first and may
    claim the signal. Unclaimed, or when a part gives up (`default`), the worker publishes its
    state on the channel and exits 128 + signum, so the launcher can tell where it was."""

    def __init__(self, on_default: Callable[[int], None]):
        self._handlers: dict[int, list[SignalHandler]] = {}
        self._on_default = on_default

    def install(self, *signums: int) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in signums:
                signal.signal(signum, self._dispatch)

    def on(self, signum: int, handler: SignalHandler) -> Callable[[], None]:
        """Register `handler`; returns the function that removes it."""
        self._handlers.setdefault(signum, []).append(handler)
        return lambda: self._handlers[signum].remove(handler)

    def _dispatch(self, signum: int, frame: Any) -> None:
        for handler in reversed(self._handlers.get(signum, [])):
            if handler(signum):
                return
        self.default(signum)

    def default(self, signum: int) -> None:
        self._on_default(signum)
        os._exit(128 + signum)


@dataclass
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    comm: Comm
    control: Any  # a separate Gloo group for bookkeeping (agreement, timing barriers, gathering)
    hostname: str
    channel: RankChannel
    control_comm: Comm | None = None
    faults: Faults | None = None  # test/drill-only (health/faults.py), set by the worker (empty when none is armed)
    # the fingerprints of this rank's last collectives, for its `state` (health/heartbeat.py
    # last_collectives, set by the worker: the recorder is read there, not below comm)
    last_collectives: Callable[[], dict[str, Any]] = field(default=lambda: {})
    last_status: str = "started"
    status_fields: dict[str, Any] = field(default_factory=dict)  # of the last status: step, busy
    signals: Signals = field(init=False)

    def __post_init__(self) -> None:
        self.signals = Signals(lambda signum: self.publish_state())

    def status(self, text: str, **fields: Any) -> None:
        """Say what this rank is about to do: named in the error if it dies or hangs here.
        Written at once (about 20 µs to a store on this host), so even a rank killed in the next
        instant is named with the phase it died in; statuses mark phases (a check case, a bench
        size, a training step), never single collectives.
        `fields`: step=N (a training step), busy=True (a long phase that is not a hang, such as a
        checkpoint save: the hang watchdog allows it more time)."""
        self.last_status, self.status_fields = text, fields
        # pid and host: the launcher's record of its workers' deaths names the rank by them
        self.channel.publish(Kind.STATUS, {"status": text, "pid": os.getpid(), "host": self.hostname, **fields},
                             flush=True)

    def exchange(self, value: int) -> list[int]:
        """Every rank's small integer (a tiny all-gather on the control group): how ranks agree
        on a decision that only some of them could make alone."""
        values = torch.zeros(self.world_size, dtype=torch.int64)
        self.control_comm.all_gather(values, torch.tensor([value], dtype=torch.int64))
        return values.tolist()

    def publish_state(self, error: str | None = None, traceback_text: str = "") -> None:
        """What this rank was doing when it failed or was stopped, written now (read by
        health/diagnose.py), with the fingerprints of its last collectives."""
        comms = [c for c in (self.comm, self.control_comm) if c is not None]
        state = {**state_payload(self.rank, self.last_status, comms, error, traceback_text),
                 "recent": self.last_collectives()}
        self.channel.publish(Kind.STATE, state, flush=True)


def state_payload(
    rank: int, status: str, comms: list[Comm], error: str | None, traceback_text: str = ""
) -> dict[str, Any]:
    """A rank's `state` on the channel. Progress counts the collectives issued on both the
    measured and the control group: ranks run the same program, so the one that issued fewer is
    the one the others are waiting for."""
    last = comms[0].last() if comms else None
    return {"rank": rank, "error": error, "status": status, "issued": sum(c.issued for c in comms),
            "pending": [r.to_dict() for c in comms for r in c.pending()], "last_op": last.to_dict() if last else None,
            "traceback": traceback_text}

