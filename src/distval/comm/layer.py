"""The instrumented collective layer: every collective distval issues goes through `Comm`.

Each call is recorded per rank as an `OpRecord` (sequence number, op, dtype, shape, bytes, group,
call site, start, end) in a bounded ring buffer, and added to per-op counters (calls, bytes,
seconds). Traffic accounting (how many bytes a strategy moves per step), hang diagnosis (which
sequence number each rank reached, what it is waiting in) and collective-mismatch detection all
read this one source of truth.

`bytes` of a record is the nccl-tests message size S of the op, so algbw = bytes / time:
  all_reduce, broadcast, reduce, send/recv      the tensor's bytes
  all_gather, gather                            the gathered output (world_size x input)
  reduce_scatter, scatter                       the full input (world_size x output)
  all_to_all                                    the per-rank send buffer

Neutral hooks let the layers above act on every op without the layer knowing them:
`on_issue(rec)` as an op is issued, `on_finish(rec, outputs)` as it completes (on the thread that
completes it). The worker installs the test-only faults there (health/faults.py). The heartbeat
and the trace do not need them: they read torch's Flight Recorder and profiler, which see every
collective, distval's and torch's own alike.
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from distval.comm.config import REDUCE_OPS
from distval.comm.inputs import dtype_name

# torch's reduce op for each of comm/config.py's names, in their order
_REDUCE_OPS = dict(zip(REDUCE_OPS, (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
                                    dist.ReduceOp.AVG), strict=True))
_THIS_DIR = os.path.dirname(os.path.abspath(__file__))
_SITES: dict[tuple[Any, int], str] = {}  # (code, line) -> "file:line:function"


# torch 2.13 renamed the tensor forms (the old names warn); torch >= 2.6 has only the old ones.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def reduce_op(name: str | dist.ReduceOp) -> dist.ReduceOp:
    if isinstance(name, dist.ReduceOp):  # torch's own, as FSDP2 passes it (SUM, AVG, a pre-multiplied sum)
        return name
    try:
        return _REDUCE_OPS[name]
    except KeyError:
        raise ValueError(f"unknown reduce op {name!r}; choose from {', '.join(REDUCE_OPS)}") from None


@functools.lru_cache(maxsize=None)
def _in_comm_plumbing(filename: str) -> bool:
    """This file and ops.py (the prepared collectives): their callers are the call site."""
    path = os.path.abspath(filename)
    return os.path.dirname(path) == _THIS_DIR and os.path.basename(path) in ("layer.py", "ops.py")


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(slots=True)
class OpRecord:
    seq: int
    op: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    group: str
    call_site: str
    start_s: float
    end_s: float | None = None
    peer: int | None = None  # root, src or dst where the op has one
    blocked_s: float = 0.0  # time the issuing thread waited on it (all of it for a blocking op)
    skipped: bool = False  # an issue hook vetoed it: never handed to the backend (test/drill faults)

    @property
    def duration_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


@dataclass
class OpTotals:
    calls: int = 0
    bytes: int = 0
    time_s: float = 0.0  # issue to completion
    blocked_s: float = 0.0  # of which the issuing thread was waiting (exposed communication)


class _Handle:
    """An async collective's work handle that stamps the record's end when waited."""

    def __init__(self, comm: Comm, work: Any, rec: OpRecord, outputs: Sequence[torch.Tensor]):
        self._comm, self._work, self._rec, self._outputs = comm, work, rec, outputs
        if work is None:  # vetoed: done already
            comm._finish(rec, outputs)

    def wait(self) -> None:
        if self._work is not None:
            start = time.perf_counter()
            self._work.wait()
            self._work = None
            self._rec.blocked_s = time.perf_counter() - start
            self._comm._finish(self._rec, self._outputs)

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()


@dataclass
class Comm:
    """Instrumented collectives over one process group (None = the default group)."""

    group: Any = None
    name: str = "world"
    capacity: int = 4096
    on_issue: list[Callable[[OpRecord], None]] = field(default_factory=list)
    on_finish: list[Callable[[OpRecord, Sequence[torch.Tensor]], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.records: collections.deque[OpRecord] = collections.deque(maxlen=self.capacity)
        self.totals: dict[str, OpTotals] = collections.defaultdict(OpTotals)
        self._seq = 0

    # -- bookkeeping ---------------------------------------------------------------------------

    def _call_site(self) -> str:
        """file:line:function of the first caller outside the layer (the strategy, the bench)."""
        frame = sys._getframe(2)
        while frame is not None and _in_comm_plumbing(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is None:
            return "?"
        key = (frame.f_code, frame.f_lineno)
        site = _SITES.get(key)
        if site is None:  # formatted once per call site: this runs on every collective
            site = _SITES[key] = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}:{frame.f_code.co_name}"
        return site

    def _start(self, op: str, t: torch.Tensor, size_bytes: int, peer: int | None = None) -> OpRecord:
        rec = OpRecord(
            seq=self._seq,
            op=op,
            dtype=dtype_name(t.dtype),
            shape=tuple(t.shape),
            bytes=size_bytes,
            group=self.name,
            call_site=self._call_site(),
            start_s=time.perf_counter(),
            peer=peer,
        )
        self._seq += 1
        self.records.append(rec)
        if self.on_issue:
            rec.skipped = any([hook(rec) is False for hook in self.on_issue])  # a hook returning False vetoes
        return rec

    def _finish(self, rec: OpRecord, outputs: Sequence[torch.Tensor], blocking: bool = False) -> None:
        rec.end_s = time.perf_counter()
        if blocking:
            rec.blocked_s = rec.end_s - rec.start_s
        tot = self.totals[rec.op]
        tot.calls += 1
        tot.bytes += rec.bytes
        tot.time_s += rec.end_s - rec.start_s
        tot.blocked_s += rec.blocked_s
        for hook in self.on_finish:
            hook(rec, outputs)

    def _run(self, rec: OpRecord, issue: Callable[[], Any], outputs: Sequence[torch.Tensor], async_op: bool):
        """Hand the op to the backend (unless vetoed); a handle for async ops, else done."""
        work = None if rec.skipped else issue()
        if async_op:
            return _Handle(self, work, rec, outputs)
        self._finish(rec, outputs, blocking=True)
        return None

    def pending(self) -> list[OpRecord]:
        """Ops issued but not completed: what this rank is waiting in (hang diagnosis)."""
        return [r for r in self.records if r.end_s is None]

    @property
    def issued(self) -> int:
        """How many collectives this rank has issued on this Comm (its progress)."""
        return self._seq

    def last(self) -> OpRecord | None:
        return self.records[-1] if self.records else None

    def reset_totals(self) -> None:
        self.totals.clear()

    def blocked_so_far(self) -> float:
        """Seconds the issuing thread has waited on this Comm's collectives since the totals were
        last reset (the running totals: the records are a bounded ring)."""
        return sum(t.blocked_s for t in self.totals.values())

    def add_blocked(self, op: str, seconds: float) -> None:
        """Waiting on `op` that happened out of the layer's sight (inside autograd, where DDP's
        reducer waits for its bucket futures), as measured by the caller."""
        self.totals[op].blocked_s += seconds

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False):
        rec = self._start("all_reduce", tensor, nbytes(tensor))
        return self._run(rec, lambda: dist.all_reduce(tensor, op=reduce_op(op), group=self.group, async_op=async_op),
                         [tensor], async_op)

    def all_reduce_future(self, tensor: torch.Tensor, op: str = "sum") -> torch.futures.Future:
        """An async all_reduce as a Future (what DDP communication hooks return); the record is
        completed when the future is, on whichever thread completes it."""
        rec = self._start("all_reduce", tensor, nbytes(tensor))
        if rec.skipped:
            self._finish(rec, [tensor])
            fut: torch.futures.Future = torch.futures.Future()
            fut.set_result(tensor)
            return fut
        fut = dist.all_reduce(tensor, op=reduce_op(op), group=self.group, async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            self._finish(rec, [tensor])
            return tensor

        return fut.then(done)

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False):
        rec = self._start("broadcast", tensor, nbytes(tensor), peer=src)
        return self._run(
            rec, lambda: dist.broadcast(tensor, src=src, group=self.group, async_op=async_op), [tensor], async_op
        )

    def reduce(self, tensor: torch.Tensor, dst: int, op: str = "sum", async_op: bool = False):
        rec = self._start("reduce", tensor, nbytes(tensor), peer=dst)
        return self._run(
            rec,
            lambda: dist.reduce(tensor, dst=dst, op=reduce_op(op), group=self.group, async_op=async_op),
            [tensor] if self.rank == dst else [],
            async_op,
        )

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False):
        """Tensor form: `output` holds world_size inputs back to back (may alias `input`)."""
        rec = self._start("all_gather", input, nbytes(output))
        return self._run(
            rec, lambda: _all_gather_tensor(output, input, group=self.group, async_op=async_op), [output], async_op
        )

    def all_gather_list(self, outputs: list[torch.Tensor], input: torch.Tensor, async_op: bool = False):
        rec = self._start("all_gather", input, sum(nbytes(o) for o in outputs))
        return self._run(
            rec, lambda: dist.all_gather(outputs, input, group=self.group, async_op=async_op), outputs, async_op
        )

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum", async_op: bool = False):
        """Tensor form: rank r receives the reduction of chunk r of every rank's `input`."""
        rec = self._start("reduce_scatter", input, nbytes(input))
        return self._run(
            rec,
            lambda: _reduce_scatter_tensor(output, input, op=reduce_op(op), group=self.group, async_op=async_op),
            [output],
            async_op,
        )

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False):
        """Equal splits: chunk j of this rank's input lands as chunk `rank` of rank j's output."""
        rec = self._start("all_to_all", input, nbytes(input))
        return self._run(
            rec, lambda: dist.all_to_all_single(output, input, group=self.group, async_op=async_op), [output], async_op
        )

    def gather(self, tensor: torch.Tensor, gather_list: list[torch.Tensor] | None, dst: int, async_op: bool = False):
        rec = self._start("gather", tensor, nbytes(tensor) * self.world_size, peer=dst)
        return self._run(
            rec,
            lambda: dist.gather(tensor, gather_list, dst=dst, group=self.group, async_op=async_op),
            gather_list or [],
            async_op,
        )

    def scatter(self, tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int, async_op: bool = False):
        rec = self._start("scatter", tensor, nbytes(tensor) * self.world_size, peer=src)
        return self._run(
            rec,
            lambda: dist.scatter(tensor, scatter_list, src=src, group=self.group, async_op=async_op),
            [tensor],
            async_op,
        )

    def sendrecv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int):
        """Send `send` to `dst` while receiving `recv` from `src` (a ring shift when dst = rank+1,
        src = rank-1). Both are posted before either is waited, so no pairing order can deadlock."""
        rec = self._start("sendrecv", send, nbytes(send), peer=dst)
        g = self.group
        ops = [dist.P2POp(dist.isend, send, self._global(dst), g), dist.P2POp(dist.irecv, recv, self._global(src), g)]
        return self._run(rec, lambda: [work.wait() for work in dist.batch_isend_irecv(ops)], [recv], False)

    def barrier(self) -> None:
        rec = self._start("barrier", torch.empty(0), 0)
        self._run(rec, lambda: dist.barrier(group=self.group), [], False)

    def _global(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)


class _FSDPComm:
    """FSDP2's collectives through a `Comm` (FSDPModule.set_custom_all_gather/_reduce_scatter,
    torch >= 2.8), so that they are counted, timed and watched like distval's own. The interface
    is FSDP2's `Comm` (torch.distributed.fsdp._fully_shard._fsdp_api), matched by its methods:
    `allocate` a plain buffer as FSDP2's default does, and a call that returns torch's `Work` for
    an async op (FSDP2 waits on it only if it is one), the record finished by its future."""

    def __init__(self, comm: Comm):
        self.comm = comm

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def _issue(self, rec: OpRecord, issue: Callable[[bool], Any], output: torch.Tensor, async_op: bool):
        if not async_op or rec.skipped:
            return self.comm._run(rec, lambda: issue(False), [output], False)
        work = issue(True)
        work.get_future().then(lambda _: self.comm._finish(rec, [output]))
        return work


class FSDPAllGather(_FSDPComm):
    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None,
                 async_op: bool = False):
        rec = self.comm._start("all_gather", input_tensor, nbytes(output_tensor))
        return self._issue(rec, lambda a: _all_gather_tensor(output_tensor, input_tensor, group=group, async_op=a),
                           output_tensor, async_op)


class FSDPReduceScatter(_FSDPComm):
    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None,
                 op: Any = dist.ReduceOp.SUM, async_op: bool = False):
        rec = self.comm._start("reduce_scatter", input_tensor, nbytes(input_tensor))
        return self._issue(rec, lambda a: _reduce_scatter_tensor(output_tensor, input_tensor, op=reduce_op(op),
                                                                 group=group, async_op=a), output_tensor, async_op)
