"""Link rates and latencies as `tc` writes them (tc(8), "PARAMETERS"), and CPU limits in cores.

Rates: `bit`, `kbit`, `mbit`, `gbit`, `tbit` are bits per second, `bps`, `kbps`, `mbps`, `gbps`,
`tbps` are *bytes* per second (tc's meaning: `1gbps` is 8 Gbit/s), SI prefixes are powers of
1000 and IEC ones (`kibit`, `mibps`, ...) powers of 1024; case is ignored, as tc ignores it.
tc reads a bare number as bit/s and a bare time as µs; here a unit is required, because
`--rate 1000` or `--latency 5` is more often a mistake than a wish.

`--rate` and `--cpu` take one value for every node or a comma list with one value per node
(`1gbit,1gbit,250mbit,1gbit`): a cluster with one slow link or one slow node. The parsers return
a tuple of what was given; `netns.Topology` checks its length against `--nodes`.
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


def parse_rates(text: str, flag: str = "--rate") -> tuple[int, ...]:
    """'1gbit' -> (10**9,); '1gbit,250mbit' -> (10**9, 250 * 10**6), node i's rate at index i."""
    return tuple(parse_rate(part, flag) for part in _split(text, flag))


# CFS enforces a quota per period; the kernel refuses quotas under 1 ms (1000 us), so with the
# default 100 ms period the smallest limit is 0.01 core
MIN_CPU_CORES = 0.01


def parse_cpus(text: str, host_cores: int, flag: str = "--cpu") -> tuple[float, ...]:
    """'1' -> (1.0,); '1,1,0.25,1' -> one CPU limit in cores per node. A limit above the host's
    cores would be no limit at all, which is more likely a mistake than a wish."""
    cores = []
    for part in _split(text, flag):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{flag} {part!r} is not a number of cores; give e.g. 1 or 0.25 "
                             f"(one for all nodes or a comma list, one per node)") from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{flag} {part!r} must be a positive number of cores, e.g. 0.5")
        if value < MIN_CPU_CORES:
            raise ValueError(f"{flag} {part!r} is below {MIN_CPU_CORES} core, the smallest CFS quota "
                             f"(1 ms per 100 ms period)")
        if value > host_cores:
            raise ValueError(f"{flag} {part!r} is more cores than this host has ({host_cores})")
        cores.append(value)
    return tuple(cores)


def _split(text: str, flag: str) -> list[str]:
    parts = [part.strip() for part in str(text).split(",")]
    if any(not part for part in parts):
        raise ValueError(f"{flag} {text!r} has an empty entry; give one value for all nodes or one per node, "
                         f"separated by commas")
    return parts


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
