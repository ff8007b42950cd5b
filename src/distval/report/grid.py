"""One report table as a plain terminal grid (rich): numbers formatted, bytes and durations in
human units. Below report/views.py (the views fall back on it) and report/terminal.py."""

from __future__ import annotations

from typing import Any

from rich.table import Table as RichTable
from rich.text import Text

from distval.results import Table
from distval.units import human_unit


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def render_table(table: Table) -> RichTable:
    """A plain grid; bytes and durations in human units (units.human_unit: the column's declared
    unit, else its name), the JSON keeping the numbers."""
    t = RichTable(title=Text(table.title or table.name), show_header=True, header_style="bold", expand=False)
    for col in table.columns:
        declared = table.units.get(col, "")
        # a value that says its unit leaves the header only a note: 'B (S of one call)' -> '(S of one call)'
        note = declared.partition(" ")[2] if human_unit(col, declared) else f"({declared})" if declared else ""
        t.add_column(f"{col}\n{note}" if note else col, justify="right" if _numeric(table, col) else "left")
    for row in table.rows:
        t.add_row(*(Text(_cell(table, row, c)) for c in table.columns))
    return t


def _cell(table: Table, row: dict[str, Any], col: str) -> str:
    value = row.get(col)
    if "unit" in table.columns and col in ("value", "unit"):  # rows of quantity, value, unit (plan's step)
        per_row = human_unit("value", row.get("unit") or "")
        if per_row is not None and _number(row.get("value")):
            return per_row(value) if col == "value" else ""  # '828 ms', its unit said in the value
    human = human_unit(col, table.units.get(col))
    return human(value) if human is not None and _number(value) else fmt(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numeric(table: Table, col: str) -> bool:
    vals = [r.get(col) for r in table.rows if r.get(col) is not None]
    return bool(vals) and all(_number(v) for v in vals)
