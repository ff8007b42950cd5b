"""A rank's heartbeat: what it is doing and how far its collectives have got, published on the
rank channel (kind `heartbeat`) by a daemon thread, never by the training thread.

The collective facts come from torch's Flight Recorder, which records every collective a process
group issues — distval's own, DDP's and FSDP's from C++, and those of any user script — on Gloo
as on NCCL, once TORCH_FR_BUFFER_SIZE is set before the process group is created (distval's
launchers set it; `enable_flight_recorder`). Every `interval_s` the thread reads each group's
last enqueued and last completed sequence number (about 40 µs) and publishes when something
changed. Only when this rank has waited in the same collective for `stall_s` does it read the
recorder's entries (a few ms) to add the fingerprint of what it waits in: op, sizes, dtypes.

Every `every` collectives completed on a group, the thread also takes their fingerprints from
the recorder (health/fingerprints.py): their digests ride in the heartbeat (`windows`), the
fingerprints themselves go out under their own kind, for the watchdog to compare across ranks.

A rank inside torch.compile (Dynamo tracing, Inductor's code generation: tens of seconds for a
first step) is `busy`, not hung: `Compiles` follows Dynamo's own compile-start/-end callbacks, so
the watchdog knows without reading the rank's stack (py-spy may not be installed).

Payload: {pid, host, status, busy, step, groups: {pg: [enqueued, completed]}, pending: [{pg,
seq, op, sizes, dtypes}], windows: {pg: {window: digest}}, cpu_s, time}.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable

from distval.envvars import FR_DUMPS
from distval.health import fingerprints
from distval.protocol import Kind

FR_ENV = "TORCH_FR_BUFFER_SIZE"
FR_ENTRIES = "256"  # enough to hold what a stalled rank is waiting in; small enough to read in a few ms


def flight_recorder_env() -> dict[str, str]:
    """The variable that makes the next process group record its collectives, unless the user
    set the recorder's size already (their setting wins)."""
    if os.environ.get(FR_ENV) or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE"):
        return {}
    return {FR_ENV: FR_ENTRIES}


def enable_flight_recorder() -> None:
    """Record collectives from the next process group on, in this process (a worker)."""
    os.environ.update(flight_recorder_env())


class Compiles:
    """Whether this process is compiling now, from Dynamo's compile callbacks. Dynamo is imported
    by the first torch.compile (about 1 s): the callbacks are registered once it is there, never
    importing it here; a compile already under way at that moment is read from Dynamo's own count."""

    def __init__(self) -> None:
        self.active = False
        self._handler: Any = None

    def __call__(self) -> bool:
        import sys

        if self._handler is None and (module := sys.modules.get("torch._dynamo.callback")) is not None:
            handler = getattr(module, "callback_handler", None)
            if handler is not None and hasattr(handler, "register_start_callback"):
                handler.register_start_callback(lambda *_: setattr(self, "active", True))
                handler.register_end_callback(lambda *_: setattr(self, "active", False))
                self.active = getattr(handler, "_CompilationCallbackHandler__pending_callbacks_counter", 0) > 0
                self._handler = handler
        return self.active


_NAMES: dict[str, str] = {}  # a process group's id in this process -> its name, from the recorder's entries


def group_progress() -> dict[str, list[int]]:
    """Each process group's [last enqueued, last completed] collective sequence number, by the
    group's name (empty before init_process_group, or without the Flight Recorder). The recorder's
    `pg_status` is keyed by the group's id in this process, which differs between the ranks of a
    mesh's sub-groups; the entries carry both, and are read again only when a new id appears."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return {}
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        status = json.loads(_dump_fr_trace_json(includeCollectives=False, onlyActive=False)).get("pg_status", {})
    except (ImportError, RuntimeError):  # an older torch without the recorder's dump: steps and statuses only
        return {}
    if any(key not in _NAMES for key in status):
        _NAMES.update({str(e["pg_id"]): e["process_group"][0] for e in recorded() if "pg_id" in e})
    return {_NAMES.get(key, key): [int(s["last_enqueued_collective"]), int(s["last_completed_collective"])]
            for key, s in status.items()}


def recorded() -> list[dict[str, Any]]:
    """The Flight Recorder's entries, oldest first (a few ms for 256)."""
    from torch._C._distributed_c10d import _dump_fr_trace_json

    return json.loads(_dump_fr_trace_json(includeCollectives=True, onlyActive=False)).get("entries", [])


def last_collectives(n: int = 8) -> dict[str, dict[str, str]]:
    """The fingerprints of each group's last `n` collectives (health/fingerprints.py `recent`):
    what a failing rank leaves behind, so that the diagnosis can name the rank whose collective
    differed when the backend aborted another. Empty without a process group or the recorder."""
    try:
        return fingerprints.recent(recorded(), n)
    except Exception:  # noqa: BLE001 (a rank on its way out: whatever the recorder still gives)
        return {}


def pending_collectives(groups: dict[str, list[int]], entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recorder's entries of collectives enqueued but not completed, per group."""
    out = []
    for e in entries:
        pg = e["process_group"][0]  # the group's name, as pg_status keys it
        enqueued, completed = groups.get(pg, [0, 0])
        if completed < e["collective_seq_id"] <= enqueued:
            out.append({"pg": pg, "seq": e["collective_seq_id"], "op": e["profiling_name"].split(":")[-1],
                        "sizes": e.get("input_sizes"), "dtypes": e.get("input_dtypes")})
    return out


def write_dump(rank: int) -> None:
    """This rank's Flight Recorder dump (the pickle NCCL's watchdog writes on a timeout) as
    `rank<N>` in the folder the launcher named (DISTVAL_FR_DUMPS), where it named one: what a rank
    stopped after a hang verdict, or failing, leaves for `distval diagnose`. Written whole or not at
    all, by each writer through a file of its own (on SIGTERM a thread writes it while the main
    thread may too: sharing one part file, one truncated what the other had renamed); a few ms."""
    folder = os.environ.get(FR_DUMPS.name)
    if not folder:
        return
    try:
        from torch._C._distributed_c10d import _dump_fr_trace

        data = _dump_fr_trace()
        part = os.path.join(folder, f".rank{rank}.{os.getpid()}.{threading.get_ident()}.part")
        with open(part, "wb") as f:
            f.write(data)
        os.replace(part, os.path.join(folder, f"rank{rank}"))
    except Exception as e:  # noqa: BLE001 (a rank on its way out: no recorder, no folder, no space)
        # said, not raised: the rank is ending anyway; `distval diagnose` will name it as without a dump
        print(f"distval: rank {rank} wrote no Flight Recorder dump: {type(e).__name__}: {e}", file=sys.stderr,
              flush=True)


_RUNNING: Heartbeat | None = None  # this process's heartbeat, once started


def running() -> Heartbeat | None:
    """The heartbeat already beating in this process (`distval launch -m distval ...`: the
    shim's), which a distval worker takes over instead of starting a second one."""
    return _RUNNING


class Heartbeat:
    """`status()` returns (text, fields) of what the rank is doing: RankContext's last status,
    or "running <script>" for a user's script."""

    def __init__(self, channel: Any, status: Callable[[], tuple[str, dict[str, Any]]], interval_s: float = 0.5,
                 stall_s: float = 1.0, every: int = fingerprints.EVERY):
        self.channel, self.status, self.interval_s, self.stall_s = channel, status, interval_s, stall_s
        self.compiling = Compiles()
        self.every = every
        self._prints: dict[str, dict[int, dict[str, list]]] = {}  # the last KEEP windows per group
        self._digests: dict[str, dict[str, str]] = {}
        self._done: dict[str, int] = {}  # per group: the newest window taken (or passed over)
        self._final = False  # the last beat: the trailing part-window is taken too
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="distval-heartbeat", daemon=True)
        self._last: dict[str, Any] | None = None
        self._waiting_since: tuple[Any, float] | None = None
        self._lock = threading.Lock()  # the thread beats, and so may the main thread (close, a hook)
        self.errors = 0

    def start(self) -> Heartbeat:
        global _RUNNING
        self._thread.start()
        _RUNNING = self
        return self

    def close(self) -> None:
        """Stop, after a last heartbeat: a rank that ends leaves its final counts behind. The
        thread is joined: a daemon thread still inside torch's C++ (the recorder's dump) while the
        interpreter finalizes can end the process in std::terminate."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.interval_s + 1)
        try:
            self.last_beat()
        except Exception:  # noqa: BLE001 (the process group may be gone already)
            self.errors += 1

    def last_beat(self) -> dict[str, Any] | None:
        """The final heartbeat, before the process group goes: with the fingerprints of the
        collectives since the last whole window."""
        self._final = True
        return self.beat()

    def beat(self) -> dict[str, Any] | None:
        """One heartbeat: published when it differs from the last one. Returns it."""
        with self._lock:
            return self._beat()

    def _beat(self) -> dict[str, Any]:
        text, fields = self.status()
        groups = group_progress() or (self._last or {}).get("groups", {})  # after destroy_process_group: the last
        waiting = {pg: v for pg, v in groups.items() if v[0] > v[1]}
        now = time.monotonic()
        key = json.dumps(waiting, sort_keys=True)
        if not waiting:
            self._waiting_since = None
        elif self._waiting_since is None or self._waiting_since[0] != key:
            self._waiting_since = (key, now)
        stalled = self._waiting_since is not None and now - self._waiting_since[1] >= self.stall_s
        completed = {pg: v[1] for pg, v in groups.items()}
        due = any((-(-n // self.every) if self._final else n // self.every) > self._done.get(pg, 0)
                  for pg, n in completed.items())
        entries = recorded() if stalled or due else []
        if due:
            self._take_windows(entries, completed)
        busy = bool(fields.get("busy")) or self.compiling()
        beat = {"pid": os.getpid(), "host": socket.gethostname(), "status": text, "busy": busy,
                "step": fields.get("step"), "groups": groups,
                "pending": pending_collectives(groups, entries) if stalled else [], "windows": self._digests,
                "cpu_s": round(time.process_time(), 2)}
        if beat != self._last:
            self.channel.publish(Kind.HEARTBEAT, beat)
            self._last = beat
        return beat

    def _take_windows(self, entries: list[dict[str, Any]], completed: dict[str, int]) -> None:
        new = fingerprints.windows(entries, completed, self.every, self._done, self._final)
        for pg, n in completed.items():
            self._done[pg] = max(self._done.get(pg, 0), n // self.every)
        if not new:
            return
        for pg, found in new.items():
            prints = self._prints.setdefault(pg, {})
            prints.update(found)
            for w in sorted(prints)[:-fingerprints.KEEP]:
                del prints[w]
        self._digests = {pg: {str(w): fingerprints.digest(f["prints"]) for w, f in ws.items()}
                         for pg, ws in self._prints.items()}
        published = {pg: {str(w): f for w, f in ws.items()} for pg, ws in self._prints.items()}
        self.channel.publish(Kind.FINGERPRINTS, {"windows": published})

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception:  # noqa: BLE001 (a heartbeat must never take its rank down)
                self.errors += 1
