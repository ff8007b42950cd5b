"""The readable terminal view of a Report (rich): a header, the checks that need attention one
per row, the rest counted per group, then the tables (each by its view in report/views.py, else
as a plain grid)."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from distval.meta import stack_text
from distval.report.grid import render_table
from distval.report.views import VIEWS
from distval.results import Check, Report, Status

STYLES = {
    Status.OK: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.SKIP: "dim",
    Status.ERROR: "bold magenta",
}
_ATTENTION = (Status.ERROR, Status.FAIL, Status.WARN)


def status_text(status: Status) -> Text:
    return Text(status.value, style=STYLES[status])


def header(report: Report) -> str:
    m = report.meta
    parts = [f"distval {report.command}"]
    if "world_size" in m:
        parts.append(f"{m['world_size']} ranks")
    if "backend" in m:
        versions = m.get("versions") or {}
        stack = f" ({stack_text(versions)})" if m["backend"] == "nccl" and versions.get("nccl") else ""
        parts.append(f"backend {m['backend']}{stack}")  # "backend nccl (RCCL 2.20.5, ROCm 6.2)" on ROCm
    if m.get("hosts"):
        parts.append("hosts " + ", ".join(m["hosts"]))
    if m.get("launch"):
        parts.append(f"launched {m['launch']}")
    return " · ".join(parts)


def group_key(check: Check) -> str:
    """Checks counted together when all is well: the name up to its op (e.g. 'comm.check all_reduce/sum')."""
    return " ".join(check.name.split()[:2])


def render(report: Report, console: Console | None = None) -> None:
    console = console or Console()
    console.print(Text(header(report), style="bold"))
    attention = [c for c in report.checks if c.status in _ATTENTION]
    if attention:
        t = RichTable(show_header=True, header_style="bold", expand=False)
        for col in ("status", "check", "what happened", "hint"):
            t.add_column(col, overflow="fold")
        for c in sorted(attention, key=lambda c: _ATTENTION.index(c.status)):
            t.add_row(status_text(c.status), Text(c.name), Text(c.summary), Text(c.hint))
        console.print(t)
    rest = [c for c in report.checks if c.status not in _ATTENTION]
    if rest:
        groups: dict[str, list[Check]] = {}
        for c in rest:
            groups.setdefault(group_key(c), []).append(c)
        t = RichTable(show_header=True, header_style="bold", expand=False)
        t.add_column("checks")
        t.add_column("result")
        for key, members in groups.items():
            counts = Counter(c.status for c in members)
            text = Text()
            for status in (Status.OK, Status.SKIP):
                if counts[status]:
                    text.append(f"{counts[status]} {status.value} ", style=STYLES[status])
            if len(members) == 1:
                text.append(members[0].summary)
            t.add_row(Text(key), text)
        console.print(t)
    for table in report.tables:
        if table.rows:
            view = VIEWS.get(table.name)
            out = view(table, report.meta) if view else render_table(table)
            if isinstance(out, str):  # preformatted text (nccl-tests columns): as is, never wrapped
                console.print(Text(out), soft_wrap=True)
            else:
                console.print(out)
    counts = report.counts()
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    console.print(Text(f"{summary or 'no checks'} -> exit {report.exit_code()}", style="bold"))
