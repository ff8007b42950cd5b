"""The monitor loop outside the ranks: every `interval_s` (0.1 s) it runs its rules, each of
which reads the rank channel at its own pace (the hang watchdog and the script's monitor every
0.25-0.5 s, the lost-time rule every second), and reads the ranks' no-restart notes twice a
second. In local mode it runs in distval's launching process (the agent's), where it also
enforces `--deadline` and stops the agent when a worker notes that a restart cannot help; under
torchrun/Slurm it runs in rank 0's process for the live views. The rules are `Watcher`s: the hang
watchdog (health/hang.py), a script's straggler rule (health/steps.py), the lost-time rule
(health/lost.py), the progress view (train/progress.py)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Protocol

from distval.launch.channel import ChannelReader


class Watcher(Protocol):
    """A rule or view fed by the monitor loop."""

    def tick(self, reader: ChannelReader) -> None: ...

    def close(self) -> None: ...


class MonitorLoop:
    def __init__(self, reader: ChannelReader, world_size: int, watchers: list[Watcher] | tuple = (),
                 interval_s: float = 0.1, notes_every_s: float = 0.5):
        self.reader, self.world_size = reader, world_size
        self.interval_s, self.notes_every_s = interval_s, notes_every_s
        self.watchers = list(watchers)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._deadline: tuple[float, Callable[[], None]] | None = None
        self._on_note: Callable[[dict], None] | None = None
        self.deadline_expired = False
        self.note: dict | None = None
        self._broken: set = set()

    def stop_at(self, deadline_s: float, action: Callable[[], None]) -> None:
        """Run `action` once `deadline_s` seconds have passed since `start`."""
        self._deadline = (deadline_s, action)

    def on_no_restart(self, action: Callable[[dict], None]) -> None:
        """Run `action(note)` once a rank publishes a `note` asking not to be restarted."""
        self._on_note = action

    def start(self) -> MonitorLoop:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="distval-monitor", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._tick_watchers()  # the last word of every view (the final step)
        for w in self.watchers:
            w.close()

    def _run(self) -> None:
        notes_read = 0.0
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            if self._deadline and not self.deadline_expired and now - self._started >= self._deadline[0]:
                self.deadline_expired = True
                self._deadline[1]()
            if self._on_note and self.note is None and now - notes_read >= self.notes_every_s:
                notes_read = now  # a round trip to the store per read: twice a second is soon enough
                self.note = self.reader.no_restart_note(self.world_size)
                if self.note is not None:
                    self._on_note(self.note)
            self._tick_watchers()

    def _tick_watchers(self) -> None:
        for w in self.watchers:
            try:
                w.tick(self.reader)
            except Exception as e:  # noqa: BLE001 (one broken rule must not stop the deadline and the others)
                if w not in self._broken:
                    self._broken.add(w)
                    print(f"distval: internal error in {type(w).__name__}: {type(e).__name__}: {e}", file=sys.stderr)
