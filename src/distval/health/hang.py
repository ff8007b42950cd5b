"""Hangs: the diagnosis that names the rank(s) that caused one, from facts every rank published
(health/heartbeat.py), the state of each process and its Python stack (health/procs.py). The
watchdog that declares one is health/watchdog.py; its thresholds are health/config.py's `HangPolicy`.

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
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from distval.health import ranks_text
from distval.health.procs import cpu_seconds, main_frames, process_state, py_spy, stack_of, where

_COMPILING = ("torch/_dynamo/", "torch/_inductor/")


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


def describe(fp: tuple | None, pg: str) -> str:
    if fp is None:
        return f"a collective of group {pg}"
    seq, op, sizes, dtypes = fp
    return f"{op} #{seq} of group {pg} (sizes {sizes}, {dtypes})"



def decide(beats: dict[int, dict[str, Any] | None], states: dict[int, str],
           members: dict[str, list[int]] | None = None,
           running: frozenset[int] = frozenset()) -> tuple[list[int], str, str]:
    """(culprits, kind, verdict) from every rank's last heartbeat (its "status": the latest the
    rank said, which the watchdog takes from the `status` kind) and its process state.
    `members`: the ranks of each process group (a sub-group of a mesh); a group not named, or
    every group without it, has every rank. `running`: the ranks seen using a core as the
    diagnosis looked (not blocked in a collective's wait)."""
    ranks = sorted(beats)

    def among(pg: str) -> list[int]:
        return [r for r in ranks if members is None or pg not in members or r in members[pg]]

    stopped = [r for r in ranks if states.get(r) in ("T", "t")]
    if stopped:
        return stopped, "stopped", (f"{ranks_text(stopped)} stopped (SIGSTOP or a debugger) at "
                                    f"{_statuses(beats, stopped)}; the others wait for it")
    dead = [r for r in ranks if states.get(r) in ("gone", "Z")]
    if dead:
        return dead, "dead", f"{ranks_text(dead)} gone (the process exited or was killed) at {_statuses(beats, dead)}"
    live = _caught_up({r: b for r, b in beats.items() if b}, among, running)
    silent = [r for r in ranks if not beats.get(r)]
    if silent:
        return silent, "outside", f"{ranks_text(silent)} never reported (stuck before its process group came up)"
    # a group on which some ranks issued fewer collectives and went on to wait in another group,
    # while the ranks ahead wait on it: those behind skipped one (whatever else they wait in)
    for pg in _groups_waited(live):
        issued = {r: live[r]["groups"].get(pg, [0, 0])[0] for r in among(pg)}
        top = max(issued.values())
        ahead = [r for r in issued if issued[r] == top and pg in _waiting(live[r])]
        behind = [r for r in issued if issued[r] < top and any(g != pg for g in _still_waiting(live, r))]
        if ahead and behind and len(ahead) + len(behind) == len(issued):
            what = describe(_fingerprint(live[ahead[0]], pg), pg)
            parts = []
            for r in behind:
                g = next(g for g in _still_waiting(live, r) if g != pg)
                parts.append(_skipped(r, live[r], g, what, pg, issued[r], ahead, top))
            return behind, "outside", "; ".join(parts)
    # a group some ranks wait in and others have not reached: the others are the cause (the
    # summary adds where the waiting ranks are)
    for pg in _groups_waited(live):
        waiting = [r for r in among(pg) if pg in _waiting(live[r])]
        target = max((_waiting(live[r])[pg][0] for r in waiting), default=0)
        # a rank that issued the collective waited in has reached it (its peers' recorder may mark
        # the completion late: Gloo's work is marked done when it is next looked at)
        absent = [r for r in among(pg) if r not in waiting and live[r]["groups"].get(pg, [0, 0])[0] < target]
        if waiting and absent:
            what = describe(_fingerprint(live[waiting[0]], pg), pg)
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
        prints = {r: _fingerprint(live[r], pg) for r in among(pg)}
        counts = collections.Counter(fp for fp in prints.values())
        if len(counts) > 1:
            (top, n), *rest = counts.most_common()
            if rest and rest[0][1] == n:  # no majority: name every side
                sides = "; ".join(f"{ranks_text([r for r in prints if prints[r] == fp])} in {describe(fp, pg)}"
                                  for fp in counts)
                return list(prints), "mismatch", ("the ranks wait in different collectives and no majority decides: "
                                                  f"{sides}")
            odd = [r for r in prints if prints[r] != top]
            sides = "; ".join(f"{ranks_text([r])} in {describe(prints[r], pg)}" for r in odd)
            return odd, "mismatch", (f"{sides}, while {ranks_text([r for r in prints if r not in odd])} wait in "
                                     f"{describe(top, pg)}")
    return [], "network", ("every rank waits in the same collective and none is behind: the transport (network, "
                           "NCCL/Gloo) is stuck; see `distval doctor`")


def _caught_up(live: dict[int, dict[str, Any]], among: Callable[[str], list[int]],
               running: frozenset[int]) -> dict[int, dict[str, Any]]:
    """The beats of the running ranks with each group's completions brought up to the furthest
    any other rank of the group completed. Gloo's recorder can mark a completion seconds late on a
    rank whose main thread computes (a loaded host), so a rank that went on to evaluate alone can
    still show its last all_reduce pending while its peer waits in the next one. A rank blocked
    there (its process idle) is not caught up: Gloo completes a collective whose sizes differ on
    the ranks that sent fewer bytes and leaves the others waiting in it (a mismatch)."""
    out = {}
    for r, b in live.items():
        if r not in running:
            out[r] = b
            continue
        groups = {}
        for pg, (enqueued, completed) in b.get("groups", {}).items():
            done = max((live[o]["groups"].get(pg, [0, 0])[1] for o in among(pg) if o != r and o in live), default=0)
            groups[pg] = [enqueued, max(completed, min(enqueued, done))]
        pending = [p for p in b.get("pending", []) if p["seq"] > groups.get(p["pg"], [0, 0])[1]]
        out[r] = {**b, "groups": groups, "pending": pending}
    return out


def _skipped(r: int, beat: dict[str, Any], g: str, what: str, pg: str, issued: int, others: list[int],
             top: int) -> str:
    """Rank r waits in group g's collective, having issued fewer on group pg than `others`."""
    return (f"rank {r} went on to {describe(_fingerprint(beat, g), g)} without issuing {what} (it issued {issued} "
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
    culprits, kind, verdict = decide(beats, states, running=frozenset(r for r, busy in spinning.items() if busy))
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
                     "waiting_in": describe(_fingerprint(b, pg), pg) if pg else None,
                     "blocked_in": describe(_fingerprint(b, blocked), blocked) if blocked else None,
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
