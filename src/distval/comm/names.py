"""The collectives' names and nccl-tests' size and bus-bandwidth rules, importable without torch
(the CLI's help text and flag checks, trace analysis)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

CHECK_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_list", "reduce_scatter",
             "all_to_all", "gather", "scatter", "sendrecv", "barrier")
BENCH_OPS = CHECK_OPS[:-1]  # every op with a payload


@dataclass(frozen=True)
class OpSpec:
    """What nccl-tests and torch say about one collective."""

    inplace_forms: tuple[bool, ...]  # torch has all_reduce, broadcast, reduce in place only
    s_chunks: Callable[[int], int]  # S = s_chunks(n) * count * element size
    bus_factor: Callable[[int], float]  # busbw = algbw * bus_factor(n)
    divided: bool = False  # per-rank count = sweep size / n, 16-byte aligned (nccl-tests setupArgs)
    rooted: bool = False
    reduces: bool = False


_ring = lambda n: (n - 1) / n  # noqa: E731
OPS: dict[str, OpSpec] = {
    "all_reduce": OpSpec((True,), lambda n: 1, lambda n: 2 * (n - 1) / n, reduces=True),
    "broadcast": OpSpec((True,), lambda n: 1, lambda n: 1.0, rooted=True),
    "reduce": OpSpec((True,), lambda n: 1, lambda n: 1.0, rooted=True, reduces=True),
    "all_gather": OpSpec((False, True), lambda n: n, _ring, divided=True),
    "all_gather_list": OpSpec((False,), lambda n: n, _ring, divided=True),
    "reduce_scatter": OpSpec((False, True), lambda n: n, _ring, divided=True, reduces=True),
    "all_to_all": OpSpec((False,), lambda n: n, _ring, divided=True),
    "gather": OpSpec((False,), lambda n: n, _ring, divided=True, rooted=True),
    "scatter": OpSpec((False,), lambda n: n, _ring, divided=True, rooted=True),
    "sendrecv": OpSpec((False,), lambda n: 1, lambda n: 1.0),
}


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw for this op on this many ranks."""
    return OPS[op].bus_factor(world_size)
