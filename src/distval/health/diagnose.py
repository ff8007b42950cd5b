"""Name the rank that caused a failed job, from what every rank published on the rank channel
(`state` when it failed or was stopped, its last `status`) and, in local mode, how each process
exited. In order:
  0. a collective mismatch that made the backend abort a rank (Gloo: "Received data size doesn't
     match expected size"): the aborting rank is the victim, not the cause; the survivors' last
     collectives (their `state`'s `recent` fingerprints) and the sizes in the backend's message
     name the rank whose collective differed (a FAIL);
  1. a rank with an error of its own (not a timeout, closed connection or PeerFailed: those are
     what the others get when a peer fails); the earliest;
  2. a rank that left no state at all while its peers saw their connections close or the agent
     saw a signal or an exit code of its own (killed: SIGKILL, the OOM killer, a dead host; or
     os._exit, a crash in native code), before one that only got the agent's SIGTERM as the job
     was torn down;
  3. the rank that issued fewer collectives than the others (it stopped while they waited for it
     in the next one);
  4. at a deadline, where every rank was.
A launched script's rank (launch/shim.py) named by 1 or 2 that had not finished its first optimizer
step died during start-up (a bad path, an import, a rank-dependent raise): the verdict is the first
line of its exception, or its exit code or signal, with every rank that died the same way
(`every rank` when all did): `rank 1 died during start-up: FileNotFoundError: ...`.
"""

from __future__ import annotations

import re
import signal
from typing import Any

from distval.health import fingerprints, ranks_text
from distval.results import CannotRun, Status

STARTUP_HINT = ("the script failed before its first optimizer step, so a restart would fail the same way (none is "
                "made): its traceback is in that rank's output above ([rankN]: lines) and in "
                "details.startup.traceback; fix what it names (a path, an import, an argument) and rerun")
STARTUP_EXIT_HINT = ("the process ended before its first optimizer step without a Python exception (os._exit, "
                     "a crash in native code, the OOM killer: see `dmesg`); its last output lines are in that rank's "
                     "output above")
TEARDOWN_EXITS = (-signal.SIGTERM, 128 + signal.SIGTERM)  # the agent's SIGTERM, with and without a rank's handler

# a rank's log: the last LOG_TAIL lines kept in the verdict's details, the last LOG_READ searched for
# the backend's abort (a fatal error's stack of a rank forked from the fork server is ~20 lines)
LOG_TAIL, LOG_READ = 8, 64
_SIZE_MISMATCH = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")
MISMATCH_HINT = ("the ranks issued different collectives at the same point: a rank-dependent branch (a metric "
                 "all_reduce inside `if rank ...`, an early `continue`) or a rank-dependent tensor shape; make every "
                 "rank issue the same collectives in the same order")


class WorkerFailure(CannotRun):
    """A job that failed or hung (its check: ERROR, exit 3), or that was stopped for a finding
    about the ranks' own work (a collective mismatch: `status` FAIL, exit 1)."""

    def __init__(self, rank: int | None, message: str, last_status: str = "", details: dict | None = None,
                 hint: str = "", status: Status = Status.ERROR, verdict: str = ""):
        """`verdict`: the whole sentence, where it is not "rank R failed: MESSAGE (last status: ...)"."""
        self.rank, self.message, self.last_status, self.hint, self.status = rank, message, last_status, hint, status
        self.details = details or {}
        who = f"rank {rank}" if rank is not None else "a worker"
        where = f" (last status: {last_status})" if last_status else ""
        super().__init__(verdict or f"{who} failed: {message}{where}")


_SECONDARY = ("timed out", "timeout", "connection closed", "pair closure", "connection reset", "broken pipe",
              "peerfailed")
_CLOSED = ("connection closed", "connection reset", "broken pipe", "pair closure")


def secondary(error: str) -> bool:
    """True for the errors a rank gets because a peer failed (timeouts, closed connections,
    PeerFailed), as opposed to an error of its own."""
    return any(s in error.lower() for s in _SECONDARY)


def diagnose(states: dict[int, dict[str, Any] | None], statuses: dict[int, dict[str, Any] | None],
             exitcodes: dict[int, int] | None = None, log_tails: dict[int, list[str]] | None = None,
             deadline_s: float | None = None, beats: dict[int, dict[str, Any] | None] | None = None) -> WorkerFailure:
    """`beats`: every rank's last heartbeat (health/heartbeat.py), when the launcher has them."""
    exitcodes, log_tails, beats = exitcodes or {}, log_tails or {}, beats or {}
    ranks = sorted(states)
    status = {
        r: (statuses.get(r) or {}).get("status") or (states[r] or {}).get("status") or "not started" for r in ranks
    }
    details = {"ranks": {r: {"error": (states[r] or {}).get("error"), "status": status[r],
                             "issued": (states[r] or {}).get("issued"), "exitcode": exitcodes.get(r),
                             "pending": [p["op"] for p in (states[r] or {}).get("pending", [])],
                             "log_tail": log_tails.get(r, [])[-LOG_TAIL:]} for r in ranks}}
    aborted = backend_mismatch(states, exitcodes, log_tails, details)
    if aborted is not None:
        return aborted
    errors = {r: st["error"] for r, st in states.items() if st and st.get("error")}
    own = sorted((states[r]["time"], r) for r, e in errors.items() if not secondary(e))
    if own:
        r = own[0][1]
        causes = {k: first_line(errors[k]) for _, k in own}
        return (startup_death(r, causes, states, statuses, beats, status, details, STARTUP_HINT)
                or WorkerFailure(r, errors[r], states[r]["status"], details))
    signalled = {r: -code for r, code in exitcodes.items() if code is not None and code < 0}
    exited = {r: code for r, code in exitcodes.items() if code is not None and code > 0 and code not in TEARDOWN_EXITS}
    vanished = [r for r in ranks if states[r] is None]
    if vanished and (signalled or exited or any(any(c in e.lower() for c in _CLOSED) for e in errors.values())):
        # a rank killed by a signal, or ended by an exit code, of its own, before one the agent's
        # teardown sent (SIGTERM)
        r = min(vanished, key=lambda k: (k not in signalled and k not in exited, signalled.get(k) == signal.SIGTERM,
                                         k))
        deaths = {k: f"killed by {signal_name(signalled[k])}" for k in vanished
                  if k in signalled and signalled[k] != signal.SIGTERM}
        deaths.update({k: f"exited with code {exited[k]} without an exception" for k in vanished if k in exited})
        if r in deaths:
            how = deaths[r]
        elif r in signalled:
            how = f"killed by {signal_name(signalled[r])}"
        elif exitcodes and r not in exitcodes:  # the launcher saw the others fail, and this one end well
            # its last heartbeat came as it ended, so its count is exact (a killed rank's is not)
            how = "ended (exit 0) while the others still waited for it in a collective" + fewer_collectives(r, beats)
        else:
            how = "died without a word (its peers' connections to it closed)"
        found = startup_death(r, deaths, states, statuses, beats, status, details, STARTUP_EXIT_HINT) if r in deaths \
            else None
        return found or WorkerFailure(r, how, status[r], details)
    issued = {r: st["issued"] for r, st in states.items() if st}
    if issued and len(set(issued.values())) > 1:
        r = min(issued, key=lambda k: (issued[k], k))
        waiting = sorted(k for k in issued if issued[k] > issued[r])
        what = f"stopped after {issued[r]} collective(s) while ranks {waiting} waited in the next one"
        if deadline_s is not None:
            what += f" (job stopped at its deadline of {deadline_s:g}s)"
        return WorkerFailure(r, what, status[r], details)
    if deadline_s is not None:
        return WorkerFailure(None, f"the job did not finish within its deadline of {deadline_s:g}s", "; ".join(
            f"rank {r}: {s}" for r, s in status.items()), details)
    if errors:
        r = min(errors, key=lambda k: states[k]["time"])
        return WorkerFailure(r, errors[r], states[r]["status"], details)
    r = next(iter(exitcodes), None)
    return WorkerFailure(r, f"exited with code {exitcodes.get(r)}", status.get(r, ""), details)


def startup_death(culprit: int, causes: dict[int, str], states: dict[int, dict[str, Any] | None],
                  statuses: dict[int, dict[str, Any] | None], beats: dict[int, dict[str, Any] | None],
                  status: dict[int, str], details: dict[str, Any], hint: str) -> WorkerFailure | None:
    """`culprit` died during start-up of `causes[culprit]`: named with every rank that died of the
    same cause then. `causes`: {rank: what ended it} for the ranks that died of their own. None
    where the culprit had got past start-up (or is not a launched script's rank)."""
    if not in_startup(culprit, states, statuses, beats):
        return None
    cause = causes[culprit]
    same = sorted(r for r, c in causes.items() if c == cause and in_startup(r, states, statuses, beats))
    who = "every rank" if len(same) == len(states) > 1 else ranks_text(same)
    details["startup"] = {"ranks": same, "cause": cause, "traceback": (states.get(culprit) or {}).get("traceback", "")}
    return WorkerFailure(culprit if len(same) == 1 else None, cause, status[culprit], details, hint,
                         verdict=f"{who} died during start-up: {cause}")


def in_startup(rank: int, states: dict[int, dict[str, Any] | None], statuses: dict[int, dict[str, Any] | None],
               beats: dict[int, dict[str, Any] | None]) -> bool:
    """Whether a launched script's rank had not finished its first optimizer step: its last words
    say (`script_step`), else its status says it runs a script (launch/shim.py) and neither that
    status (`stepped`, written at the first step) nor its last heartbeat counted a step.
    distval's own workers say neither: never."""
    state, said = states.get(rank) or {}, statuses.get(rank) or {}
    if "script_step" in state:
        return state["script_step"] == 0
    return bool(said.get("script")) and not said.get("stepped") and not (beats.get(rank) or {}).get("step")


def first_line(error: str, limit: int = 300) -> str:
    """An error as one line: its type and the first line of its message (torch's run to pages)."""
    line = next((x.strip() for x in error.splitlines() if x.strip()), error.strip())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def backend_mismatch(states: dict[int, dict[str, Any] | None], exitcodes: dict[int, int],
                     log_tails: dict[int, list[str]], details: dict[str, Any]) -> WorkerFailure | None:
    """A rank the backend aborted on a collective mismatch, turned into the mismatch: which rank's
    collective differed, from the survivors' last collectives and the message's sizes."""
    victim, sizes = None, None
    for r, lines in sorted(log_tails.items()):
        found = next((m for line in lines if (m := _SIZE_MISMATCH.search(line))), None)
        if found and (exitcodes.get(r) == -signal.SIGABRT or states.get(r) is None):
            victim, sizes = r, (int(found.group(1)), int(found.group(2)))
            break
    if victim is None or sizes is None:
        return None
    received, expected = sizes
    how = (f"the backend aborted rank {victim} on mismatched sizes (it received {received} bytes where its own "
           f"collective expected {expected})")
    recents = {r: st["recent"] for r, st in states.items() if st and st.get("recent")}
    found = fingerprints.first_difference(recents)
    if found is None:
        return WorkerFailure(victim, f"collective mismatch: {how}; the other ranks left no record of their last "
                             f"collectives, so the rank that issued a different one is not known", "", details,
                             MISMATCH_HINT, Status.FAIL)
    pg, seq, prints = found
    sides: dict[str, list[int]] = {}
    for r, fp in sorted(prints.items()):
        sides.setdefault(fp, []).append(r)
    # the victim's own collective was smaller than what it received: it sides with the ranks
    # whose collective is, and the ranks that sent more are the others
    smaller = [fp for fp in sides if (n := fingerprints.nbytes(fp)) is not None and n < received]
    if len(smaller) == 1:
        sides[smaller[0]].append(victim)
    ranked = sorted(sides.items(), key=lambda kv: -len(kv[1]))
    if len(ranked[0][1]) > len(ranked[1][1]):
        usual, odd = ranked[0], ranked[1:]
    elif len(smaller) == 1:
        usual, odd = (smaller[0], sides[smaller[0]]), [(fp, rs) for fp, rs in ranked if fp != smaller[0]]
    else:
        usual, odd = None, ranked
    culprits = sorted(r for _, rs in odd for r in rs)
    if usual is None:
        text = (f"collective #{seq} of group {pg} differs: "
                + "; ".join(f"{ranks_text(rs)} issued {fp}" for fp, rs in odd) + " (no majority decides)")
    else:
        parts = []
        for fp, rs in odd:
            history = {f for r in usual[1] for f in recents.get(r, {}).get(pg, {}).values()}
            if fp in history:  # a collective the others issue too, one early: it skipped theirs
                parts.append(f"{ranks_text(rs)} skipped {usual[0]} (#{seq} of group {pg}): it went on to {fp} while "
                             f"{ranks_text(usual[1])} issued {usual[0]}")
            else:
                parts.append(f"{ranks_text(rs)} issued {fp} as #{seq} of group {pg} while {ranks_text(usual[1])} "
                             f"issued {usual[0]}")
        text = "; ".join(parts)
    details["mismatch"] = {"group": pg, "seq": seq, "fingerprints": {str(r): fp for r, fp in prints.items()},
                           "aborted": victim, "received_bytes": received, "expected_bytes": expected}
    return WorkerFailure(culprits[0] if len(culprits) == 1 else None, f"collective mismatch: {text}; {how}",
                         (states.get(culprits[0]) or {}).get("status", "") if culprits else "", details,
                         MISMATCH_HINT, Status.FAIL)


def fewer_collectives(rank: int, beats: dict[int, dict[str, Any] | None]) -> str:
    """", having issued fewer collectives on the default group than the others: N vs M", or ""."""
    issued = {r: b["groups"]["0"][0] for r, b in beats.items() if b and "0" in b.get("groups", {})}
    if rank not in issued or issued[rank] >= max(issued.values()):
        return ""
    return (f", having issued {issued[rank]} collectives on the default group while the others issued up to "
            f"{max(issued.values())}: it skipped {max(issued.values()) - issued[rank]}")


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
