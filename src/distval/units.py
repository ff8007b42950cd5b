"""Sizes and durations as people type them: nccl-tests' binary K/M/G for bytes, s/ms for time."""

from __future__ import annotations

import re

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
