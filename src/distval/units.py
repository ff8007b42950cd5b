"""Sizes and durations as people type them (nccl-tests' binary K/M/G for bytes, s/ms for time) and
as people read them (453.4 MiB, 14.8 ms: the terminal's tables, report/terminal.py)."""

from __future__ import annotations

import math
import re
from typing import Callable

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_MULT = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str, what: str = "size") -> int:
    """'8' -> 8, '1K' -> 1024, '128M' / '128MiB' / '128MB' -> 134217728 (binary, as nccl-tests)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(
            f"{what} {text!r} does not parse as a size; use bytes with an optional K, M or G suffix, e.g. 8, 1K, 128M"
        )
    value = float(m.group(1)) * _MULT[m.group(2).lower()]
    if value != int(value):
        raise ValueError(f"{what} {text!r} is not a whole number of bytes")
    return int(value)


def format_size(n: float) -> str:
    for unit, mult in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= mult and n % mult == 0:
            return f"{int(n // mult)}{unit}"
    return f"{int(n)}" if float(n).is_integer() else f"{n:.0f}"


def parse_duration(text: str, what: str = "duration") -> float:
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min)?\s*$", str(text))
    if not m:
        raise ValueError(f"{what} {text!r} does not parse; use seconds, e.g. 30, 30s, 500ms, 2m")
    value = float(m.group(1))
    return value * {"ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0}[m.group(2)]


# -- as people read them: the terminal's tables (the JSON keeps bytes and seconds) ---------------

_BYTE_UNITS = (("B", 1.0), ("KiB", 2.0**10), ("MiB", 2.0**20), ("GiB", 2.0**30), ("TiB", 2.0**40))
_SECOND_UNITS = (("µs", 1e-6), ("ms", 1e-3), ("s", 1.0))


def format_bytes(n: float | None) -> str:
    """0 -> '0 B', 1023 -> '1023 B', 1024 -> '1.00 KiB', 475394048 -> '453.4 MiB', 1.5 GiB -> '1.50 GiB'
    (binary; two decimals under 10, one above: a leak of 0.1 MiB per step still shows)."""
    return _scaled(n, _BYTE_UNITS, lambda v, unit: 0 if unit == "B" else 2 if v < 10 else 1)


def format_seconds(s: float | None) -> str:
    """0.0148 -> '14.8 ms', 1.25 -> '1.25 s', 3.7e-5 -> '37 µs', 3600 -> '3600 s': three significant
    digits, whole microseconds from 10 µs (finer is below the timers' resolution)."""
    return _scaled(s, _SECOND_UNITS, lambda v, unit: (0 if v >= 10 else 1) if unit == "µs" else
                   2 if v < 10 else 1 if v < 100 else 0)


def _scaled(value: float | None, units: tuple[tuple[str, float], ...], decimals: Callable[[float, str], int]) -> str:
    """`value` in the largest of `units` it reaches, the next one up when rounding reaches that;
    None (not applicable) -> '—', NaN -> 'nan', infinities as 'inf' and '-inf'."""
    if value is None:
        return "—"
    if not math.isfinite(value):
        return str(float(value))
    if value == 0:
        return "0 " + next(unit for unit, mult in units if mult == 1)
    sign, v = ("-" if value < 0 else ""), abs(value)
    i = max((k for k, (_, mult) in enumerate(units) if v >= mult), default=0)
    while True:
        unit, mult = units[i]
        text = f"{v / mult:.{decimals(v / mult, unit)}f}"
        text = f"{v / mult:.{decimals(float(text), unit)}f}"  # 99.96 s rounds to 100 s, not 100.0 s
        if i + 1 < len(units) and float(text) * mult >= units[i + 1][1]:
            i += 1  # 1023.96 KiB prints as 1.00 MiB, 999.7 ms as 1.00 s
            continue
        return f"{sign if float(text) else ''}{text} {unit}"


# A column's human unit, one rule for every terminal table: the unit the table declares for it
# (Table.units; its first word: 'B (S of one call)' is B), else its name (docs/report-schema.md:
# `bytes` and `*_bytes` are bytes, `*_s`, `*_ms`, `*_us` durations, `*_per_s` a rate). Any other
# declared unit (GB/s, tokens/s, %, MHz) and every other column print as they are.
_DECLARED = {
    **{name: (format_bytes, mult) for name, mult in _BYTE_UNITS},
    "KB": (format_bytes, 1e3), "MB": (format_bytes, 1e6), "GB": (format_bytes, 1e9),
    "s": (format_seconds, 1.0), "ms": (format_seconds, 1e-3), "us": (format_seconds, 1e-6),
    "µs": (format_seconds, 1e-6),
}
_SUFFIXES = (("_bytes", format_bytes, 1.0), ("_s", format_seconds, 1.0), ("_ms", format_seconds, 1e-3),
             ("_us", format_seconds, 1e-6))


def human_unit(column: str, declared: str | None = None) -> Callable[[float | None], str] | None:
    """The formatter of a column's values (a number in the column's unit -> '453.4 MiB', '14.8 ms'),
    or None for a column that prints as it is."""
    if declared:
        found = _DECLARED.get(declared.split()[0])
    elif column == "bytes":
        found = (format_bytes, 1.0)
    elif column.endswith("_per_s"):
        found = None
    else:
        found = next(((f, mult) for suffix, f, mult in _SUFFIXES if column.endswith(suffix)), None)
    if found is None:
        return None
    formatter, mult = found
    return lambda value: formatter(None if value is None else value * mult)
