"""Calibration: the α and β that `distval comm bench --json` fitted on this fabric, per collective.

The bench report (docs/report-schema.md, schema `distval.report/1`, command `comm bench` or
`run`) carries table `alpha_beta` with one row per op: t(S) = α + S/β over nccl-tests' S, fitted
at `meta.world_size` ranks with `meta.backend`. `network.from_fit` turns a fit into a link (per-step
α, bus bandwidth B) so the plan reproduces the measured curve at the bench's world size and
extrapolates along the ring formula to others. Ops the plan needs but the bench did not fit are
*derived* from a fitted one (all_reduce first): same link, their own ring formula.

Scope: a bench whose ranks all ran on one host measured the intra-node path; one rank per host,
the inter-node network. A flat plan (`--world N`) uses the calibration for its one link whatever
the scope; a two-level plan uses it for the matching scope (inter when mixed or unknown).

The bench's dtype does not enter: α–β are per byte. (A Gloo reduction of bf16 on CPU is slower per
byte than of fp32; bench the dtype you will reduce in for the closest figure.)
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass

from distval.plan.network import PLAN_OPS, Link, from_fit
from distval.results import SCHEMA

# bench ops whose fit can stand for a plan op (all_gather_list moves the same bytes as all_gather)
_USABLE = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
           "all_gather_list": "all_gather"}


@dataclass(frozen=True)
class Fit:
    op: str
    alpha_s: float
    beta_bytes_per_s: float
    r2: float | None
    dtype: str | None


@dataclass(frozen=True)
class Calibration:
    path: str
    world_size: int
    backend: str
    scope: str  # "intra", "inter" or "unknown"
    fits: dict[str, Fit]  # plan op -> fit

    def links(self) -> dict[str, Link]:
        """One link per plan op: calibrated where the bench fitted it, derived otherwise."""
        out = {op: from_fit(op, f.alpha_s, f.beta_bytes_per_s, self.world_size, f"bench {f.op}", "calibrated")
               for op, f in self.fits.items()}
        donor = next(op for op in PLAN_OPS if op in self.fits)
        for op in PLAN_OPS:
            if op not in out:
                out[op] = Link(f"bench {donor}", out[donor].alpha_s, out[donor].bytes_per_s, "derived")
        return out

    def describe(self) -> str:
        parts = [
            f"{op} α {f.alpha_s * 1e6:.1f} µs β {f.beta_bytes_per_s / 1e9:.3g} GB/s" for op, f in self.fits.items()
        ]
        return (
            f"{os.path.basename(self.path)}: {self.backend}, {self.world_size} ranks, {self.scope}-node; "
            + "; ".join(parts)
        )


def load(path: str) -> Calibration:
    """Read and validate a bench report; ValueError (one line) for anything else."""
    try:
        stat = os.stat(path)
    except OSError as e:
        raise ValueError(f"--calibration {path}: {e.strerror}") from None
    return _load(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _load(path: str, _mtime_ns: int, _size: int) -> Calibration:
    flag = f"--calibration {path}"
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{flag} is not JSON ({e.msg} at line {e.lineno}); give the file `distval comm bench --json` wrote"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{flag} cannot be read ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("command") not in ("comm bench", "run"):
        got = (doc.get("schema"), doc.get("command")) if isinstance(doc, dict) else (type(doc).__name__, None)
        raise ValueError(f"{flag} is not a distval comm bench report (schema {got[0]!r}, command {got[1]!r}); "
                         f"write one with `distval comm bench --json FILE`")
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    world = meta.get("world_size")
    if not isinstance(world, int) or world < 2:
        raise ValueError(f"{flag}: meta.world_size is {world!r}; a calibration needs a bench of at least 2 ranks")
    fits = _fits(doc, flag)
    return Calibration(path, world, str(meta.get("backend", "unknown")), _scope(meta.get("hosts")), fits)


def _fits(doc: dict, flag: str) -> dict[str, Fit]:
    table = doc.get("tables", {}).get("alpha_beta") if isinstance(doc.get("tables"), dict) else None
    rows = table.get("rows") if isinstance(table, dict) else None
    if not isinstance(rows, list):
        raise ValueError(
            f"{flag} has no alpha_beta table; run `distval comm bench --ops all_reduce` with sizes up to a few MiB"
        )
    fits: dict[str, Fit] = {}
    for row in rows:
        op = _USABLE.get(row.get("op")) if isinstance(row, dict) else None
        if op is None or (op in fits and row.get("op") == "all_gather_list"):
            continue
        alpha_us, beta_gbps = row.get("alpha_us"), row.get("beta_gbps")
        if (
            not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (alpha_us, beta_gbps))
            or beta_gbps <= 0
            or alpha_us < 0
        ):
            raise ValueError(f"{flag}: the alpha_beta row of {row.get('op')} needs alpha_us >= 0 and beta_gbps > 0 "
                             f"(got {alpha_us!r}, {beta_gbps!r})")
        fits[op] = Fit(row["op"], alpha_us * 1e-6, beta_gbps * 1e9, row.get("r2"), row.get("dtype"))
    if not fits:
        raise ValueError(f"{flag} has no alpha-beta fit of all_reduce, all_gather or reduce_scatter; "
                         f"run `distval comm bench --ops all_reduce` with sizes up to a few MiB")
    return fits


def _scope(hosts) -> str:
    if not isinstance(hosts, dict) or not hosts:
        return "unknown"
    if len(hosts) == 1:
        return "intra"
    return "inter"
