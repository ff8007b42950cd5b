"""Live progress of a training run on the console, from whichever process reports.

Rank 0 appends one short JSON line per finished step to a progress file (`MetricsLogger`'s
`progress` sink); the reporting process — the parent in local mode, rank 0 itself under torchrun
— tails that file in a thread. On a terminal: a transient rich progress bar on stderr (step,
loss, time per step, time left). Into a pipe or file: one line on stderr at most every
`every_s` seconds, so CI logs show that a long run is alive without drowning the report on stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any, Iterator


@contextlib.contextmanager
def watch(total: int, label: str, every_s: float | None = None, poll_s: float = 0.2) -> Iterator[str | None]:
    """Yields the progress file path for rank 0 to write (None on processes that do not report).
    `every_s` (default: $DISTVAL_PROGRESS_EVERY, else 10): seconds between lines off a terminal."""
    if every_s is None:
        every_s = float(os.environ.get("DISTVAL_PROGRESS_EVERY", "10"))
    if os.environ.get("RANK", "0") != "0":  # under torchrun, only rank 0 reports
        yield None
        return
    fd, path = tempfile.mkstemp(prefix="distval-progress-", suffix=".jsonl")
    os.close(fd)
    stop = threading.Event()
    thread = threading.Thread(target=_follow, args=(path, total, label, stop, every_s, poll_s), daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join(timeout=2)
        with contextlib.suppress(OSError):
            os.unlink(path)


def _follow(path: str, total: int, label: str, stop: threading.Event, every_s: float, poll_s: float) -> None:
    tty = sys.stderr.isatty()
    view = _Bar(total, label) if tty else _Lines(total, label, every_s)
    offset = 0
    try:
        while True:
            done = stop.wait(poll_s)
            with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
                f.seek(offset)
                chunk = f.read()
                # only whole lines: the writer may be half-way through one
                complete = chunk[:chunk.rfind("\n") + 1]
                offset += len(complete.encode("utf-8"))
                for line in complete.splitlines():
                    with contextlib.suppress(ValueError):
                        view.update(json.loads(line))
            if done:
                break
    finally:
        view.close()


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
