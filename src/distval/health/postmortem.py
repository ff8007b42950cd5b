"""`distval diagnose`: the verdict on a hung or broken job from the Flight Recorder dumps its ranks
left (health/frdump.py), whatever launched it.

The same decision as the live watchdog, not a second one: each rank's dump becomes the heartbeat
that rank would have published (per group, the last collective issued and completed, and the
fingerprint of each it waits in: op, sizes, dtypes), and `hang.decide` names the culprit over
them, a sub-group of a mesh judged among its own ranks. Before that, every collective two or
more ranks recorded under the same group and sequence number is compared: the first that differs
(another op, size or dtype) is a mismatch whatever happened after it.

What completed is read across ranks: collective #k of a group cannot have completed on any rank
while a member with a dump never issued it, so a rank that issued more than a peer waits in the
rest. On NCCL the dump's own completion counts too; on Gloo it is not evidence (a collective
that timed out is counted completed; frdump.py). What a dump cannot tell is said, never guessed:
a rank with no dump is named as such, and is the suspect only when no rank that left one is
behind.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from distval.health import debugstacks, fingerprints, ranks_text, spans
from distval.health.frdump import RankDump, candidates, read
from distval.health.hang import HINTS, decide, describe
from distval.health.heartbeat import pending_collectives
from distval.health.pauses import user_place
from distval.results import Check, Report, Status, Table

MISSING_HINT = ("a rank without a dump could not write one (stopped, killed, or never timed out); its own log or a "
                "py-spy dump of its process says where it is")


def _collectives(d: RankDump, pg: str) -> list[dict[str, Any]]:
    return [e for e in d.entries if e["process_group"][0] == pg and not e.get("is_p2p")]


def members_of(dumps: list[RankDump]) -> dict[str, list[int]]:
    """Each group's ranks: as a dump's pg_config lists them, else the ranks whose dumps recorded
    collectives of the group (a Gloo dump does not list a sub-group's ranks)."""
    members: dict[str, set[int]] = collections.defaultdict(set)
    for d in dumps:
        for e in d.entries:
            members[e["process_group"][0]].add(d.rank)
    for d in dumps:
        for name, g in d.groups.items():
            if g.ranks:
                members[name] = set(g.ranks)
    return {name: sorted(rs) for name, rs in members.items() if rs}


def beats_of(dumps: list[RankDump], members: dict[str, list[int]]) -> dict[int, dict[str, Any]]:
    """The heartbeat (health/heartbeat.py's payload) each rank would have published when it wrote
    its dump: per group [issued, completed], the collectives it waits in, where it issued the first."""
    issued = {d.rank: {} for d in dumps}
    for d in dumps:
        for pg in {*d.status, *(e["process_group"][0] for e in d.entries)}:
            seqs = [e["collective_seq_id"] for e in _collectives(d, pg)]
            issued[d.rank][pg] = max(d.status.get(pg, (0, 0))[0], max(seqs, default=0))
    # what every member with a dump issued: what can have completed
    low = {pg: min(issued[r].get(pg, 0) for r in rs if r in issued) for pg, rs in members.items()
           if any(r in issued for r in rs)}
    beats = {}
    for d in dumps:
        groups = {}
        for pg, mine in issued[d.rank].items():
            done = low.get(pg, mine)
            if d.backend != "gloo" and pg in d.status:
                done = min(done, d.status[pg][1])
            groups[pg] = [mine, min(mine, done)]
        pending = pending_collectives(groups, [e for e in d.entries if not e.get("is_p2p")])
        where = _where(_waited_entry(d, pending))
        beats[d.rank] = {"groups": groups, "pending": pending, "status": where if pending else (
            f"its last collective's end (issued at {where})" if where else "its last collective's end")}
    return beats


def frames(entry: dict[str, Any] | None) -> list[str]:
    """The entry's recorded Python stack, innermost first, as py-spy writes a frame."""
    return [f"{f.get('name')} ({f.get('filename')}:{f.get('line')})" for f in (entry or {}).get("frames") or []]


def _where(entry: dict[str, Any] | None) -> str:
    """The innermost frame of the user's code in the entry's stack, its file by name ("" without
    one: the JSON form records no stacks)."""
    return user_place(frames(entry))


def recorded_mismatch(dumps: list[RankDump]) -> tuple[list[int], str, str, int] | None:
    """(culprits, verdict, group, seq) for the first collective two ranks recorded differently.
    The ranks outside the majority are named; without one (two ranks), the side whose collective
    appears nowhere else in the dumps (a shape every step issues is not the odd one)."""
    recents = {d.rank: fingerprints.recent(d.entries, n=len(d.entries)) for d in dumps}
    found = fingerprints.first_difference(recents)
    if found is None:
        return None
    pg, seq, prints = found
    sides: dict[str, list[int]] = collections.defaultdict(list)
    for r in sorted(prints):
        sides[prints[r]].append(r)
    ordered = sorted(sides, key=lambda fp: -len(sides[fp]))
    if len(sides[ordered[0]]) > len(sides[ordered[1]]):
        odd = ordered[1:]
    else:
        seen = collections.Counter(fp for doc in recents.values() for g, seqs in doc.items() for s, fp in seqs.items()
                                   if (g, int(s)) != (pg, seq))
        new = [fp for fp in ordered if not seen[fp]]
        odd = new if len(new) == 1 else ordered
    culprits = sorted(r for fp in odd for r in sides[fp])
    text = f"collective #{seq} of group {pg} differs: " + "; ".join(f"{ranks_text(sides[fp])} issued {fp}"
                                                                     for fp in odd)
    rest = [fp for fp in ordered if fp not in odd]
    if rest:
        text += ", while " + "; ".join(f"{ranks_text(sides[fp])} issued {fp}" for fp in rest)
    elif len(odd) > 1:
        text += " (no majority decides)"
    return culprits, text, pg, seq


def _last_completed(d: RankDump, pg: str, completed: int) -> str:
    entry = next((e for e in _collectives(d, pg) if e["collective_seq_id"] == completed), None)
    if completed <= 0:
        return "none"
    return f"#{completed} {fingerprints.fingerprint(entry)}" if entry else f"#{completed}"


def diagnose(paths: list[Path]) -> Report:
    """The report of `distval diagnose`: which dumps were read, the verdict, per rank and per group.
    Folders of torch.distributed.debug's dumps without a Flight Recorder dump are judged from the
    ranks' stacks instead (debugstacks.py)."""
    stacks = debugstacks.files(paths)
    if stacks and not [f for p in paths if p.exists() for f in candidates(p) if f not in stacks]:
        return debugstacks.diagnose(stacks, paths)
    dumps = read(paths)
    members = members_of(dumps)
    world = sorted({r for rs in members.values() for r in rs} | {d.rank for d in dumps})
    beats = beats_of(dumps, members)
    missing = [r for r in world if r not in beats]
    report = Report("diagnose", meta={"inputs": [str(p) for p in paths], "world_size": len(world),
                                      "ranks_with_dumps": sorted(beats), "ranks_without": missing,
                                      "backend": dumps[0].backend, "recorder_version": dumps[0].version})
    report.add(Check("diagnose dumps", Status.WARN if missing else Status.OK,
                     f"{len(dumps)} dump(s) of {len(world)} ranks read ({dumps[0].backend or 'no collectives'}), "
                     f"{len(members)} process group(s)"
                     + (f"; {ranks_text(missing)} left no dump: what it did is not known" if missing else ""),
                     details={"files": {str(d.rank): str(d.path) for d in dumps}},
                     hint=MISSING_HINT if missing else ""))
    culprits, kind, verdict = _verdict(dumps, beats, members, missing)
    by_rank = {d.rank: d for d in dumps}
    stacks = {r: "\n".join(frames(_waited_entry(by_rank[r], b["pending"]))) for r, b in beats.items()}
    if kind == "none":
        report.add(Check("diagnose verdict", Status.OK, verdict))
    else:
        hint = MISSING_HINT if culprits and set(culprits) <= set(missing) else HINTS[kind]
        details = {"hang": kind, "culprits": culprits, "stacks": {str(r): s for r, s in stacks.items() if s}}
        report.add(Check("diagnose verdict", Status.FAIL, verdict, details, hint,
                         where={"rank": culprits[0]} if culprits else {}))
    report.tables += [_rank_table(dumps, beats, culprits, missing), _group_table(dumps, beats, members)]
    return report


def _verdict(dumps: list[RankDump], beats: dict[int, dict[str, Any]], members: dict[str, list[int]],
             missing: list[int]) -> tuple[list[int], str, str]:
    found = recorded_mismatch(dumps)
    if found is not None:
        culprits, text, _, _ = found
        return culprits, "mismatch", text
    decided = decide(beats, {}, members) if any(b["pending"] for b in beats.values()) else None
    if decided is not None and (decided[1] != "network" or not missing):
        return decided
    return _suspect(dumps, beats, members, missing) or decided or ([], "none", (
        "every rank issued the same collectives in every group: none is behind and none differs (a hang here "
        "would be in the transport, or outside collectives)"))


def _suspect(dumps: list[RankDump], beats: dict[int, dict[str, Any]], members: dict[str, list[int]],
             missing: list[int]) -> tuple[list[int], str, str] | None:
    """No rank with a dump is behind another: the ranks of a group that left none are the ones
    the others wait for, if any."""
    by_rank = {d.rank: d for d in dumps}
    for pg in sorted(members, key=lambda g: (g != "0", g)):
        absent = [r for r in missing if r in members[pg]]
        present = [r for r in members[pg] if r in beats]
        if absent and present:
            top = max(beats[r]["groups"].get(pg, [0, 0])[0] for r in present)
            last = next((e for r in present for e in _collectives(by_rank[r], pg) if e["collective_seq_id"] == top),
                        None)
            what = f"{_op(last)} #{top} of group {pg}" if last else f"collective #{top} of group {pg}"
            return absent, "outside", (f"{ranks_text(present)} issued {what} last and none is behind; "
                                       f"{ranks_text(absent)} left no dump: the one they wait for (stopped, dead, or "
                                       "outside any collective when they dumped)")
    return None


def _op(entry: dict[str, Any]) -> str:
    return str(entry["profiling_name"]).split(":")[-1]


def _waited_entry(d: RankDump, pending: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The entry of the first collective `d` waits in, else its newest entry."""
    first = min(pending, key=lambda p: p["seq"], default=None)
    if first is None:
        return d.entries[-1] if d.entries else None
    return next((e for e in _collectives(d, first["pg"]) if e["collective_seq_id"] == first["seq"]), None)


def _rank_table(dumps: list[RankDump], beats: dict[int, dict[str, Any]], culprits: list[int],
                missing: list[int]) -> Table:
    """One row per set of ranks in the same state (a 1,024-rank job that hangs on one rank has a
    handful of rows, not 1,024)."""
    table = Table("diagnose_ranks", ["ranks", "culprit", "waiting_in", "last_completed", "where", "dumps"],
                  title="The ranks at their dumps: what they wait in, their last completed collective per group, the "
                        "line they issued that collective from (else their last one)")
    by_rank = {d.rank: d for d in dumps}
    rows: dict[tuple, list[int]] = collections.defaultdict(list)
    for r in sorted({*by_rank, *missing}):
        d = by_rank.get(r)
        if d is None:
            rows[(r in culprits, None, None, None, False)].append(r)
            continue
        b = beats[r]
        waits = sorted(b["pending"], key=lambda p: (p["pg"] != "0", p["seq"]))
        groups = sorted(b["groups"].items(), key=lambda kv: (kv[0] != "0", kv[0]))
        rows[(r in culprits, "; ".join(_waits_in(p) for p in waits[:2]) or None,
              "; ".join(f"{pg}: {_last_completed(d, pg, v[1])}" for pg, v in groups),
              _where(_waited_entry(d, b["pending"])) or None, True)].append(r)
    for (culprit, waiting, completed, where, dumped), ranks in sorted(rows.items(), key=lambda kv: kv[1][0]):
        table.add(ranks=spans(ranks), culprit=culprit, waiting_in=waiting, last_completed=completed, where=where,
                  dumps="yes" if dumped else "none")
    return table


def _waits_in(pending: dict[str, Any]) -> str:
    return describe((pending["seq"], pending["op"], str(pending["sizes"]), str(pending["dtypes"])), pending["pg"])


def _group_table(dumps: list[RankDump], beats: dict[int, dict[str, Any]], members: dict[str, list[int]]) -> Table:
    table = Table("diagnose_groups", ["group", "desc", "ranks", "issued", "completed"],
                  title="Every process group: the collectives each of its ranks issued and completed")
    descs = {e["process_group"][0]: e["process_group"][1] for d in dumps for e in d.entries}
    descs.update({name: g.desc for d in dumps for name, g in d.groups.items() if g.desc})
    for pg in sorted(members, key=lambda g: (g != "0", g)):
        ranks = members[pg]
        issued = {r: beats[r]["groups"].get(pg, [0, 0])[0] for r in ranks if r in beats}
        done = {r: beats[r]["groups"].get(pg, [0, 0])[1] for r in ranks if r in beats}
        absent = [r for r in ranks if r not in beats]
        table.add(group=pg, desc=descs.get(pg, ""), ranks=spans(ranks), issued=_spread(issued), completed=_spread(done)
                  + (f" at most (ranks {spans(absent)} left no dump)" if absent else ""))
    return table


def _spread(values: dict[int, int]) -> str:
    """"12 on every rank with a dump" or "12: ranks 0-1; 11: ranks 2"."""
    by_value: dict[int, list[int]] = collections.defaultdict(list)
    for r, v in sorted(values.items()):
        by_value[v].append(r)
    if len(by_value) == 1:
        return f"{next(iter(by_value))} on every rank with a dump"
    return "; ".join(f"{v}: ranks {spans(rs)}" for v, rs in sorted(by_value.items(), reverse=True))
