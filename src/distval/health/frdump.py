"""Flight Recorder dumps as PyTorch writes them, read without running any code.

A process group with the recorder on (TORCH_FR_BUFFER_SIZE, or TORCH_NCCL_TRACE_BUFFER_SIZE)
keeps its last collectives in a ring buffer. Each rank's buffer reaches a file three ways: NCCL's
watchdog on a timeout (TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE + the rank: a
pickle), a script's own `torch._C._distributed_c10d._dump_fr_trace()` (the same pickle) or
`_dump_fr_trace_json()` (the same document as JSON). One document per rank:

    version     the recorder's format, "2.x"
    pg_config   {group name: {"name", "desc", "ranks": "[0, 1]"}}: the groups this rank is in
                (a Gloo dump has one, named '', whose ranks are the default group's, or "[]")
    pg_status   {the group's id in this process: {"last_enqueued_collective",
                 "last_started_collective", "last_completed_collective"}}
    entries     the buffer, oldest first: {"record_id", "pg_id", "process_group": (name, desc),
                 "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name" ("gloo:all_reduce"),
                 "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state",
                 "retired", "is_p2p", "time_created_ns", "timeout_ms",
                 "frames": [{"name", "filename", "line"}] (innermost first), ...}

A group's name ("1") is the same on every rank; its id (`pg_id`) counts the groups this process
is in, so the id of one group differs between ranks of a mesh: status is re-keyed by name
through the entries. The default group is "0" in the entries and '' in a Gloo dump's pg_config.
On Gloo the recorder's completion is not evidence: a collective that timed out is counted
completed, and one that completed is marked only when its work is next looked at.

"""

from __future__ import annotations

import ast
import functools
import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TRAILING_RANK = re.compile(r"(\d+)(\.(json|pickle|pkl))?$")


class DumpError(ValueError):
    """A file or folder that cannot be read as a job's dumps: one line, exit 2."""

    def __init__(self, path: Path | str, message: str):
        super().__init__(f"{path}: {message}")


class _PlainData(pickle.Unpickler):
    """An unpickler that admits no class and no callable: every global a pickle names is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module}.{name}, and a Flight Recorder dump holds plain data only "
                                     "(refused: loading it could run code)")


@dataclass
class Group:
    name: str
    desc: str
    ranks: list[int]


@dataclass
class RankDump:
    rank: int
    path: Path
    version: str
    backend: str  # "gloo", "nccl", ... (the entries' profiling names), "" without entries
    groups: dict[str, Group]  # by name: the groups pg_config lists (ranks [] where it does not say)
    status: dict[str, tuple[int, int]]  # by group name: (last enqueued, last completed) collective
    entries: list[dict[str, Any]] = field(default_factory=list)


def load(path: Path) -> dict[str, Any]:
    """One dump file's document (pickle or JSON); DumpError if it is neither, is cut short or is
    not a Flight Recorder dump."""
    data = path.read_bytes()
    if data[:1] == b"\x80":
        try:
            doc = _PlainData(io.BytesIO(data)).load()
        except pickle.UnpicklingError as e:
            raise DumpError(path, f"not a Flight Recorder dump: {e}") from None
        except (EOFError, ValueError, IndexError, KeyError, TypeError, MemoryError, OverflowError) as e:
            raise DumpError(path, f"a truncated or damaged pickle ({type(e).__name__}: {e}); "
                            "copy the dump again or leave it out") from None
    else:
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DumpError(path, f"neither a pickle nor JSON ({e})") from None
    if not isinstance(doc, dict) or "entries" not in doc or "version" not in doc:
        raise DumpError(path, "not a Flight Recorder dump (no 'entries' and 'version')")
    return doc


def parse(path: Path, doc: dict[str, Any]) -> RankDump:
    """A dump's document as a RankDump (see the module's docstring for the names and ids)."""
    rank = doc.get("rank")
    if not isinstance(rank, int):
        m = _TRAILING_RANK.search(path.name)
        if m is None:
            raise DumpError(path, "no rank in the dump and none at the end of its name (PyTorch writes <prefix><rank>)")
        rank = int(m.group(1))
    try:
        entries = [e for e in doc.get("entries") or [] if isinstance(e, dict)]
        names = {str(e["pg_id"]): str(e["process_group"][0]) for e in entries if "pg_id" in e}
        groups = {}
        for key, g in (doc.get("pg_config") or {}).items():
            name = str(g.get("name", key)) or "0"  # the default group: '' in a Gloo dump's pg_config
            groups[name] = Group(name, str(g.get("desc", "")), _ranks(g.get("ranks", [])))
        status = {names[key]: (int(s["last_enqueued_collective"]), int(s["last_completed_collective"]))
                  for key, s in (doc.get("pg_status") or {}).items() if key in names}
        backend = next((str(e.get("profiling_name", "")).partition(":")[0] for e in entries), "")
    except (KeyError, TypeError, ValueError, SyntaxError, IndexError, AttributeError) as e:
        raise DumpError(path, f"not a Flight Recorder dump this version of distval reads ({type(e).__name__}: {e})"
                        ) from None
    return RankDump(rank, path, str(doc.get("version", "")), backend, groups, status, entries)


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted(int(r) for r in json.loads(text)))
    except ValueError:  # not JSON: Python's own list syntax
        return tuple(sorted(int(r) for r in ast.literal_eval(text)))


def _ranks(value: Any) -> list[int]:
    """A group's ranks as pg_config writes them ("[0, 1, 2]"), parsed once per distinct text: the
    same list is in every rank's dump."""
    return list(_parsed(value)) if isinstance(value, str) else sorted(int(r) for r in value)


def candidates(folder: Path) -> list[Path]:
    """The files under `folder` that may be dumps: every file but hidden ones, logs and text."""
    if folder.is_file():
        return [folder]
    return sorted(f for f in folder.rglob("*") if f.is_file() and not f.name.startswith(".")
                  and not f.name.endswith((".log", ".txt", ".md", ".out", ".err")))


def find(folder: Path) -> list[Path]:
    """`candidates`, at least one: DumpError for a folder with none."""
    if not folder.exists():
        raise DumpError(folder, "no such file or folder")
    files = candidates(folder)
    if not files and any(folder.rglob("fr_trace_*.txt")):
        raise DumpError(folder, "these are torch.distributed.debug's periodic fr_trace tables (its analyzer's "
                        "output, not the ranks' dumps) without its stacks files; point diagnose at the ranks' own "
                        "dumps (TORCH_FR_DUMP_TEMP_FILE, or each rank's /fr_trace_json)")
    if not files:
        raise DumpError(folder, "no Flight Recorder dumps here (PyTorch writes them where TORCH_FR_DUMP_TEMP_FILE "
                        "points, one file per rank)")
    return files


def read(paths: list[Path]) -> list[RankDump]:
    """Every rank's dump under `paths` (folders or files), by rank; DumpError for a file that is
    not a dump, two dumps of one rank, or dumps of different jobs (groups that disagree)."""
    dumps: dict[int, RankDump] = {}
    for path in [f for p in paths for f in find(p)]:
        d = parse(path, load(path))
        if d.rank in dumps:
            raise DumpError(path, f"a second dump of rank {d.rank} (the first: {dumps[d.rank].path}); "
                            "diagnose one job's dumps from one moment at a time")
        dumps[d.rank] = d
    _one_job(list(dumps.values()))
    return [dumps[r] for r in sorted(dumps)]


def _one_job(dumps: list[RankDump]) -> None:
    seen: dict[str, tuple[list[int], RankDump]] = {}
    for d in dumps:
        for name, g in d.groups.items():
            if not g.ranks:  # a Gloo dump's sub-group: its ranks are not recorded
                continue
            if name in seen and seen[name][0] != g.ranks:
                other = seen[name][1]
                raise DumpError(d.path, f"these dumps are not of one job: group {name!r} has ranks {g.ranks} here "
                                f"and {other.groups[name].ranks} in {other.path.name}")
            seen.setdefault(name, (g.ranks, d))
        if any(g.ranks for g in d.groups.values()) and not any(d.rank in g.ranks for g in d.groups.values()):
            raise DumpError(d.path, f"rank {d.rank} (from the file's name) is in none of its own groups: "
                            "name the dumps <prefix><rank>, as PyTorch does")
    world = seen.get("0")  # the default group's ranks, where a dump lists them: every rank of the job
    strangers = [d for d in dumps if world and d.rank not in world[0]]
    if strangers:
        raise DumpError(strangers[0].path, f"these dumps are not of one job: rank {strangers[0].rank}, but the default "
                        f"group of {world[1].path.name} has ranks {world[0]}")
    versions = {d.version for d in dumps}
    if len(versions) > 1:
        raise DumpError(dumps[0].path.parent, f"these dumps are not of one job: recorder versions {sorted(versions)}")
