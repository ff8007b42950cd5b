"""The torch-free half of the per-collective record: each collective's name and what nccl-tests
and torch say about it (in-place forms, S and bus factors, how a sweep size becomes a count,
whether it has a root, reduces, or needs a peer), importable without torch (the CLI's help text
and flag checks, the plan's ring factors, trace analysis). `comm/ops.py` holds the torch half
(buffers, inputs, expected result, the call), one record per name of `OP_SPECS`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class OpSpec:
    """What nccl-tests and torch say about one collective."""

    name: str
    inplace_forms: tuple[bool, ...]  # torch has all_reduce, broadcast, reduce in place only
    s_chunks: Callable[[int], int]  # S = s_chunks(n) * count * element size
    bus_factor: Callable[[int], float]  # busbw = algbw * bus_factor(n)
    divided: bool = False  # per-rank count = sweep size / n, 16-byte aligned (nccl-tests setupArgs)
    rooted: bool = False  # run from a root rank (comm check: from every root; comm bench: -r)
    reduces: bool = False  # combines values with a reduce op (-o; avg compared to 2 ulp)
    every_redop: bool = False  # comm check runs it once per reduce op (the others: sum only)
    min_ranks: int = 1  # fewer ranks: SKIP with `too_few`
    too_few: str = ""
    point_to_point: bool = False  # a send and its receive are not one call on every rank


_ring = lambda n: (n - 1) / n  # noqa: E731
_SPECS = (
    OpSpec("all_reduce", (True,), lambda n: 1, lambda n: 2 * (n - 1) / n, reduces=True, every_redop=True),
    OpSpec("broadcast", (True,), lambda n: 1, lambda n: 1.0, rooted=True),
    OpSpec("reduce", (True,), lambda n: 1, lambda n: 1.0, rooted=True, reduces=True),
    OpSpec("all_gather", (False, True), lambda n: n, _ring, divided=True),
    OpSpec("all_gather_list", (False,), lambda n: n, _ring, divided=True),
    OpSpec("reduce_scatter", (False, True), lambda n: n, _ring, divided=True, reduces=True),
    OpSpec("all_to_all", (False,), lambda n: n, _ring, divided=True),
    OpSpec("gather", (False,), lambda n: n, _ring, divided=True, rooted=True),
    OpSpec("scatter", (False,), lambda n: n, _ring, divided=True, rooted=True),
    OpSpec("sendrecv", (False,), lambda n: 1, lambda n: 1.0, min_ranks=2,
           too_few="send/recv around the ring needs at least 2 ranks", point_to_point=True),
)
OP_SPECS: dict[str, OpSpec] = {spec.name: spec for spec in _SPECS}  # the registry: every op with a payload

BENCH_OPS = tuple(OP_SPECS)
CHECK_OPS = (*BENCH_OPS, "barrier")  # barrier: no payload; comm check verifies it through the store


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw for this op on this many ranks."""
    return OP_SPECS[op].bus_factor(world_size)
