"""The one channel from every rank to whoever watches the job, over a c10d store.

Worker side, `RankChannel.publish(kind, payload)`: O(1) on the calling thread (the payload is
put in a latest-value slot and a daemon thread writes it to the store), so training never waits
on the network; `flush=True` writes at once (a rank that is about to die). Monitor side,
`ChannelReader.latest(rank, kind)`: the last payload a rank published of that kind, or None.

The kinds and their payloads' fields are declared in distval/protocol.py (`Kind`, one TypedDict
per kind), which checks every publish; the payload is a JSON object, with "time" added.

The store: in local mode the launching process serves a TCPStore and hands its address to the
workers (`DISTVAL_CHANNEL=host:port`); under torchrun, Slurm or mpirun the job's own store at
MASTER_ADDR:MASTER_PORT, joined once the process group is up. Keys are `distval/<kind>/<rank>`;
a (re)started worker deletes its own `state`, so a restart never reads the last attempt's failure.
A store that went away (its host died) makes publishing a no-op and reading None: the channel is
how a failure is explained, never a way to cause one.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
from typing import Any, Iterable

from distval import envvars
from distval.protocol import Kind, check

ENV = envvars.CHANNEL.name
CLOSE_TIMEOUT_S = 5.0  # a rank's end waits at most this for a write in flight


def _key(kind: Kind | str, rank: int) -> str:
    return f"distval/{Kind(kind).value}/{rank}"


def connect(address: str, timeout_s: float = 30.0) -> Any:
    """A client of the TCPStore at host:port."""
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def serve() -> tuple[Any, str]:
    """A TCPStore served by this process on a free loopback port, and its address for workers."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    return store, f"127.0.0.1:{store.port}"


def _encode(payload: dict[str, Any]) -> bytes:
    return json.dumps({**payload, "time": time.time()}, default=str).encode()


def put(store: Any, kind: Kind, index: int, payload: dict[str, Any]) -> None:
    """Write one payload now under `distval/<kind>/<index>`, as a rank's flushed publish would,
    for a writer that is not a rank (a node's digest, the leader's verdict: health/digest.py)."""
    store.set(_key(check(kind, payload), index), _encode(payload))


class RankChannel:
    """What one rank publishes. Without a store (before the job's store is reachable) every
    publish is kept in the slot and written once `attach` gives one."""

    def __init__(self, rank: int, store: Any = None):
        self.rank = rank
        self._store = None
        self._slot: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._closed = False
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="distval-channel", daemon=True)
        self._thread.start()
        if store is not None:
            self.attach(store)

    def attach(self, store: Any) -> None:
        """Start writing to `store`; this rank's failure note of an earlier attempt is removed."""
        with self._cond:
            self._store = store
            self.clear(Kind.STATE)
            self._cond.notify()

    def clear(self, kind: Kind) -> None:
        if self._store is not None:
            try:
                self._store.delete_key(_key(kind, self.rank))
            except Exception:  # noqa: BLE001 (best effort, see the module docstring)
                self.errors += 1

    def publish(self, kind: Kind, payload: dict[str, Any], flush: bool = False) -> None:
        name = check(kind, payload)
        data = _encode(payload)
        if flush:
            self._write({name: data})
            return
        with self._cond:
            self._slot[name] = data
            self._cond.notify()

    def reader(self) -> ChannelReader | None:
        """A reader over the same store (rank 0 diagnosing its peers under an outer launcher)."""
        return ChannelReader(self._store) if self._store is not None else None

    def flush(self) -> None:
        with self._cond:
            pending, self._slot = self._slot, {}
        self._write(pending)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is left and stop the writer thread, joined before the process ends: a daemon
        thread inside the store's C++ (the GIL released) while the interpreter finalizes ends the
        process in std::terminate, a job that finished failing as killed by SIGABRT."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)  # a store that stopped answering: not past this
        self.flush()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._slot or self._store is None):
                    self._cond.wait()
                if self._closed:
                    return
                pending, self._slot = self._slot, {}
            self._write(pending)

    def _write(self, items: dict[str, bytes]) -> None:
        if self._store is None or not items:
            return
        with self._write_lock:
            for kind, data in items.items():
                try:
                    self._store.set(_key(kind, self.rank), data)
                except Exception:  # noqa: BLE001 (the store's host is gone: nothing to tell)
                    self.errors += 1


class ChannelReader:
    """The monitor's side: the latest payload of each rank and kind. `store`: a store, or the
    address of one that may not be up yet (a multi-node launch: the rendezvous endpoint's),
    connected on first use and again, at most each second, until it answers."""

    def __init__(self, store: Any):
        self._store, self._address, self._tried = (None, store, 0.0) if isinstance(store, str) else (store, None, 0.0)

    def _connected(self) -> Any:
        if self._store is None and time.monotonic() - self._tried >= 1.0:
            self._tried = time.monotonic()
            try:
                self._store = connect(self._address, timeout_s=2.0)
            except Exception:  # noqa: BLE001 (not up yet: nothing published yet)
                return None
        return self._store

    def latest(self, rank: int, kind: Kind) -> dict[str, Any] | None:
        key = _key(kind, rank)
        try:
            if self._connected() is None or not self._store.check([key]):
                return None
            return json.loads(self._store.get(key))
        except Exception:  # noqa: BLE001 (an unreachable store reads as "nothing published")
            return None

    def all(self, world_size: int, kind: Kind) -> dict[int, dict[str, Any] | None]:
        """Every rank's latest payload of a kind (`of` ranks 0 .. world_size - 1)."""
        return self.of(range(world_size), kind)

    def of(self, ranks: Iterable[int], kind: Kind) -> dict[int, dict[str, Any] | None]:
        """These ranks' latest payloads of a kind. Once each of them has published it, two requests
        (a `check` of all the keys, then one `multi_get`) instead of two per rank: a watchdog's
        tick at 1,024 ranks goes from 2,048 round trips to 2 (benchmarks/health_plane_scale.py).
        Only for kinds whose keys are never deleted (`state` is: a get of a deleted key would
        wait out the store's timeout)."""
        ranks = list(ranks)
        batched = self._at_once(ranks, kind) if Kind(kind) is not Kind.STATE and len(ranks) > 1 else None
        return batched if batched is not None else {r: self.latest(r, kind) for r in ranks}

    def _at_once(self, ranks: list[int], kind: Kind) -> dict[int, dict[str, Any] | None] | None:
        """The ranks' payloads in one check and one multi_get; None when some rank has not
        published yet, the store is unreachable or a payload is bad (the per-rank reads say)."""
        keys = [_key(kind, r) for r in ranks]
        try:
            store = self._connected()
            if store is None or not store.check(keys):
                return None
            return {r: json.loads(v) for r, v in zip(ranks, store.multi_get(keys))}
        except Exception:  # noqa: BLE001 (see the docstring)
            return None

    def no_restart_note(self, world_size: int) -> dict[str, Any] | None:
        """The first rank's note asking distval's agent not to restart the job, if any."""
        return next((n for n in self.all(world_size, Kind.NOTE).values() if n and n.get("no_restart")), None)


def for_worker(rank: int) -> RankChannel:
    """This worker's channel: connected now in local mode (the launcher's store), otherwise
    waiting for `attach` once the job's store is up."""
    address = os.environ.get(ENV)
    return RankChannel(rank, connect(address) if address else None)


def job_store(timeout_s: float) -> Any:
    """The job's own store under torchrun/Slurm/mpirun (MASTER_ADDR:MASTER_PORT), as a new client."""
    return connect(f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", timeout_s)
