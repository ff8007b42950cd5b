"""The hang watchdog: a monitor-loop watcher outside the ranks that learns the gaps between
progress in every rank's heartbeat and, past the threshold (health/config.py `HangPolicy`), has
the hang diagnosed (health/hang.py): a certain one ends the job, ranks outside any collective while
the others wait are a pause (health/pauses.py)."""

from __future__ import annotations

import collections
import enum
import socket
import sys
import time
from typing import Any, Callable

from distval.health import fingerprints, ranks_text
from distval.health.config import HangPolicy
from distval.health.hang import Hang, compiling, diagnose_hang, mismatch_found
from distval.health.pauses import LOOK_EVERY_S, Pause, Sites, due, kill_limit, user_frames
from distval.health.procs import main_frames, process_state, stop_pids
from distval.protocol import Kind

COMPILE_RECHECK_S = 30.0  # a rank in torch.compile at a would-be hang: the stacks are looked at again this much later


class Phase(enum.Enum):
    """Where the watchdog stands with the job (`Watchdog.phase`; it changes only in `_enter`)."""
    WATCHING = "watching"  # progress comes, or stopped for less than the threshold
    SUSPECTED = "suspected"  # every rank waits in one collective and none is behind: looked at once more
    PAUSED = "paused"  # ranks outside any collective while the others wait (`pause`): looked at every few s
    HUNG = "hung"  # declared (`hang`): the job is being stopped; nothing more is watched


class Watchdog:
    """A monitor-loop watcher (launch/monitor.py): reads every rank's heartbeat each `every_s`,
    learns the gaps between progress, and when none comes for the threshold diagnoses the hang.
    A certain hang is reported at once through `on_hang(hang)` (which stops the job); ranks
    running outside any collective while the others wait are a pause (health/pauses.py): named
    live through `say`, looked at again every few seconds, ended only when the evidence turns
    certain or the pause outlasts its kill limit. Pauses that ended are kept in `pauses`. On the
    way it compares the ranks' collective fingerprints (health/fingerprints.py): a mismatch is
    reported like a hang, at once.

    Its phase (`Phase`): WATCHING; past the threshold a diagnosis leads to HUNG (certain),
    PAUSED (ranks outside any collective: back to WATCHING when progress comes) or SUSPECTED
    (nothing proves a network hang but the heartbeats: HUNG if still so a look later, else back to
    WATCHING). Two allowances hold across phases: `started` (every rank's process group up and
    stepping: the threshold is the running one) and `_compiling_until` (a rank seen in
    torch.compile: the busy threshold until then)."""

    def __init__(self, world_size: int, policy: HangPolicy, on_hang: Callable[[Hang], None], every_s: float = 0.5,
                 say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)):
        self.world_size, self.policy, self.on_hang, self.every_s, self.say = world_size, policy, on_hang, every_s, say
        self.phase = Phase.WATCHING
        self._entered = time.monotonic()  # when the phase began
        self._looked = 0.0  # when the pause in progress was last diagnosed
        self.started = False  # progress seen with every process group up: start-up is over
        self._compiling_until = 0.0
        self.gaps: collections.deque[float] = collections.deque(maxlen=20)
        self._progress: Any = None
        self._ready = False  # every process group was up at the last progress: the next gap is learned
        self._changed = time.monotonic()
        self._checked = 0.0
        self._compared: dict[int, Any] = {}
        self._reader: Any = None
        self.hang: Hang | None = None  # set once, by the monitor thread (phase HUNG); read after it stopped
        self.pause: Pause | None = None  # the pause in progress (phase PAUSED)
        self.pauses: list[Pause] = []  # the pauses the job survived, in order
        self.sites = Sites()

    def _enter(self, phase: Phase, now: float) -> None:
        self.phase, self._entered = phase, now

    def tick(self, reader: Any) -> None:
        now = time.monotonic()
        if self.phase is Phase.HUNG or now - self._checked < self.every_s:
            return
        self._checked, self._reader = now, reader
        beats = reader.all(self.world_size, Kind.HEARTBEAT)
        if (found := self._mismatch(beats, reader)) is not None:
            self._enter(Phase.HUNG, now)
            self.hang = found
            self.on_hang(found)
            return
        progress = _progress(beats)
        # learning starts once every rank's process group is up: start-up (imports, rendezvous,
        # data loading) is not a gap between steps
        ready = len(progress) == self.world_size and all(groups for groups, _ in progress.values())
        changed = progress != self._progress
        if changed:
            if self.phase is Phase.PAUSED:
                self._pause_ended(now)  # a pause is remembered by its site, not learned as a gap
            elif ready and self._ready:
                self.gaps.append(now - self._changed)
            self.started = self.started or (ready and self._progress is not None)
            self._progress, self._changed, self._ready = progress, now, ready
            self._enter(Phase.WATCHING, now)
        # the loop runs once every rank has stepped: a watchdog that came late (under load) may have
        # seen no change with every group up, and the steps say start-up is over all the same
        self.started = self.started or (ready and all((step or 0) >= 1 for _, step in progress.values()))
        if changed:
            return
        busy = any(b and b.get("busy") for b in beats.values()) or now < self._compiling_until
        stalled = now - self._changed
        if self.phase is not Phase.PAUSED and not (progress and (stalled >= self.policy.threshold(
                list(self.gaps), busy, running=self.started) or self._stopped_here(beats, stalled))):
            return
        if self.phase is Phase.PAUSED and now - self._looked < LOOK_EVERY_S:
            self._pause_live(stalled)
            return
        if self.phase is Phase.SUSPECTED and now - self._entered < LOOK_EVERY_S:
            return
        statuses = reader.all(self.world_size, Kind.STATUS)  # written at once: fresher than a heartbeat
        if all((statuses.get(r) or {}).get("done") for r in range(self.world_size)):
            return  # every rank's script has returned: the workers are exiting, not hung
        for r, b in beats.items():
            if b and statuses.get(r):
                b.update(status=statuses[r].get("status", b["status"]), step=statuses[r].get("step", b["step"]))
        hang = diagnose_hang(beats, stalled)
        if _progress(reader.all(self.world_size, Kind.HEARTBEAT)) != progress:
            return  # the ranks moved on while their stacks were taken: starved of CPU (a stale heartbeat), not hung
        if hang.kind not in ("stopped", "dead") and compiling(hang) and stalled < self.policy.busy_s:
            self._compiling_until = self._looked = now + COMPILE_RECHECK_S  # real work: look again later
            return
        if hang.kind == "network":
            if self.phase is not Phase.SUSPECTED:  # no rank is behind: nothing proves it but the heartbeats
                if self.phase is Phase.PAUSED:
                    self._pause_ended(now)
                self._enter(Phase.SUSPECTED, now)  # look once more
                return
            hang.verdict += f" (and still so {now - self._entered:.0f} s later)"
        if hang.certain:
            self._declare(hang, now)
        else:
            self._pause_seen(hang, now)

    def _stopped_here(self, beats: dict[int, Any], stalled: float) -> bool:
        """Past the floor, whatever the allowance: a stopped rank is certain at any phase of the
        job: on this host a /proc read per rank, on another the state its node's watcher reported
        (health/digest.py). A dead one its launcher sees exit."""
        if stalled < self.policy.floor_s:
            return False
        here = socket.gethostname()
        return any(b.get("state") in ("T", "t") or (b.get("host") == here and process_state(b["pid"]) in ("T", "t"))
                   for b in beats.values() if b)

    def _declare(self, hang: Hang, now: float) -> None:
        if self.pause is not None:  # it began as a pause, which turned certain
            hang.verdict += f" (after {self.pause.length_s:.0f} s outside any collective)"
            self.pause = None
        self._enter(Phase.HUNG, now)
        self.hang = hang
        self.on_hang(hang)

    def _pause_seen(self, hang: Hang, now: float) -> None:
        """Ranks run outside any collective while the others wait: a pause begins, or goes on."""
        self._looked = now
        stalled = now - self._changed
        pause = self.pause
        if pause is None or pause.culprits != hang.culprits:
            rows = [row for row in hang.ranks if not row["culprit"]]
            waits = sorted({row["waiting_in"] for row in rows if row["waiting_in"]})
            verb = "waits" if len(rows) == 1 else "wait"
            waiting = (f"{ranks_text([row['rank'] for row in rows])} {verb} in {', '.join(waits)}" if waits
                       else "the others wait" if rows else "no rank waits in a collective")
            pause = self.pause = Pause(hang.culprits, waiting, self._changed, time.time() - stalled)
            self._enter(Phase.PAUSED, now)
        culprit = hang.culprits[0]
        stack = hang.stacks.get(culprit)
        if stack:
            pause.samples.append(user_frames(main_frames(stack)))
        row = next(row for row in hang.ranks if row["rank"] == culprit)
        pause.where = row["where"] or row["status"] or ""
        if len(pause.samples) <= 1:
            pause.expected_s = self.sites.expected(pause.samples[0] if pause.samples else ())
        self._pause_live(stalled, hang)

    def _pause_live(self, stalled: float, hang: Hang | None = None) -> None:
        """The pause's live line when due; past its kill limit, the hang."""
        pause = self.pause
        assert pause is not None
        pause.length_s = stalled
        limit = kill_limit(self.policy.kill_after_s, pause.expected_s)
        if stalled >= limit:
            if hang is None:  # the last look is too old to end the job on: look now
                self._looked = 0.0
                return
            hang.verdict += (f"; it has run outside any collective for {stalled:.0f} s, past the kill limit of "
                             f"{limit:.0f} s (--hang-kill-after)")
            self.pause = None  # (its length is in the verdict)
            self._declare(hang, time.monotonic())
            return
        if due(pause, stalled):
            pause.announced_s = stalled
            self.say(pause.line(stalled, limit))

    def _pause_ended(self, now: float) -> None:
        pause = self.pause
        assert pause is not None
        pause.length_s = now - pause.started
        self.pause = None
        self._enter(Phase.WATCHING, now)
        self.sites.survived(pause)
        self.pauses.append(pause)
        if pause.announced_s:
            self.say(f"distval: pause over: {ranks_text(pause.culprits)} back in collectives after "
                     f"{pause.length_s:.0f} s (at {pause.place()})")

    def _mismatch(self, beats: dict[int, dict[str, Any] | None], reader: Any) -> Hang | None:
        """Compare the fingerprint digests of every rank's newest windows (when they changed): the
        mismatch found, as a hang."""
        digests = {r: b.get("windows") or {} for r, b in beats.items() if b}
        if len(digests) < self.world_size or digests == self._compared:
            return None
        self._compared = digests
        found = fingerprints.compare(digests, fingerprints.EVERY,
                                     lambda: reader.all(self.world_size, Kind.FINGERPRINTS))
        return mismatch_found(beats, *found) if found is not None else None

    def close(self) -> None:
        """After the job: a last compare, of the fingerprints the ranks left as they ended (a
        mismatch in a job's last collectives stops nothing, but fails the job). The diagnosis,
        if any, stays in `hang`; a pause still in progress joins `pauses`."""
        if self.phase is Phase.PAUSED:
            self._pause_ended(time.monotonic())
        if self.phase is not Phase.HUNG and self._reader is not None:
            self.hang = self._mismatch(self._reader.all(self.world_size, Kind.HEARTBEAT), self._reader)
            if self.hang is not None:
                self._enter(Phase.HUNG, time.monotonic())


def _progress(beats: dict[int, dict[str, Any] | None]) -> dict[int, tuple]:
    """What counts as progress in the heartbeats: each rank's collectives per group and its step."""
    return {r: (b["groups"], b.get("step")) for r, b in beats.items() if b}


def stop_ranks(hang: Hang, grace_s: float = 2.0) -> None:
    """After the diagnosis: stop every rank on this host (`stop_pids`)."""
    stop_pids([row["pid"] for row in hang.ranks if row["pid"] and row["host"] == socket.gethostname()], grace_s)
