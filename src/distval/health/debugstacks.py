"""The stacks torch.distributed.debug's periodic dumper writes, read as a hang verdict.

`torch.distributed.debug.start_debug_server(dump_dir=D, dump_interval=S)` has rank 0 fetch every
rank's Python stacks (faulthandler's text, served by each rank's worker server) every S seconds
and write them all to `D/stacks_<YYYYmmdd_HHMMSS>.txt`:

    PARTIAL DATA: 2/3 workers responded                 (only when some did not)
      Rank 2: TimeoutError:

    === Rank 0: http://host:port/handler/dump_traceback? ===
    Current thread 0x... (most recent call first):       the worker server's own thread
      <no Python frame>

    Thread 0x... (most recent call first):               the rank's main thread, innermost first
      File "/.../torch/distributed/distributed_c10d.py", line 3252 in all_reduce
      File "/.../train.py", line 33 in <module>

    === Rank 2: http://host:port/handler/dump_traceback? ===
    Error: 408                                           a rank that did not answer

The folder's other files are not the ranks' evidence: `fr_trace_<time>.txt` is PyTorch's
analyzer's tables over the NCCL recorder (on Gloo the dumper writes none), the rest other
handlers' text. The stacks say where each rank's main thread was: waiting in a collective (which
op, called from which line of the user's code) or outside any; a rank that did not answer could
not run Python (stopped, dead, or hung in native code). Without the recorder's sequence numbers
they give the live watchdog's verdicts where the stacks alone decide (health/hang.py's words and
hints): ranks outside any collective while others wait in one are the culprits ("outside"); ranks
waiting in different collectives are a "mismatch"; ranks that did not answer while the others
wait are the ones they wait for. Ranks all in the same collective are not judged: which one is
behind is in the Flight Recorder's dumps (TORCH_FR_DUMP_TEMP_FILE), not in a stack.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from pathlib import Path

from distval.health import ranks_text, spans
from distval.health.frdump import DumpError
from distval.health.hang import HINTS
from distval.health.pauses import user_place
from distval.health.procs import script_thread
from distval.results import Check, Report, Status, Table

_RANK = re.compile(r"^=== Rank (\d+): (.*) ===$")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_TIME = re.compile(r"stacks_(\d{8}_\d{6})\.txt$")
_C10D = "torch/distributed/distributed_c10d.py"
_BACKWARD = "torch/autograd/"
NO_ANSWER_HINT = ("a rank that does not answer cannot run Python: its process is stopped, dead, or hung in native "
                  "code; look at it on its host (py-spy dump --native --pid, its state in /proc, dmesg for the OOM "
                  "killer)")


@dataclass(frozen=True)
class RankStack:
    """One rank in one stacks file: its main thread's frames ("fn (file:line)", innermost first),
    or none when it did not answer."""

    rank: int
    frames: tuple[str, ...] = ()
    answered: bool = True

    @property
    def op(self) -> str | None:
        """The collective the main thread waits in (the outermost frame in torch's c10d, the API
        the user called), "backward" inside autograd (DDP's and FSDP's collectives), else None."""
        ops = [f for f in self.frames if _C10D in f]
        if ops:
            return ops[-1].rpartition(" (")[0]
        return "backward" if any(_BACKWARD in f for f in self.frames) else None

    @property
    def state(self) -> str:
        if not self.answered:
            return "did not answer"
        return f"waits in {self.op}" if self.op else "outside any collective"

    @property
    def where(self) -> str:
        return user_place(list(self.frames)) or (self.frames[0] if self.frames else "")


def files(paths: list[Path]) -> list[Path]:
    """The stacks files among `paths` and under them (folders of torch.distributed.debug's dumps),
    oldest first."""
    found = [f for p in paths for f in (p.rglob("stacks_*.txt") if p.is_dir() else [p] if p.is_file() else [])
             if _TIME.search(f.name)]
    return sorted(found, key=lambda f: _TIME.search(f.name).group(1))  # type: ignore[union-attr]


def parse(text: str) -> dict[int, RankStack]:
    """Every rank of one stacks file, by rank."""
    ranks: dict[int, RankStack] = {}
    rank: int | None = None
    threads: list[tuple[bool, list[str]]] = []

    def close() -> None:
        if rank is not None:
            ranks[rank] = _main(rank, threads)

    for line in text.splitlines():
        if m := _RANK.match(line):
            close()
            rank, threads = int(m.group(1)), []
        elif rank is None:
            continue
        elif m := _THREAD.match(line):
            threads.append((m.group(1) == "Current thread", []))
        elif (m := _FRAME.match(line)) and threads:
            threads[-1][1].append(f"{m.group(3)} ({m.group(1)}:{m.group(2)})")
    close()
    return ranks


def _main(rank: int, threads: list[tuple[bool, list[str]]]) -> RankStack:
    """The rank's main thread: the one whose outermost frame is the script's `<module>`, else the
    deepest other than the thread that answered (the worker server's); none when none answered."""
    if not threads:
        return RankStack(rank, answered=False)
    others = [frames for current, frames in threads if not current and frames] or [f for _, f in threads]
    return RankStack(rank, tuple(script_thread(others) or max(others, key=len)))


def verdict(stacks: dict[int, RankStack]) -> tuple[list[int], str, str]:
    """(culprits, kind, one line) from one stacks file; kind "none" when the stacks do not decide."""
    waiting = {r: s for r, s in stacks.items() if s.answered and s.op}
    outside = sorted(r for r, s in stacks.items() if s.answered and not s.op)
    silent = sorted(r for r, s in stacks.items() if not s.answered)
    ops = collections.Counter(s.op for s in waiting.values())
    if waiting and outside:
        sites = _by(stacks, outside, "where")
        where = f" at {sites[0][0]}" if len(sites) == 1 else " (" + "; ".join(
            f"{ranks_text(rs)} at {w}" for w, rs in sites) + ")"
        return outside, "outside", (f"{ranks_text(outside)} {'is' if len(outside) == 1 else 'are'} outside any "
                                    f"collective{where} while "
                                    f"{_waits(stacks, sorted(waiting))}")
    if len(ops) > 1:
        common = ops.most_common(1)[0][0]
        odd = sorted(r for r, s in waiting.items() if s.op != common)
        return odd, "mismatch", (f"{_waits(stacks, odd)}, while "
                                 f"{_waits(stacks, sorted(r for r in waiting if r not in odd))}")
    if waiting and silent:
        return silent, "outside", (f"{_waits(stacks, sorted(waiting))}; {ranks_text(silent)} did not answer the "
                                   "dumper: the one they wait for (stopped, dead, or hung in native code)")
    if waiting:
        return [], "none", (f"{_waits(stacks, sorted(waiting))}: the stacks cannot say which rank is behind (the "
                            "Flight Recorder's dumps can: TORCH_FR_DUMP_TEMP_FILE)")
    if not outside:
        return [], "none", f"no rank answered the dumper ({ranks_text(silent)}): the stacks say nothing"
    return [], "none", ("no rank waits in a collective: the job was running when the stacks were taken"
                        + (f"; {ranks_text(silent)} did not answer" if silent else ""))


def _by(stacks: dict[int, RankStack], ranks: list[int], attr: str) -> list[tuple[str, list[int]]]:
    groups: dict[str, list[int]] = collections.defaultdict(list)
    for r in ranks:
        groups[getattr(stacks[r], attr)].append(r)
    return sorted(groups.items(), key=lambda kv: kv[1][0])


def _waits(stacks: dict[int, RankStack], ranks: list[int]) -> str:
    """"ranks 0, 2 wait in all_reduce at <module> (train.py:33)": by op, with their call sites."""
    parts = []
    for op, rs in _by(stacks, ranks, "op"):
        sites = sorted({stacks[r].where for r in rs} - {""})
        verb = "waits" if len(rs) == 1 else "wait"
        parts.append(f"{ranks_text(rs)} {verb} in {op}" + (f" at {', '.join(sites)}" if sites else ""))
    return "; ".join(parts)


def diagnose(stack_files: list[Path], inputs: list[Path]) -> Report:
    """The report of `distval diagnose` over torch.distributed.debug's dump folders: the verdict
    from the newest stacks file, how many dumps before it agree, and every rank's place."""
    taken = [(f, parse(f.read_text(errors="replace"))) for f in stack_files]
    taken = [(f, s) for f, s in taken if s]
    if not taken:
        raise DumpError(stack_files[-1], "no rank's stacks in torch.distributed.debug's stacks files")
    newest, stacks = taken[-1]
    culprits, kind, text = verdict(stacks)
    held = 1
    while held < len(taken) and verdict(taken[-1 - held][1])[:2] == (culprits, kind):
        held += 1
    silent = sorted(r for r, s in stacks.items() if not s.answered)
    report = Report("diagnose", meta={"inputs": [str(p) for p in inputs], "source": "torch.distributed.debug stacks",
                                      "world_size": len(stacks), "stacks_files": len(taken), "newest": str(newest),
                                      "ranks_without": silent})
    report.add(Check("diagnose dumps", Status.WARN if silent else Status.OK,
                     f"{len(taken)} stacks file(s) of torch.distributed.debug read, {len(stacks)} ranks in the newest"
                     + (f"; {ranks_text(silent)} did not answer" if silent else ""),
                     details={"newest": str(newest)}, hint=NO_ANSWER_HINT if silent else ""))
    since = f" (the same in the last {held} of {len(taken)} stacks files)" if held > 1 else ""
    details = {"hang": kind, "culprits": culprits, "held_files": held,
               "stacks": {str(r): "\n".join(s.frames) for r, s in stacks.items() if s.frames}}
    if kind == "none":
        report.add(Check("diagnose verdict", Status.WARN if silent or any(s.op for s in stacks.values()) else Status.OK,
                         text + since, details))
    else:
        report.add(Check("diagnose verdict", Status.FAIL, text + since, details,
                         NO_ANSWER_HINT if set(culprits) <= set(silent) else HINTS[kind], where={"rank": culprits[0]}))
    table = Table("diagnose_ranks", ["ranks", "culprit", "state", "where"],
                  title="The ranks in the newest stacks file: what their main thread was doing, and the line of "
                        "their own code it was at")
    rows: dict[tuple, list[int]] = collections.defaultdict(list)
    for r, s in sorted(stacks.items()):
        rows[(r in culprits, s.state, s.where or None)].append(r)
    for (culprit, state, where), ranks in sorted(rows.items(), key=lambda kv: kv[1][0]):
        table.add(ranks=spans(ranks), culprit=culprit, state=state, where=where)
    report.tables.append(table)
    return report
