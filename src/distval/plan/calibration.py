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

Step costs (optional table `step_costs`, written by `distval compare` and the ladder's compare stage
into the calibration file; docs/plan.md "Step costs"): per strategy, measured on one rank, what the
α–β fit and the FLOPs do not hold: the strategy's own cost per micro-batch (hooks, flattening,
DTensor; per unit: transformer block or root) and its optimizer step (per parameter updated), with
the plain model's MFU on forward and backward.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
from dataclasses import dataclass, field

from distval.comm.config import NORM
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


STEP_COST_COLUMNS = ["strategy", "plan_model", "model", "units", "num_params", "overhead_s", "optimizer_s",
                     "optimizer_per_param_s", "mfu", "peak_flops"]


@dataclass(frozen=True)
class StepCost:
    """One strategy's own costs, measured on one rank (world 1: its hooks and bookkeeping run, its
    collectives move nothing). `overhead_s`: its forward+backward per micro-batch less the plain
    model's, over `units` units (blocks + root); `optimizer_s`: its optimizer phase (gradient norm,
    clipping, update) over all `num_params` parameters, of which `optimizer_per_param_s` × parameters
    grows with the parameters (AdamW's rate on what the strategy's optimizer updates: one flat
    tensor for ZeRO's flat shards, the model's own tensors otherwise, less what a tensor costs
    whatever its size) and the rest is per tensor and call (fsdp2's DTensor dispatch), which
    sharding does not shrink; `mfu`: the plain model's MFU on forward and backward alone,
    of `peak_flops`."""

    strategy: str
    plan_model: str
    model: str
    units: int
    num_params: int
    overhead_s: float
    optimizer_s: float
    optimizer_per_param_s: float
    mfu: float
    peak_flops: float  # what `mfu` is a share of: the rank's measured matmul rate (or the GPU's peak)

    @property
    def overhead_per_unit_s(self) -> float:
        return self.overhead_s / self.units

    def optimizer_time(self, params: float) -> float:
        """The optimizer phase when this rank updates `params` parameters: the measured phase at
        `num_params`, its per-parameter part scaled. The rate is capped at the whole phase over its
        parameters: one flat tensor of a large model updates slower per parameter
        than the model's own tensors (small: 5.6 ns a parameter against 2.8 for the whole phase; likely
        AdamW's temporaries, each a fresh large allocation), and the part that grows with the
        parameters cannot exceed the phase it is part of."""
        per_param = min(self.optimizer_per_param_s, self.optimizer_s / self.num_params) if self.num_params else 0.0
        return self.optimizer_s - per_param * self.num_params + per_param * params


# which measured strategy stands for a plan model when several were measured: torch's own first
_PREFERRED = ("pytorch_ddp", "fsdp2", "pytorch_zero1")
ALL_OPS = "*"  # the call cost of an op the probe did not time: the mean over those it did


@dataclass(frozen=True)
class CallCost:
    """What one collective issued as training issues it costs beyond the α–β fit (`comm bench`'s
    table call_costs): (seconds of compute before it, seconds) points, and the figure back to back
    after another call. Per op it may be negative: where the sweep's α (each op timed after a
    barrier) is above what the op takes in training's rhythm, the fit is corrected, not only
    added to (a 3.4 ms all_reduce α in one bench of three, 0.4-0.6 in the others)."""
    after: tuple[tuple[float, float], ...] = ()
    back_to_back_s: float = 0.0

    def at(self, compute_s: float | None) -> float:
        """After `compute_s` of compute: from the back-to-back figure at none, linear through the
        measured compute times, flat beyond the last (the cost is a wait for a core, a scheduler
        slice at most: it does not grow without bound with the compute); None: back to back after
        another call."""
        if compute_s is None:
            return self.back_to_back_s
        points = ((0.0, self.back_to_back_s), *self.after)
        for (c0, y0), (c1, y1) in zip(points, points[1:]):
            if compute_s <= c1:
                return y1 if c1 <= c0 else y0 + (y1 - y0) * max(0.0, compute_s - c0) / (c1 - c0)
        return points[-1][1]

    def describe(self) -> str:
        return "/".join(f"{y * 1e6:.0f}" for _, y in (*self.after, (None, self.back_to_back_s)))


@dataclass(frozen=True)
class Calibration:
    path: str
    world_size: int
    backend: str
    scope: str  # "intra", "inter" or "unknown"
    fits: dict[str, Fit]  # plan op -> fit
    costs: tuple[StepCost, ...] = ()  # table step_costs, when the file has one
    # what a call issued after compute or back to back costs beyond the fit (table call_costs): per op,
    # and under ALL_OPS the mean over the ops (at least 0) for an op the probe did not time
    call_costs: dict[str, CallCost] = field(default_factory=dict)
    # how much a collective and compute that overlap slow each other (table overlap_costs): 0 none, 1 serial
    interference: float = 0.0

    def call_cost(self, compute_s: float | None, op: str = ALL_OPS, probe: str | None = None) -> float:
        """What `op` issued after `compute_s` of compute (None: back to back) costs beyond its fit;
        `probe`: a call the bench timed as such (NORM: the gradient norm's all_reduce), where it did."""
        if probe in self.call_costs:
            return self.call_costs[probe].back_to_back_s
        cost = self.call_costs.get(op) or self.call_costs.get(ALL_OPS)
        return cost.at(compute_s) if cost is not None else 0.0

    def cost(self, plan_model: str, strategy: str | None = None) -> StepCost | None:
        """The step cost of `strategy` if measured, else of the plan model's preferred strategy."""
        rows = [c for c in self.costs if c.plan_model == plan_model]
        exact = [c for c in rows if c.strategy == strategy]
        rows.sort(key=lambda c: _PREFERRED.index(c.strategy) if c.strategy in _PREFERRED else len(_PREFERRED))
        return (exact or rows or [None])[0]

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
        timed = {op: c for op, c in self.call_costs.items() if op not in (ALL_OPS, NORM)}
        if timed:
            after = ", ".join(f"{c * 1e3:g}" for c, _ in next(iter(timed.values())).after)
            parts.append(f"per call beyond the fit after {after} ms of compute and back to back: "
                         + ", ".join(f"{op} {c.describe()} µs" for op, c in timed.items()))
        if NORM in self.call_costs:
            parts.append(f"the gradient norm's all_reduce {self.call_costs[NORM].describe()} µs beyond the fit")
        if self.interference:
            parts.append(f"overlap interference {self.interference:.2f}")
        if self.costs:
            parts.append("step costs of " + ", ".join(c.strategy for c in self.costs))
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
    return Calibration(path, world, str(meta.get("backend", "unknown")), _scope(meta.get("hosts")), fits,
                       _costs(doc, flag), _call_costs(doc, flag), _interference(doc, flag))


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


def save_costs(path: str, table: dict) -> None:
    """Put a `step_costs` table (compare's, as a dict) into the calibration file at `path`, in place
    of any earlier one, atomically; `plan --calibration` reads it from there."""
    from distval.results import atomic_write_text

    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    doc["tables"]["step_costs"] = table
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    _load.cache_clear()


def _costs(doc: dict, flag: str) -> tuple[StepCost, ...]:
    table = doc["tables"].get("step_costs")
    if table is None:
        return ()
    rows = table.get("rows") if isinstance(table, dict) else None
    try:
        costs = tuple(StepCost(str(r["strategy"]), str(r["plan_model"]), str(r["model"]), int(r["units"]),
                               int(r["num_params"]), float(r["overhead_s"]), float(r["optimizer_s"]),
                               float(r["optimizer_per_param_s"]), float(r["mfu"]), float(r["peak_flops"]))
                      for r in rows)
    except (TypeError, KeyError, ValueError) as e:
        raise ValueError(f"{flag}: its step_costs table is not as `distval compare` writes it ({e!r}); "
                         f"write it again or drop the table") from None
    bad = [c.strategy for c in costs if min(c.units, c.num_params) < 1
           or min(c.optimizer_s, c.optimizer_per_param_s) < 0 or not 0 < c.mfu <= 1 or c.peak_flops <= 0]
    if bad:
        raise ValueError(f"{flag}: step_costs of {', '.join(bad)} need units and num_params >= 1, optimizer_s >= 0 "
                         f"and 0 < mfu <= 1, optimizer times >= 0, peak_flops > 0")
    return costs


def _call_costs(doc: dict, flag: str) -> dict[str, CallCost]:
    """What a collective issued after c seconds of compute, or back to back, costs beyond the α–β
    fit (`comm bench`'s table call_costs): per op, and under ALL_OPS the mean over the ops, at
    least 0 (it stands for ops whose own fit it never corrected)."""
    table = doc["tables"].get("call_costs")
    rows = table.get("rows") if isinstance(table, dict) else []
    points: dict[str, dict[float | None, list[float]]] = {}
    for row in rows if isinstance(rows, list) else []:
        value, compute = (row.get("overhead_us"), row.get("compute_s")) if isinstance(row, dict) else (None, None)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (value, compute)) or compute < 0:
            raise ValueError(f"{flag}: a call_costs row needs a number overhead_us and compute_s >= 0 "
                             f"(got {value!r}, {compute!r})")
        name = str(row.get("op"))
        for op in (name,) if name == NORM else (name, ALL_OPS):  # the norm's probe stands for itself alone
            points.setdefault(op, {}).setdefault(None if row.get("back_to_back") else compute, []).append(value * 1e-6)

    def mean(op: str, values: list[float]) -> float:
        return max(0.0, statistics.fmean(values)) if op == ALL_OPS else statistics.fmean(values)

    return {op: CallCost(tuple(sorted((c, mean(op, v)) for c, v in by.items() if c is not None)),
                         mean(op, by[None]) if None in by else 0.0)
            for op, by in points.items()}


INTERFERENCE_MAX = 2.0  # beyond it a probe of two noisy medians says more about the noise than the host


def _interference(doc: dict, flag: str) -> float:
    """`comm bench`'s overlap probe (table overlap_costs): how much an overlapped all_reduce and
    compute slow each other, clamped to [0, INTERFERENCE_MAX]; 0 without the table."""
    table = doc["tables"].get("overlap_costs")
    rows = table.get("rows") if isinstance(table, dict) else None
    if not rows:
        return 0.0
    value = rows[0].get("interference") if isinstance(rows, list) and isinstance(rows[0], dict) else None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{flag}: the overlap_costs row needs a number interference (got {value!r})")
    return min(max(0.0, float(value)), INTERFERENCE_MAX)


def _scope(hosts) -> str:
    if not isinstance(hosts, dict) or not hosts:
        return "unknown"
    if len(hosts) == 1:
        return "intra"
    return "inter"
