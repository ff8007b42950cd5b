"""Link rates and latencies as `tc` writes them (tc(8), "PARAMETERS").

Rates: `bit`, `kbit`, `mbit`, `gbit`, `tbit` are bits per second, `bps`, `kbps`, `mbps`, `gbps`,
`tbps` are *bytes* per second (tc's meaning: `1gbps` is 8 Gbit/s), SI prefixes are powers of
1000 and IEC ones (`kibit`, `mibps`, ...) powers of 1024; case is ignored, as tc ignores it.
tc reads a bare number as bit/s and a bare time as µs; here a unit is required, because
`--rate 1000` or `--latency 5` is more often a mistake than a wish.
"""

from __future__ import annotations

import math
import re

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_RATE = re.compile(rf"^\s*({_NUMBER})\s*([kmgt]i?)?(bit|bps)\s*$", re.IGNORECASE)
_TIME = re.compile(rf"^\s*({_NUMBER})\s*(s|sec|secs|ms|msec|msecs|us|usec|usecs|µs)\s*$", re.IGNORECASE)
_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_TIME_UNIT = {"s": 1.0, "sec": 1.0, "secs": 1.0, "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3,
              "us": 1e-6, "usec": 1e-6, "usecs": 1e-6, "µs": 1e-6}


def parse_rate(text: str, flag: str = "--rate") -> int:
    """'1gbit' -> 1_000_000_000 bit/s; '100mbps' -> 800_000_000; '1kibit' -> 1024."""
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(f"{flag} {text!r} is not a tc rate; use a number and a unit: bit, kbit, mbit, gbit "
                         f"(bits/s) or bps, kbps, mbps, gbps (bytes/s), e.g. 1gbit")
    value = float(m.group(1)) * _PREFIX[(m.group(2) or "").lower()] * (8 if m.group(3).lower() == "bps" else 1)
    if not math.isfinite(value) or value < 8:
        raise ValueError(f"{flag} {text!r} is below 8 bit/s; give a positive rate such as 1gbit")
    if value > 1e12:
        raise ValueError(
            f"{flag} {text!r} is above 1 Tbit/s, faster than a veth pair can carry; emulate up to a few gbit"
        )
    return int(round(value))


def parse_latency(text: str, flag: str = "--latency") -> float:
    """'0.2ms' -> 0.0002 s; '0' is accepted as no added latency."""
    if str(text).strip() == "0":
        return 0.0
    m = _TIME.match(str(text))
    if not m:
        raise ValueError(f"{flag} {text!r} is not a tc time; use a number and a unit: us, ms or s, e.g. 0.2ms")
    value = float(m.group(1)) * _TIME_UNIT[m.group(2).lower()]
    if not math.isfinite(value) or value > 10:
        raise ValueError(f"{flag} {text!r} is more than 10 s; give a one-way delay such as 0.2ms")
    return value


def format_rate(bits_per_s: float) -> str:
    """1e9 -> '1gbit' (tc's spelling, exact when the rate is a whole number of a unit)."""
    for unit, mult in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits_per_s >= mult:
            value = bits_per_s / mult
            return f"{value:g}{unit}" if value == round(value, 3) else f"{value:.3f}{unit}"
    return f"{bits_per_s:g}bit"


def format_latency(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds >= 1:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds * 1e6:g}us"
