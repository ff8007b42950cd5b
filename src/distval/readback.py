"""Step figures without a host synchronisation in the step (docs/training.md, "Metrics read back").

On a GPU the host only queues a step's work; reading a loss or a gradient norm (`float(t)`) or a
host clock around the step waits for the GPU, and the GPU then idles while the host queues the
next step. So a step's figures are taken without waiting: its instants are CUDA events on the
current stream (`StepMarks`), its loss and gradient norm are copied into pinned host memory in
stream order (`to_host`), and the whole record is read back one step later (`Readback`, lag 1),
when the GPU has finished that step while already working on the next. On the host (CPU ranks)
the same marks are the host clock and nothing is late (lag 0): reading costs nothing there.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")


def lag_for(readback: str, device: torch.device) -> int:
    """How many steps behind the figures are read (MetricsConfig.readback): late -> 1, now -> 0,
    auto -> 1 on a GPU only."""
    return int(readback == "late" or (readback == "auto" and device.type == "cuda"))


class StepMarks:
    """Named instants of one step: CUDA events on a GPU (recorded on the current stream; marking
    never waits), the host clock elsewhere. `seconds(a, b)` is read back later: on a GPU it waits
    for `b`'s event, which by then has long passed when read one step late."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._marks: dict[str, Any] = {}

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks[name] = event
        else:
            self._marks[name] = time.perf_counter()

    def seconds(self, a: str, b: str) -> float:
        if not self.cuda:
            return self._marks[b] - self._marks[a]
        self._marks[b].synchronize()
        return self._marks[a].elapsed_time(self._marks[b]) / 1e3


def to_host(values: torch.Tensor) -> torch.Tensor:
    """`values` in host memory: on a GPU a pinned copy the GPU fills in stream order (valid once a
    later mark of the step has passed); on the host, `values` itself."""
    if values.device.type != "cuda":
        return values
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    return host


class Readback(Generic[T]):
    """Steps queued as they are issued and finished `lag` steps later (`finish(pending)`), in
    order; `flush()` finishes every queued step (before a checkpoint, at the end)."""

    def __init__(self, lag: int, finish: Callable[[T], None]):
        self.lag, self._finish = lag, finish
        self._queue: collections.deque[T] = collections.deque()

    def push(self, pending: T) -> None:
        self._queue.append(pending)
        while len(self._queue) > self.lag:
            self._finish(self._queue.popleft())

    def flush(self) -> None:
        while self._queue:
            self._finish(self._queue.popleft())
