"""The one result model every command produces: checks and tables inside a Report.

A Check is a verdict a person can act on: a status, a one-line summary, the details a script
needs, a hint and *where* (rank, op, size...). A Table is rows of plain values with named columns
(the bench sweep, the α–β fits). A Report bundles them with meta (versions, backend, world size,
hosts) and serialises to the versioned JSON schema documented in docs/report-schema.md.
"""

from __future__ import annotations

import enum
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "distval.report/1"


class Status(str, enum.Enum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"
    ERROR = "ERROR"


# Exit codes (docs/report-schema.md): 0 all OK/WARN/SKIP, 1 a FAIL, 2 bad usage or input, 3 could not run.
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_CANNOT_RUN = 0, 1, 2, 3


class CannotRun(RuntimeError):
    """The environment stopped us (a rank died, hung, or a backend is missing): exit code 3."""


@dataclass
class Check:
    name: str
    status: Status
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    hint: str = ""
    where: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "details": self.details,
            "hint": self.hint,
            "where": self.where,
        }


@dataclass
class Table:
    name: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""
    units: dict[str, str] = field(default_factory=dict)

    def add(self, **row: Any) -> None:
        unknown = set(row) - set(self.columns)
        assert not unknown, f"table {self.name}: unknown columns {sorted(unknown)}"
        self.rows.append({c: row.get(c) for c in self.columns})

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "columns": self.columns,
            "units": self.units,
            "rows": self.rows,
        }


@dataclass
class Report:
    command: str
    meta: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def table(self, name: str) -> Table | None:
        return next((t for t in self.tables if t.name == name), None)

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Status}
        for c in self.checks:
            out[c.status.value] += 1
        return out

    def exit_code(self) -> int:
        statuses = {c.status for c in self.checks}
        if Status.ERROR in statuses:
            return EXIT_CANNOT_RUN
        if Status.FAIL in statuses:
            return EXIT_FAIL
        return EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": self.command,
            "meta": self.meta,
            "summary": self.counts(),
            "checks": [c.to_dict() for c in self.checks],
            "tables": {t.name: t.to_dict() for t in self.tables},
        }


def atomic_write_text(path: str | os.PathLike, text: str, fsync: bool = True) -> None:
    """Write through a temporary file in the same directory, fsync, then rename over `path`,
    so a reader never sees a half-written file and a crash leaves the old file (or none)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_safe(obj: Any) -> Any:
    """Non-finite floats become strings ('nan', 'inf'), so the file is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_json(report: Report, path: str | os.PathLike) -> None:
    text = json.dumps(json_safe(report.to_dict()), indent=2, default=str, allow_nan=False)
    atomic_write_text(path, text + "\n")


def check_writable(path: str | os.PathLike, what: str = "output path") -> Path:
    """Reject an output file we could not write *before* any work is done (exit 2, nothing
    written); its missing folder is created. The file itself is not created."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ValueError(f"{what} {str(p)!r} is a directory; give a file name")
    if not parent.is_dir():
        output_dir(parent, what)
    if (error := _unwritable(parent)) is not None:
        raise ValueError(f"{what} {str(p)!r}: directory {str(parent)!r} is not writable ({error})")
    return p


def output_dir(path: str | os.PathLike, flag: str) -> Path:
    """An output folder (`--out`, `--ckpt-dir`, the folder of a `--json` file): created with
    its parents when missing (said on stderr), then probed, before any work is done (exit 2 with
    the reason otherwise)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {str(p)!r} exists and is not a directory")
    if not p.exists():
        try:
            p.mkdir(parents=True)
            print(f"distval: created {p} ({flag})", file=sys.stderr)
        except FileExistsError:  # made meanwhile: another node's process on a shared file system
            if not p.is_dir():
                raise ValueError(f"{flag} {str(p)!r} exists and is not a directory") from None
        except OSError as e:
            raise ValueError(f"{flag} {str(p)!r} cannot be created ({e.strerror})") from None
    if (error := _unwritable(p)) is not None:
        raise ValueError(f"{flag} {str(p)!r} is not writable ({error})")
    return p


def _unwritable(directory: Path) -> str | None:
    """Why nothing can be written in `directory`, or None. Probed by creating (and removing) a
    scratch file: os.access() says yes to root even on a read-only file system."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".distval-probe.", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return e.strerror or str(e)
    return None


@dataclass
class JobResult:
    """What rank 0 gathered: every rank's return value and facts about it, in rank order."""

    mode: str
    backend: str
    world_size: int
    results: list[Any]
    ranks: list[dict[str, Any]]

    @property
    def hosts(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for info in self.ranks:
            out.setdefault(info["host"], []).append(info["rank"])
        return out
