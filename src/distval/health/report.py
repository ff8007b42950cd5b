"""The health monitor's findings in a report: the `health` and `rank_health` tables and one check per
detector (stragglers, numerics, replicas, memory), the same for `distval train` (the monitor on
rank 0, train/run.py) and a launched script (the launcher's, health/script.py)."""

from __future__ import annotations

from typing import Any

from distval.health.config import HealthConfig
from distval.health.stragglers import STRAGGLER_HINT
from distval.results import Check, Report, Status, Table

HEALTH_COLUMNS = ["kind", "status", "step", "ranks", "summary"]
RANK_HEALTH_COLUMNS = ["rank", "compute_ms", "waiting_ms", "peak_mem_bytes", "current_mem_bytes"]
REPLICAS_HINT = ("a rank-dependent update (an unsynchronised gradient, a rank-local RNG, a bit flip); the named "
                 "tensors diverged first")

CHECKS = {  # check: (finding kinds, what OK says, hint)
    "stragglers": (("straggler",), "no straggler: no rank's compute stayed {ratio:g}x its peers' over {window} steps, "
                   "none lost time to causes outside its process", STRAGGLER_HINT),
    "numerics": (("nonfinite", "grad_spike"), "{numerics}",
                 "lower the learning rate, check the named rank's batch and the named parameter; bf16 overflow"),
    "memory": (("memory_imbalance", "memory_growth"), "memory balanced across ranks, no steady growth",
               "tensors kept across steps (a list of losses with their graphs, a cache) on the named rank"),
}


def add_health(report: Report, findings: list[dict[str, Any]], rank_rows: list[dict[str, Any]], cfg: HealthConfig,
               replicas: str, numerics: str = "every loss and gradient norm finite; no gradient-norm spike",
               skips: dict[str, str] | None = None, host: str | None = None) -> None:
    """`findings`: Finding.to_dict()s; `replicas`: what the replica check says when it found
    nothing (its SKIP reason starts with "SKIP: "); `numerics`: what an OK numerics check says;
    `skips`: a detector that could not judge (too few steps, clocks of several hosts) -> why;
    `host`: what the host did to every rank (health/lost.py `host_note`), said in the stragglers
    check."""
    table = Table("health", HEALTH_COLUMNS, title="training health: stragglers, numerics, replicas, memory")
    for f in findings:
        table.add(**{c: f[c] for c in HEALTH_COLUMNS})
    report.tables.append(table)
    per_rank = Table("rank_health", RANK_HEALTH_COLUMNS, title="every rank over the run (median per step; memory: "
                     "peak and last current)", units={"compute_ms": "ms", "waiting_ms": "ms", "peak_mem_bytes": "B",
                                                      "current_mem_bytes": "B"})
    for row in rank_rows:
        per_rank.add(**row)
    report.tables.append(per_rank)
    skips = skips or {}
    for name, (kinds, ok, hint) in CHECKS.items():
        mine = [f for f in findings if f["kind"] in kinds]
        for f in mine:
            report.add(_check(name, f, hint))
        if not mine:
            status, text = (Status.SKIP, skips[name]) if name in skips else \
                (Status.OK, ok.format(ratio=cfg.slow_ratio, window=cfg.window, numerics=numerics))
            if name == "stragglers" and host:
                text = f"{text}; {host}"
            report.add(Check(f"health {name}", status, text))
    bad = [f for f in findings if f["kind"] == "replicas"]
    if bad:
        report.add(_check("replicas", bad[0], REPLICAS_HINT))
    else:
        skip = replicas.startswith("SKIP: ")
        report.add(Check("health replicas", Status.SKIP if skip else Status.OK, replicas.removeprefix("SKIP: ")))


def _check(name: str, f: dict[str, Any], hint: str) -> Check:
    return Check(f"health {name}", Status(f["status"]), f["summary"], details=f["details"], hint=hint,
                 where={"rank": f["ranks"][0] if len(f["ranks"]) == 1 else f["ranks"], "step": f["step"]})
