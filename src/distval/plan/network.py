"""Collective times from the α–β model (Thakur, Rabenseifner and Gropp 2005; docs/plan.md).

A link is (α, B): α the per-message latency, B the effective per-rank bandwidth in bytes/s (line
rate × efficiency for presets; the measured value for calibrated ops). S is nccl-tests' size:
the buffer for all_reduce, the full gathered (or un-scattered) buffer for all_gather and
reduce_scatter. For n ranks on one link:

    ring all_reduce          2(n−1)·α + 2(n−1)/n · S/B
    tree all_reduce          2⌈log2 n⌉·α + 2·S/B          (wins for small S at large n)
    ring all_gather,
    ring reduce_scatter      (n−1)·α + (n−1)/n · S/B

Two levels (M nodes × D devices, intra link i, inter link e whose per-rank bandwidth is the
node's NIC bandwidth shared by its D ranks when there are fewer NICs than devices):

    hierarchical all_reduce  RS_i(S, D) + AR_e(S/D, M) + AG_i(S, D)
    hierarchical all_gather  AG_e(S/D, M) + AG_i(S, D);  reduce_scatter: RS_i(S, D) + RS_e(S/D, M)
    flat ring / tree         over all M·D ranks at the slower link's B and the larger α

and the fastest candidate is taken (the `algorithm` column says which), as NCCL's tuner picks
per size. An op calibrated from a `comm bench` run follows the measured curve instead: the fit
t = α_fit + S/β_fit at the bench's world size n_b gives the link's per-step α = α_fit/steps(n_b)
and B = β_fit·factor(n_b) (all_reduce: 2(n−1) steps, factor 2(n−1)/n; all_gather/reduce_scatter:
n−1, (n−1)/n), which reproduce the fit exactly at n_b and extrapolate along the ring formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from distval.comm import names  # torch-free: the collectives' nccl-tests record

PLAN_OPS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Link:
    name: str
    alpha_s: float
    bytes_per_s: float  # effective
    source: str  # "preset", "given", "calibrated" or "derived"


def steps(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw factor (the collective's record in comm/names.py): the share of S a rank
    sends (and receives) in a ring."""
    return names.bus_factor(op, n)


def ring_time(op: str, n: int, size_bytes: float, link: Link) -> float:
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return steps(op, n) * link.alpha_s + bus_factor(op, n) * size_bytes / link.bytes_per_s


def tree_time(n: int, size_bytes: float, link: Link) -> float:
    """Double binary tree all_reduce: a reduce up and a broadcast down, each pipelined, so
    2⌈log2 n⌉ latencies and every byte crossing a rank's link twice."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * link.alpha_s + 2 * size_bytes / link.bytes_per_s


def from_fit(op: str, alpha_s: float, beta_bytes_per_s: float, world_size: int, name: str, source: str) -> Link:
    """Invert the ring formula at the bench's world size (see the module docstring)."""
    return Link(name, alpha_s / steps(op, world_size), beta_bytes_per_s * bus_factor(op, world_size), source)


@dataclass
class Network:
    """Where every rank sits and what connects them; `calibrated[(scope, op)]` replaces the
    scope's link for that op. A scope with no link (none given) makes times unknown (None)."""

    num_nodes: int
    devices_per_node: int
    nics_per_node: int
    intra: Link | None
    inter: Link | None
    calibrated: dict[tuple[str, str], Link] = field(default_factory=dict)
    _memo: dict[tuple[str, float], tuple] = field(default_factory=dict, repr=False, compare=False)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    def link_for(self, scope: str, op: str) -> Link | None:
        found = self.calibrated.get((scope, op))
        if found is not None:
            return found
        base = self.intra if scope == "intra" else self.inter
        if base is None or scope == "intra":
            return base
        share = min(self.nics_per_node, self.devices_per_node) / self.devices_per_node
        return Link(base.name, base.alpha_s, base.bytes_per_s * share, base.source) if share < 1 else base

    def time(self, op: str, size_bytes: float) -> tuple[float | None, str, str]:
        """(seconds, algorithm, source of the link numbers) of one collective of S bytes."""
        key = (op, size_bytes)
        if key not in self._memo:  # a step repeats a few bucket sizes thousands of times
            self._memo[key] = self._time(op, size_bytes)
        return self._memo[key]

    def _time(self, op: str, size_bytes: float) -> tuple[float | None, str, str]:
        n = self.world_size
        if n == 1 or size_bytes <= 0:
            return 0.0, "none", "—"
        if self.num_nodes == 1 or self.devices_per_node == 1:
            scope = "intra" if self.num_nodes == 1 else "inter"
            link = self.link_for(scope, op)
            if link is None:
                return None, "unknown", "no link"
            return self._one_level(op, n, size_bytes, link)
        return self._two_level(op, size_bytes)

    def _one_level(self, op: str, n: int, size_bytes: float, link: Link) -> tuple[float, str, str]:
        best = (ring_time(op, n, size_bytes, link), "ring", link.source)
        if op == "all_reduce" and link.source not in ("calibrated", "derived"):
            tree = tree_time(n, size_bytes, link)
            if tree < best[0]:
                best = (tree, "tree", link.source)
        return best

    def _two_level(self, op: str, size_bytes: float) -> tuple[float | None, str, str]:
        d, m = self.devices_per_node, self.num_nodes
        intra, inter = self.link_for("intra", op), self.link_for("inter", op)
        if intra is None or inter is None:
            return None, "unknown", "no link"
        slow = Link(
            "bottleneck", max(intra.alpha_s, inter.alpha_s), min(intra.bytes_per_s, inter.bytes_per_s), inter.source
        )
        flat = self._one_level(op, d * m, size_bytes, slow)
        if op == "all_reduce":  # each phase on the link calibrated for its own op, if any
            hier = (ring_time("reduce_scatter", d, size_bytes, self.link_for("intra", "reduce_scatter"))
                    + ring_time("all_reduce", m, size_bytes / d, inter)
                    + ring_time("all_gather", d, size_bytes, self.link_for("intra", "all_gather")))
        else:
            hier = ring_time(op, m, size_bytes / d, inter) + ring_time(op, d, size_bytes, intra)
        sources = "/".join(sorted({intra.source, inter.source}))
        return (hier, "hierarchical", sources) if hier < flat[0] else (flat[0], f"flat {flat[1]}", sources)
