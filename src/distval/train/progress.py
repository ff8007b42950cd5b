"""Live progress of a training run on the console, from whichever process reports.

Rank 0 publishes the metrics of every finished step on the rank channel (kind `step`), and each
new finding of the health monitor (kind `health`: printed as one line at once); the
monitor loop of the reporting process — distval's launcher in local mode, rank 0 itself under
torchrun — feeds them to a `ProgressView`. On a terminal: a transient rich progress bar on stderr
(step, loss, time per step, time left). Into a pipe or file: one line on stderr at most every
`every_s` seconds, so CI logs show that a long run is alive without drowning the report on stdout.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from distval import envvars
from distval.protocol import Kind


class ProgressView:
    """A monitor-loop watcher (launch/monitor.py). `every_s` (default: $DISTVAL_PROGRESS_EVERY,
    else 10): seconds between lines off a terminal."""

    def __init__(self, total: int, label: str, every_s: float | None = None):
        self.total, self.label = total, label
        self.every_s = float(os.environ.get(envvars.PROGRESS_EVERY.name, "10")) if every_s is None else every_s
        self._view: _Bar | _Lines | None = None
        self._seen: float | None = None
        self._health_seen: float | None = None

    def tick(self, reader: Any) -> None:
        found = reader.latest(0, Kind.HEALTH)  # a finding of the health monitor: one line, at once
        if found is not None and found.get("time") != self._health_seen:
            self._health_seen = found.get("time")
            print(f"distval: health {found.get('status')}: {found.get('summary')}", file=sys.stderr, flush=True)
        row = reader.latest(0, Kind.STEP)
        if row is None or row.get("time") == self._seen:
            return
        self._seen = row.get("time")
        if self._view is None:
            self._view = (
                _Bar(self.total, self.label) if sys.stderr.isatty() else _Lines(self.total, self.label, self.every_s)
            )
        self._view.update(row)

    def close(self) -> None:
        if self._view is not None:
            self._view.close()


def _describe(row: dict[str, Any], total: int, started: float, first_step: int | None) -> str:
    step = int(row.get("step", 0)) + 1
    per_step = row.get("step_time_s")
    left = ""
    if first_step is not None and step > first_step:
        eta = (time.monotonic() - started) / (step - first_step) * (total - step)
        left = f" · {eta:.0f} s left"
    loss = row.get("loss")
    return (f"step {step}/{total}" + (f" · loss {loss:.4f}" if isinstance(loss, (int, float)) else "")
            + (f" · {per_step:.3f} s/step" if isinstance(per_step, (int, float)) else "") + left)


class _Lines:
    def __init__(self, total: int, label: str, every_s: float):
        self.total, self.label, self.every_s = total, label, every_s
        self.started, self.first, self.last_print = time.monotonic(), None, time.monotonic()

    def update(self, row: dict[str, Any]) -> None:
        if self.first is None:
            self.first, self.started = int(row.get("step", 0)) + 1, time.monotonic()
        if time.monotonic() - self.last_print >= self.every_s:
            print(f"{self.label}: {_describe(row, self.total, self.started, self.first)}", file=sys.stderr, flush=True)
            self.last_print = time.monotonic()

    def close(self) -> None:
        """Nothing to take down: every line is printed already."""


class _Bar:
    def __init__(self, total: int, label: str):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.total, self.started, self.first = total, time.monotonic(), None
        self.progress = Progress(TextColumn(label), BarColumn(), TextColumn("{task.description}"),
                                 console=Console(stderr=True), transient=True)
        self.task = self.progress.add_task("starting", total=total)
        self.progress.start()

    def update(self, row: dict[str, Any]) -> None:
        if self.first is None:
            self.first, self.started = int(row.get("step", 0)) + 1, time.monotonic()
        self.progress.update(self.task, completed=int(row.get("step", 0)) + 1,
                             description=_describe(row, self.total, self.started, self.first))

    def close(self) -> None:
        self.progress.stop()
