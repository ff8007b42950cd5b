"""Hangs: the watchdog outside the ranks that declares one, and the diagnosis that names the
rank(s) that caused it, from facts every rank published (health/heartbeat.py), the state of
each process and its Python stack (py-spy).

The rule: a hang is declared when no rank has made progress (a collective enqueued or completed
on any process group, a training step) for max(floor, factor × the 90th percentile of the gaps
between progress seen lately: one scheduling hiccup does not double the allowance, a pause that
recurs raises it). Before the first progress the allowance is `startup_s` (rendezvous, data loading,
the first step's compile); while a rank declares a long phase (a checkpoint save: `busy`) it is
`busy_s`. A slow step that makes progress now and then only raises the learned gap; it is never
a hang. A rank found inside torch.compile (its stack in Dynamo or Inductor) when the threshold
passes is compiling, not hung: the stacks are looked at again 30 s later, up to `busy_s`.

The decision, in this order (never "the first rank that disagrees"):
  stopped      a rank's process is stopped (SIGSTOP, a debugger): it cannot answer
  dead         a rank's process is gone
  outside      ranks wait in collective #n of a group while others have not issued it: those
               others are the cause (stuck in Python, in I/O, or they skipped a collective —
               then they completed fewer on that group)
  mismatch     every rank waits, but not in the same collective: the ranks outside the
               majority's (seq, op, sizes, dtypes) are named with both sides; with no majority
               every side is named
  network      every rank waits in the same collective: no rank is behind; the transport is
               stuck (no rank is blamed). Nothing but the heartbeats proves it (a heartbeat
               thread starved of CPU lags its rank), so it ends the job only when a second
               look, LOOK_EVERY_S later, finds the same and no progress in between
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from distval.health import fingerprints, ranks_text
from distval.health.heartbeat import KIND as HEARTBEAT
from distval.health.pauses import LOOK_EVERY_S, Pause, Sites, due, kill_limit, user_frames
from distval.knobs import knob
from distval.stats import percentile
from distval.units import parse_duration

STACK_TIMEOUT_S = 10.0
COMPILE_RECHECK_S = 30.0  # a rank in torch.compile at a would-be hang: the stacks are looked at again this much later
_COMPILING = ("torch/_dynamo/", "torch/_inductor/")


HANG_AFTER_HELP = (
    "Look for a hang when no rank progresses for this long (at least; learned from the gaps between progress, "
    "x10), then name the culprit with every rank's stack. A stopped or dead rank, a skipped or mismatched "
    "collective, every rank waiting: ended at once. Ranks running outside any collective while the others wait (an "
    "evaluation or a save on rank 0 looks the same): named live, ended only past --hang-kill-after. off: no "
    "watchdog (local workers).")
HANG_KILL_HELP = (
    "End a job whose ranks have run outside any collective while the others waited for this long (default 10m, "
    "NCCL's own collective timeout: a healthy job's evaluation or save on one rank must not be killed; raised where "
    "this job already survived a longer pause at the same line).")


def _duration_or_off(text: str, flag: str) -> float | None:
    return None if text == "off" else parse_duration(text, flag)


@dataclass(frozen=True)
class HangPolicy:
    floor_s: float = knob(8.0, "--hang-after", parse=_duration_or_off, text="8s",
                          help=HANG_AFTER_HELP)
    factor: float = 10.0
    startup_s: float = 120.0
    busy_s: float = 600.0
    # a pause (ranks outside any collective while the others wait: health/pauses.py) is ended
    # past this (--hang-kill-after): NCCL's default collective timeout, after which the backend
    # would end the job anyway
    kill_after_s: float = knob(600.0, "--hang-kill-after", parse=parse_duration, text="10m", help=HANG_KILL_HELP)

    def __post_init__(self) -> None:
        if not self.floor_s > 0:
            raise ValueError(f"--hang-after must be positive (got {self.floor_s:g} s), e.g. 30s")
        if not self.kill_after_s >= self.floor_s:
            raise ValueError(f"--hang-kill-after must be at least --hang-after ({self.floor_s:g} s; got "
                             f"{self.kill_after_s:g} s), e.g. 10m")

    @classmethod
    def from_knobs(cls, **values: float | None) -> HangPolicy | None:
        """The policy the flags ask for; None (no watchdog) for `--hang-after off`."""
        if "floor_s" in values and values["floor_s"] is None:
            return None
        return cls(**values)

    def threshold(self, gaps: list[float], busy: bool, slop_s: float = 1.0, running: bool = False) -> float:
        """`gaps`: seconds between progress seen lately, each up to `slop_s` longer than the real
        gap (progress is sampled: the heartbeat's and the watchdog's intervals). `running`: progress
        was seen with every rank's process group up, though no gap could be measured yet (the
        watchdog came late): the floor, not the start-up allowance."""
        if not gaps:
            limit = self.floor_s + slop_s if running else self.startup_s
        else:
            limit = max(self.floor_s, self.factor * max(0.0, percentile(gaps, 90) - slop_s)) + slop_s
        return max(limit, self.busy_s) if busy else limit


HINTS = {
    "stopped": "a stopped process blocks every rank: resume it (kill -CONT <pid>) or find what stopped it (a "
               "debugger, a frozen container, a job scheduler's suspend)",
    "dead": "see how the rank died: its exit code and the kernel log (dmesg: the OOM killer)",
    "outside": "the culprit's stack (details.stacks) shows where it is instead: a loop, I/O, a lock, or a code path "
               "that skips a collective on that rank only",
    "mismatch": "the ranks call different collectives at the same point: a rank-dependent branch or tensor shape; "
                "compare the call sites in details.stacks",
    "network": "run `distval doctor` on every host; check GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME and the links",
}


@dataclass
class Hang:
    culprits: list[int]
    kind: str  # stopped | dead | outside | mismatch | network
    verdict: str  # one line
    stalled_s: float = 0.0  # no progress for this long when the hang was declared
    diagnosed_s: float = 0.0  # from the last progress to the verdict (stacks included)
    ranks: list[dict[str, Any]] = field(default_factory=list)  # the per-rank table
    stacks: dict[int, str] = field(default_factory=dict)
    stacks_note: str = ""
    hung: bool = True  # False: a mismatch the fingerprint check found while every rank still ran

    @property
    def certain(self) -> bool:
        """Whether the evidence alone proves a hang: a stopped or dead rank, a mismatch, a skipped
        collective, every rank waiting. Not so when the culprits run outside any collective while
        the others wait (an evaluation or a save on one rank looks the same): a pause."""
        if self.kind != "outside":
            return True
        rows = {row["rank"]: row for row in self.ranks}
        return not self.culprits or any(rows.get(r, {}).get("blocked_in") or not rows.get(r, {}).get("pid")
                                        for r in self.culprits)

    def details(self) -> dict[str, Any]:
        return {"hang": self.kind, "hung": self.hung, "culprits": self.culprits, "stalled_s": round(self.stalled_s, 1),
                "diagnosed_s": round(self.diagnosed_s, 1),
                "ranks": self.ranks, "stacks": {str(r): s for r, s in self.stacks.items()},
                "stacks_note": self.stacks_note}


# -- facts about the processes, from outside ------------------------------------------------------

def process_state(pid: int) -> str:
    """R running, S sleeping, D disk wait, T stopped, t traced, Z zombie; "gone" if no process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def py_spy() -> tuple[str | None, str]:
    """The py-spy binary, or None and why not."""
    path = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(path):
        return None, "py-spy is not installed (pip install py-spy)"
    return path, ""


def stack_of(pid: int, binary: str) -> tuple[str | None, str]:
    """The Python stack of every thread of `pid` (py-spy dump, without pausing the process)."""
    try:
        res = subprocess.run([binary, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True,
                             timeout=STACK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"py-spy took over {STACK_TIMEOUT_S:g} s"
    if res.returncode != 0:
        why = (res.stderr or res.stdout).strip().splitlines()
        reason = why[-1] if why else f"exit {res.returncode}"
        if "ermission" in reason or "ptrace" in reason.lower():
            reason += " (py-spy needs the ptrace capability: run as root or with CAP_SYS_PTRACE)"
        return None, reason
    return res.stdout, ""


def main_frames(stack: str) -> list[str]:
    """The frames of the main thread, innermost first ("fn (file:line)")."""
    frames, in_main = [], False
    for line in stack.splitlines():
        if line.startswith("Thread "):
            in_main = '"MainThread"' in line
        elif in_main and line.startswith("    ") and "(" in line:
            frames.append(line.strip())
    return frames


def where(stack: str | None) -> str:
    """The innermost frame of the main thread outside torch and the standard library: the line
    of the user's (or distval's) code the rank is in."""
    if not stack:
        return ""
    frames = main_frames(stack)
    own = user_frames(frames)
    return own[-1] if own else (frames[0] if frames else "")


# -- the decision ----------------------------------------------------------------------------------

def _waiting(beat: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {pg: (v[0], v[1]) for pg, v in beat.get("groups", {}).items() if v[0] > v[1]}


def _still_waiting(live: dict[int, dict[str, Any]], r: int) -> dict[str, tuple[int, int]]:
    """Rank r's waits, less those every other rank has issued too: a collective every rank issued
    is not what r is blocked in (Gloo's recorder marks a completion late, when the work is next
    looked at, so a rank that moved on and now spins outside any collective can still show its
    last one pending)."""
    return {g: v for g, v in _waiting(live[r]).items()
            if not all(b["groups"].get(g, [0, 0])[0] >= v[0] for o, b in live.items() if o != r)}


def _fingerprint(beat: dict[str, Any], pg: str) -> tuple | None:
    mine = [p for p in beat.get("pending", []) if p["pg"] == pg]
    if not mine:
        return None
    p = min(mine, key=lambda x: x["seq"])
    return (p["seq"], p["op"], str(p["sizes"]), str(p["dtypes"]))


def _describe(fp: tuple | None, pg: str) -> str:
    if fp is None:
        return f"a collective of group {pg}"
    seq, op, sizes, dtypes = fp
    return f"{op} #{seq} of group {pg} (sizes {sizes}, {dtypes})"



def decide(beats: dict[int, dict[str, Any] | None], states: dict[int, str]) -> tuple[list[int], str, str]:
    """(culprits, kind, verdict) from every rank's last heartbeat (its "status": the latest the
    rank said, which the watchdog takes from the `status` kind) and its process state."""
    ranks = sorted(beats)
    stopped = [r for r in ranks if states.get(r) in ("T", "t")]
    if stopped:
        return stopped, "stopped", (f"{ranks_text(stopped)} stopped (SIGSTOP or a debugger) at "
                                    f"{_statuses(beats, stopped)}; the others wait for it")
    dead = [r for r in ranks if states.get(r) in ("gone", "Z")]
    if dead:
        return dead, "dead", f"{ranks_text(dead)} gone (the process exited or was killed) at {_statuses(beats, dead)}"
    live = {r: b for r, b in beats.items() if b}
    silent = [r for r in ranks if not beats.get(r)]
    if silent:
        return silent, "outside", f"{ranks_text(silent)} never reported (stuck before its process group came up)"
    # a group on which some ranks issued fewer collectives and went on to wait in another group,
    # while the ranks ahead wait on it: those behind skipped one (whatever else they wait in)
    for pg in _groups_waited(live):
        issued = {r: live[r]["groups"].get(pg, [0, 0])[0] for r in ranks}
        top = max(issued.values())
        ahead = [r for r in ranks if issued[r] == top and pg in _waiting(live[r])]
        behind = [r for r in ranks if issued[r] < top and any(g != pg for g in _still_waiting(live, r))]
        if ahead and behind and len(ahead) + len(behind) == len(ranks):
            what = _describe(_fingerprint(live[ahead[0]], pg), pg)
            parts = []
            for r in behind:
                g = next(g for g in _still_waiting(live, r) if g != pg)
                parts.append(_skipped(r, live[r], g, what, pg, issued[r], ahead, top))
            return behind, "outside", "; ".join(parts)
    # a group some ranks wait in and others have not reached: the others are the cause (the
    # summary adds where the waiting ranks are)
    for pg in _groups_waited(live):
        waiting = [r for r in ranks if pg in _waiting(live[r])]
        target = max((_waiting(live[r])[pg][0] for r in waiting), default=0)
        # a rank that issued the collective waited in has reached it (its peers' recorder may mark
        # the completion late: Gloo's work is marked done when it is next looked at)
        absent = [r for r in ranks if r not in waiting and live[r]["groups"].get(pg, [0, 0])[0] < target]
        if waiting and absent:
            what = _describe(_fingerprint(live[waiting[0]], pg), pg)
            parts = []
            for r in absent:
                issued = live[r]["groups"].get(pg, [0, 0])[0]
                elsewhere = {g: v for g, v in _still_waiting(live, r).items() if g != pg}
                if elsewhere:  # it went on: the collective it did not issue was skipped on this rank
                    parts.append(_skipped(r, live[r], next(iter(elsewhere)), what, pg, issued, waiting, target))
                else:
                    parts.append(f"rank {r} has not issued {what} and waits in no collective: it is at "
                                 f"{_statuses(beats, [r])}")
            return absent, "outside", "; ".join(parts)
    if not _groups_waited(live):  # nobody waits: every rank works outside the collectives (a compile,
        # a long step, a single-rank job's loop) or is stuck there: a pause, never the transport
        return ranks, "outside", (f"{ranks_text(ranks)} {'runs' if len(ranks) == 1 else 'run'} outside any collective, "
                                  f"none waiting: at {_statuses(beats, ranks)}")
    # every rank waits: do they wait in the same collective?
    for pg in _groups_waited(live):
        prints = {r: _fingerprint(live[r], pg) for r in ranks}
        counts = collections.Counter(fp for fp in prints.values())
        if len(counts) > 1:
            (top, n), *rest = counts.most_common()
            if rest and rest[0][1] == n:  # no majority: name every side
                sides = "; ".join(f"{ranks_text([r for r in ranks if prints[r] == fp])} in {_describe(fp, pg)}"
                                  for fp in counts)
                return ranks, "mismatch", f"the ranks wait in different collectives and no majority decides: {sides}"
            odd = [r for r in ranks if prints[r] != top]
            sides = "; ".join(f"{ranks_text([r])} in {_describe(prints[r], pg)}" for r in odd)
            return odd, "mismatch", (f"{sides}, while {ranks_text([r for r in ranks if r not in odd])} wait in "
                                     f"{_describe(top, pg)}")
    return [], "network", ("every rank waits in the same collective and none is behind: the transport (network, "
                           "NCCL/Gloo) is stuck; see `distval doctor`")


def _skipped(r: int, beat: dict[str, Any], g: str, what: str, pg: str, issued: int, others: list[int],
             top: int) -> str:
    """Rank r waits in group g's collective, having issued fewer on group pg than `others`."""
    return (f"rank {r} went on to {_describe(_fingerprint(beat, g), g)} without issuing {what} (it issued {issued} "
            f"collectives on group {pg}, {ranks_text(others)} {top}): it skipped a collective")


def _groups_waited(live: dict[int, dict[str, Any]]) -> list[str]:
    """The groups some rank waits in, the default group first."""
    return sorted({pg for b in live.values() for pg in _waiting(b)}, key=lambda g: (g != "0", g))


def _statuses(beats: dict[int, dict[str, Any] | None], ranks: list[int]) -> str:
    texts = [(beats.get(r) or {}).get("status") or "an unknown point" for r in ranks]
    return ", ".join(dict.fromkeys(texts))


def diagnose_hang(beats: dict[int, dict[str, Any] | None], stalled_s: float, with_stacks: bool = True) -> Hang:
    """Everything known about a hang: the decision, the per-rank table, the stacks (py-spy) of
    the ranks whose process lives on this host."""
    started = time.monotonic()
    here = socket.gethostname()
    pids = {r: b["pid"] for r, b in beats.items() if b and b.get("host") == here}
    cpu0 = {r: cpu_seconds(pid) for r, pid in pids.items()}
    time.sleep(0.3)
    # a rank on another host: the state its node's watcher reported (health/digest.py), if any
    states = {r: b["state"] for r, b in beats.items() if b and b.get("state")}
    states.update({r: process_state(pid) for r, pid in pids.items()})
    spinning = {r: (c1 - c0) > 0.1 for r, pid in pids.items()
                if (c0 := cpu0[r]) is not None and (c1 := cpu_seconds(pid)) is not None}
    culprits, kind, verdict = decide(beats, states)
    stacks: dict[int, str] = {}
    note = ""
    binary, note = py_spy() if with_stacks else (None, "stacks not asked for")
    if binary:
        alive = {r: pid for r, pid in pids.items() if states.get(r) not in ("gone", "Z")}
        with ThreadPoolExecutor(max_workers=max(1, len(alive))) as pool:
            results = dict(zip(alive, pool.map(lambda pid: stack_of(pid, binary), alive.values())))
        stacks = {r: text for r, (text, _) in results.items() if text}
        reasons = {why for text, why in results.values() if not text}
        note = "; ".join(sorted(reasons))
    if pids and len(pids) < len(beats):
        note = (note + "; " if note else "") + "stacks only of the ranks on this host"
    rows = _table(beats, culprits, states, spinning, stacks)
    return Hang(culprits, kind, verdict, stalled_s, stalled_s + time.monotonic() - started, rows, stacks, note)


def mismatch_found(beats: dict[int, dict[str, Any] | None], culprits: list[int], verdict: str,
                   issued_at: float | None) -> Hang:
    """The fingerprint check's finding (health/fingerprints.py), while every rank still runs;
    `diagnosed_s` counts from the first differing collective's issue (`issued_at`, epoch s)."""
    return Hang(culprits, "mismatch", verdict, diagnosed_s=time.time() - issued_at if issued_at else 0.0,
                ranks=_table(beats, culprits), hung=False, stacks_note="not taken: no rank had hung")


def _table(beats: dict[int, dict[str, Any] | None], culprits: list[int], states: dict[int, str] | None = None,
           spinning: dict[int, bool] | None = None, stacks: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """The per-rank table of a diagnosis."""
    states, spinning, stacks = states or {}, spinning or {}, stacks or {}
    live = {r: b for r, b in beats.items() if b}
    rows = []

    def first(waits: dict[str, tuple[int, int]]) -> str | None:
        return next(iter(sorted(waits, key=lambda g: (g != "0", g))), None)

    for r in sorted(beats):
        b = beats[r] or {}
        pg = first(_waiting(b)) if b else None
        blocked = first(_still_waiting(live, r)) if b else None  # not a collective every other rank issued
        rows.append({"rank": r, "pid": b.get("pid"), "host": b.get("host"), "state": states.get(r, "?"),
                     "cpu_busy": spinning.get(r), "status": b.get("status"), "step": b.get("step"),
                     "waiting_in": _describe(_fingerprint(b, pg), pg) if pg else None,
                     "blocked_in": _describe(_fingerprint(b, blocked), blocked) if blocked else None,
                     "completed": {g: v[1] for g, v in b.get("groups", {}).items()},
                     "where": where(stacks.get(r)), "culprit": r in culprits})
    return rows


def compiling(hang: Hang) -> list[int]:
    """The ranks whose main thread is inside torch.compile (Dynamo tracing, Inductor codegen):
    a first step's compile is real work, not a hang."""
    return [r for r, stack in hang.stacks.items() if any(c in f for f in main_frames(stack) for c in _COMPILING)]


def summary(hang: Hang) -> str:
    """The verdict, the culprit's line of code, the others in one clause each."""
    if not hang.hung:
        return f"collective mismatch, found by the fingerprint check before any hang: {hang.verdict}"
    text = f"hang after {hang.stalled_s:.0f} s without progress: {hang.verdict}"
    for row in hang.ranks:
        if row["culprit"] and row["where"]:
            text += f" [rank {row['rank']}: {row['where']}]"
    others = collections.defaultdict(list)
    for row in hang.ranks:
        if not row["culprit"]:
            others[(row["waiting_in"], row["where"])].append(row["rank"])
    for (what, at), rs in others.items():
        text += (
            f"; {ranks_text(rs)}: "
            + (f"waiting in {what}" if what else "in no collective")
            + (f" at {at}" if at else "")
        )
    if hang.stacks_note:
        text += f" (stacks: {hang.stacks_note})"
    return text


class Watchdog:
    """A monitor-loop watcher (launch/monitor.py): reads every rank's heartbeat each `every_s`,
    learns the gaps between progress, and when none comes for the threshold diagnoses the hang.
    A certain hang is reported at once through `on_hang(hang)` (which stops the job); ranks
    running outside any collective while the others wait are a pause (health/pauses.py): named
    live through `say`, looked at again every few seconds, ended only when the evidence turns
    certain or the pause outlasts its kill limit. Pauses that ended are kept in `pauses`. On the
    way it compares the ranks' collective fingerprints (health/fingerprints.py): a mismatch is
    reported like a hang, at once."""

    def __init__(self, world_size: int, policy: HangPolicy, on_hang: Callable[[Hang], None], every_s: float = 0.5,
                 say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)):
        self.world_size, self.policy, self.on_hang, self.every_s, self.say = world_size, policy, on_hang, every_s, say
        self.gaps: collections.deque[float] = collections.deque(maxlen=20)
        self._progress: Any = None
        self._ready = False
        self._running = False  # progress seen with every process group up: start-up is over
        self._compiling_until = 0.0
        self._suspected: float | None = None  # when every rank was seen waiting in one collective, unconfirmed
        self._changed = time.monotonic()
        self._checked = 0.0
        self._compared: dict[int, Any] = {}
        self._reader: Any = None
        self.hang: Hang | None = None  # set once, by the monitor thread; read after it stopped
        self.pause: Pause | None = None  # the pause in progress
        self._looked = 0.0  # when the pause in progress was last diagnosed
        self.pauses: list[Pause] = []  # the pauses the job survived, in order
        self.sites = Sites()

    def tick(self, reader: Any) -> None:
        now = time.monotonic()
        if self.hang is not None or now - self._checked < self.every_s:
            return
        self._checked, self._reader = now, reader
        beats = reader.all(self.world_size, HEARTBEAT)
        if self._mismatch(beats, reader):
            self.on_hang(self.hang)
            return
        progress = _progress(beats)
        # learning starts once every rank's process group is up: start-up (imports, rendezvous,
        # data loading) is not a gap between steps
        ready = len(progress) == self.world_size and all(groups for groups, _ in progress.values())
        changed = progress != self._progress
        if changed:
            if self.pause is not None:
                self._pause_ended(now)  # a pause is remembered by its site, not learned as a gap
            elif ready and self._ready:
                self.gaps.append(now - self._changed)
            self._running = self._running or (ready and self._progress is not None)
            self._progress, self._changed, self._ready, self._suspected = progress, now, ready, None
        # the loop runs once every rank has stepped: a watchdog that came late (under load) may have
        # seen no change with every group up, and the steps say start-up is over all the same
        self._running = self._running or (ready and all((step or 0) >= 1 for _, step in progress.values()))
        if changed:
            return
        busy = any(b and b.get("busy") for b in beats.values()) or now < self._compiling_until
        stalled = now - self._changed
        if self.pause is None and not (progress and (stalled >= self.policy.threshold(
                list(self.gaps), busy, running=self._running) or self._stopped_here(beats, stalled))):
            return
        if self.pause is not None and now - self._looked < LOOK_EVERY_S:
            self._pause_live(stalled)
            return
        if self._suspected is not None and now - self._suspected < LOOK_EVERY_S:
            return
        statuses = reader.all(self.world_size, "status")  # written at once: fresher than a heartbeat
        if all((statuses.get(r) or {}).get("done") for r in range(self.world_size)):
            return  # every rank's script has returned: the workers are exiting, not hung
        for r, b in beats.items():
            if b and statuses.get(r):
                b.update(status=statuses[r].get("status", b["status"]), step=statuses[r].get("step", b["step"]))
        hang = diagnose_hang(beats, stalled)
        if _progress(reader.all(self.world_size, HEARTBEAT)) != progress:
            return  # the ranks moved on while their stacks were taken: starved of CPU (a stale heartbeat), not hung
        if hang.kind not in ("stopped", "dead") and compiling(hang) and stalled < self.policy.busy_s:
            self._compiling_until = self._looked = now + COMPILE_RECHECK_S  # real work: look again later
            return
        if hang.kind == "network":
            if self._suspected is None:
                self._suspected = now  # no rank is behind: nothing proves it but the heartbeats; look once more
                return
            hang.verdict += f" (and still so {now - self._suspected:.0f} s later)"
        if hang.certain:
            self._declare(hang)
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

    def _declare(self, hang: Hang) -> None:
        if self.pause is not None:  # it began as a pause, which turned certain
            hang.verdict += f" (after {self.pause.length_s:.0f} s outside any collective)"
            self.pause = None
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
            self.pause = None
            self._declare(hang)
            return
        if due(pause, stalled):
            pause.announced_s = stalled
            self.say(pause.line(stalled, limit))

    def _pause_ended(self, now: float) -> None:
        pause = self.pause
        assert pause is not None
        pause.length_s = now - pause.started
        self.pause = None
        self.sites.survived(pause)
        self.pauses.append(pause)
        if pause.announced_s:
            self.say(f"distval: pause over: {ranks_text(pause.culprits)} back in collectives after "
                     f"{pause.length_s:.0f} s (at {pause.place()})")

    def _mismatch(self, beats: dict[int, dict[str, Any] | None], reader: Any) -> bool:
        """Compare the fingerprint digests of every rank's newest windows (when they changed);
        a mismatch becomes `hang`."""
        digests = {r: b.get("windows") or {} for r, b in beats.items() if b}
        if len(digests) < self.world_size or digests == self._compared:
            return False
        self._compared = digests
        found = fingerprints.compare(digests, fingerprints.EVERY,
                                     lambda: reader.all(self.world_size, fingerprints.KIND))
        if found is None:
            return False
        self.hang = mismatch_found(beats, *found)
        return True

    def close(self) -> None:
        """After the job: a last compare, of the fingerprints the ranks left as they ended (a
        mismatch in a job's last collectives stops nothing, but fails the job). The diagnosis,
        if any, stays in `hang`; a pause still in progress joins `pauses`."""
        if self.pause is not None:
            self._pause_ended(time.monotonic())
        if self.hang is None and self._reader is not None:
            self._mismatch(self._reader.all(self.world_size, HEARTBEAT), self._reader)


def _progress(beats: dict[int, dict[str, Any] | None]) -> dict[int, tuple]:
    """What counts as progress in the heartbeats: each rank's collectives per group and its step."""
    return {r: (b["groups"], b.get("step")) for r, b in beats.items() if b}


def stop_ranks(hang: Hang, grace_s: float = 2.0) -> None:
    """After the diagnosis: stop every rank on this host (`stop_pids`)."""
    stop_pids([row["pid"] for row in hang.ranks if row["pid"] and row["host"] == socket.gethostname()], grace_s)


def stop_pids(pids: list[int], grace_s: float = 2.0) -> None:
    """SIGTERM each (a rank's handler publishes its state and exits), then SIGKILL what is left
    (a rank blocked in a collective, or stopped)."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(process_state(p) not in ("gone", "Z") for p in pids):
        time.sleep(0.1)
    for pid in pids:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return
