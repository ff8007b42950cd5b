"""Collective fingerprints compared across ranks every K collectives: a rank that calls another
op, shape or dtype than its peers is named before the job hangs, where the backend lets the
mismatched collective complete (same bytes, other shape or dtype: a silent corruption), and
named at once when it does not.

Each rank's heartbeat thread (health/heartbeat.py) cuts the collectives its Flight Recorder
completed on each process group into windows of `every` sequence numbers. For every window whose
entries are all still in the recorder's buffer it keeps the fingerprints (one short string per
collective) and their digest; the digests of the last KEEP windows ride in the heartbeat, the
fingerprints themselves are published under their own channel kind. The watchdog outside the
ranks (health/hang.py) compares the digests of the windows every rank has, and reads the
fingerprints only when they differ, to name the first collective that differs and both sides.

Why outside the ranks and not a collective over the control group: a compare that is itself a
collective deadlocks with the rank it is meant to catch (a rank that skipped a collective reaches
the compare one collective late), and it costs every rank a round trip every K collectives. Read
from the recorder off the training thread, the check costs the training loop nothing; what it
gives up is completeness: at most the recorder's last 256 entries are seen each heartbeat, so on
a job issuing more than that per half second some windows are not compared (sampled, not missed
for good: a persistent mismatch shows in the next window read).

What is compared, per collective: the op; the sizes and dtypes that every rank of a correct job
shares (the input for most ops, the output of scatter, neither for all_to_all whose splits may
differ by rank). Point-to-point ops (send/recv) differ by rank by nature and are left out. The
Flight Recorder does not record the reduce op, the root or the call site on Gloo: those are not
compared (the stacks taken at a hang show the call sites).
"""

from __future__ import annotations

import ast
import collections
import hashlib
from typing import Any, Callable

from distval.health import ranks_text

EVERY = 64  # K: collectives per window
KEEP = 4  # windows per group each rank keeps published


def fingerprint(entry: dict[str, Any]) -> str:
    """What every rank of a correct job issues identically: "all_reduce [[4]] Float"."""
    op = entry["profiling_name"].split(":")[-1]
    if op.startswith("all_to_all") or op.startswith("alltoall"):
        return f"{op} {entry.get('input_dtypes')}"
    side = "output" if op == "scatter" else "input"
    dtypes = ",".join(entry.get(f"{side}_dtypes") or [])
    return f"{op} {entry.get(f'{side}_sizes')} {dtypes}"


def windows(entries: list[dict[str, Any]], completed: dict[str, int], every: int,
            done: dict[str, int], final: bool = False) -> dict[str, dict[int, dict[str, list]]]:
    """The fingerprints of each group's windows completed since window `done[pg]` whose entries
    are all in `entries` (the recorder's): {pg: {window: {"prints": [fingerprint of seq
    (w-1)*every+1, ..., of seq w*every], "times": [when each was issued, s since the epoch]}}}.
    `final` (the rank's last heartbeat): the trailing part-window too, so the last collectives
    of a job are compared as well."""
    by_seq: dict[str, dict[int, dict[str, Any]]] = collections.defaultdict(dict)
    for e in entries:
        if not e.get("is_p2p"):
            by_seq[e["process_group"][0]][e["collective_seq_id"]] = e
    out: dict[str, dict[int, list[str]]] = {}
    for pg, last in completed.items():
        seqs = by_seq.get(pg, {})
        end = -(-last // every) if final else last // every
        for w in range(max(done.get(pg, 0), end - KEEP) + 1, end + 1):
            span = range((w - 1) * every + 1, min(w * every, last) + 1)
            if all(s in seqs for s in span):
                out.setdefault(pg, {})[w] = {"prints": [fingerprint(seqs[s]) for s in span],
                                             "times": [round(seqs[s].get("time_created_ns", 0) / 1e9, 3) for s in span]}
    return out


def digest(prints: list[str]) -> str:
    return hashlib.blake2b("\n".join(prints).encode(), digest_size=8).hexdigest()



def compare(digests: dict[int, dict[str, dict[str, str]]], every: int,
            fingerprints_of: Callable[[], dict[int, dict[str, Any] | None]]
            ) -> tuple[list[int], str, float | None] | None:
    """(culprits, verdict, when the first differing collective was issued: s since the epoch, if
    known) for the first window of a group whose digest differs between ranks,
    or None. `digests`: each rank's {pg: {window: digest}} (from its heartbeat);
    `fingerprints_of()`: each rank's published fingerprints ({"windows": {pg: {window: {"prints":
    [...], "times": [...]}}}}), read only when digests differ.

    The ranks outside the majority are named. Without a majority (two ranks, or an even split),
    the side whose collective no rank issued anywhere else in the windows at hand is named (a
    shape that appears once is the odd one out, the one every step issues is not); failing
    that, every side."""
    for pg in sorted({pg for d in digests.values() for pg in d}, key=lambda g: (g != "0", g)):
        common = set.intersection(*(set(d.get(pg, {})) for d in digests.values()))
        for w in sorted(common, key=int):
            sides: dict[str, list[int]] = collections.defaultdict(list)
            for r in sorted(digests):
                sides[digests[r][pg][w]].append(r)
            if len(sides) > 1:
                published = {r: (doc or {}).get("windows") or {} for r, doc in fingerprints_of().items()}
                found = _name(pg, int(w), every, list(sides.values()), published)
                if found is not None:
                    return found
    return None


def _name(pg: str, w: int, every: int, sides: list[list[int]], prints: dict[int, dict[str, Any]]
          ) -> tuple[list[int], str, float | None] | None:
    sides.sort(key=len, reverse=True)
    first, last = (w - 1) * every + 1, w * every
    found = [(prints.get(rs[0], {}).get(pg) or {}).get(str(w)) or {} for rs in sides]
    lists = [f.get("prints") for f in found]
    tie = len(sides[1]) == len(sides[0])
    at = min((next((i for i, (a, b) in enumerate(zip(lists[0], fps)) if a != b), None) for fps in lists[1:]
              if lists[0] and fps), key=lambda i: len(lists[0]) if i is None else i, default=None)
    if all(lists) and at is None:  # one is a prefix of the other: a rank that ended early, not a mismatch
        return None
    if not all(lists):  # the window's fingerprints were replaced by newer ones: the digests only
        culprits = sorted(r for rs in (sides if tie else sides[1:]) for r in rs)
        return culprits, (f"collectives #{first}-#{last} of group {pg} differ between "
                          + " and ".join(ranks_text(rs) for rs in sides) + " (fingerprint digests)"), None
    seq, odd = first + at, list(range(1, len(sides)))
    if tie:
        seen = collections.Counter(fp for doc in prints.values() for g, ws in doc.items()
                                   for win, f in ws.items() for i, fp in enumerate(f["prints"])
                                   if (g, win, i) != (pg, str(w), at))
        new = [i for i, fps in enumerate(lists) if not seen[fps[at]]]
        odd = new if len(new) == 1 else list(range(len(sides)))
    culprits = sorted(r for i in odd for r in sides[i])
    text = f"collective #{seq} of group {pg} differs: " + "; ".join(
        f"{ranks_text(sides[i])} issued {lists[i][at]}" for i in odd)
    rest = [i for i in range(len(sides)) if i not in odd]
    if rest:
        text += ", while " + "; ".join(f"{ranks_text(sides[i])} issued {lists[i][at]}" for i in rest)
    if tie and len(odd) == 1:
        text += f" (no majority: {ranks_text(sides[odd[0]])}'s is the one no rank issued anywhere else)"
    elif tie:
        text += " (no majority decides)"
    return culprits, text, min(f["times"][at] for f in found)


def recent(entries: list[dict[str, Any]], n: int = 8) -> dict[str, dict[str, str]]:
    """The fingerprints of each group's last `n` collectives in the recorder, completed or not:
    {pg: {seq: fingerprint}} (what a failing rank leaves in its `state`)."""
    out: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for e in entries:
        if not e.get("is_p2p"):
            out[e["process_group"][0]][str(e["collective_seq_id"])] = fingerprint(e)
    return {pg: dict(sorted(seqs.items(), key=lambda kv: int(kv[0]))[-n:]) for pg, seqs in out.items()}


def first_difference(recents: dict[int, dict[str, dict[str, str]]]) -> tuple[str, int, dict[int, str]] | None:
    """The first collective (group, sequence number) that two or more ranks recorded differently:
    (pg, seq, {rank: fingerprint}), or None."""
    keys = {(pg, int(seq)) for doc in recents.values() for pg, seqs in doc.items() for seq in seqs}
    for pg, seq in sorted(keys, key=lambda k: (k[1], k[0] != "0", k[0])):
        prints = {r: doc[pg][str(seq)] for r, doc in recents.items() if str(seq) in doc.get(pg, {})}
        if len(set(prints.values())) > 1:
            return pg, seq, prints
    return None


_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1,
                "Byte": 1, "Bool": 1}


def nbytes(fp: str) -> int | None:
    """The bytes of a fingerprint's tensors ("all_reduce [[1, 4]] Float" -> 16), None if unknown."""
    try:
        sizes, _, dtypes = fp.split(" ", 1)[1].rpartition(" ")
        shapes, kinds = ast.literal_eval(sizes), dtypes.split(",")
    except (ValueError, SyntaxError):
        return None
    total = 0
    for shape, kind in zip(shapes, kinds):
        if kind not in _DTYPE_BYTES:
            return None
        count = 1
        for dim in shape:
            count *= dim
        total += count * _DTYPE_BYTES[kind]
    return total
