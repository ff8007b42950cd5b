"""`distval comm check`: exact correctness of every collective, dtype, reduce op and odd size.

Each rank runs every case on inputs from `inputs.values` (exact, rank- and index-dependent),
computes the expected output locally and compares the raw bits. Rank 0 turns the per-rank
outcomes into one Check per (op, dtype, size class): OK, FAIL naming the rank(s), the first wrong
index, expected and got and how many elements are wrong, or SKIP with the backend's own reason
when it does not implement the combination (probed at run time, never from a table).

Communication: one collective per case, root, in-place form and repetition (`-c N` repeats with
fresh seeds); broadcast, reduce, gather and scatter run from every root, all_gather and
reduce_scatter both out-of-place and in-place, send/recv as a shift around the ring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from distval import meta
from distval.comm.agree import Unsupported, run_agreed
from distval.comm.config import SIZES, CheckConfig, expand_all, parse_ops  # noqa: F401 (the config's home; re-exported)
from distval.comm.inputs import DTYPES, Mismatch
from distval.comm.layer import REDUCE_OPS
from distval.comm.names import OP_SPECS
from distval.comm.ops import Collective, inplace_variants
from distval.results import Check, Report, Status, Table

if TYPE_CHECKING:  # types only: the launcher and the rank context sit above the collective layer
    from distval.rank import RankContext
    from distval.results import JobResult


@dataclass(frozen=True)
class Case:
    op: str  # e.g. "all_reduce/sum", "broadcast"
    dtype: str
    size_class: str
    count: int

    @property
    def name(self) -> str:
        return self.op if self.op == "barrier" else f"{self.op} {self.dtype} {self.size_class}"


def cases(cfg: CheckConfig) -> list[Case]:
    out = []
    for op in cfg.ops:
        every_redop = op in OP_SPECS and OP_SPECS[op].every_redop
        variants = [f"{op}/{r}" for r in REDUCE_OPS] if every_redop else [op]
        dtypes = ["-"] if op == "barrier" else cfg.dtypes
        sizes = {"-": 0} if op == "barrier" else cfg.sizes
        for variant in variants:
            for dtype in dtypes:
                for size_class, count in sizes.items():
                    out.append(Case(variant, dtype, size_class, count))
    return out


# -- per-rank ----------------------------------------------------------------------------------


def check_rank(ctx: RankContext, cfg: CheckConfig) -> list[dict[str, Any]]:
    """Run every case on this rank; return one outcome per case."""
    outcomes = []
    for case in cases(cfg):
        ctx.status(f"comm check {case.name}")
        outcome: dict[str, Any] = {"case": case.name, "status": "ok", "wrong": []}
        for rep in range(cfg.iters):
            seed = cfg.seed * 1_000_003 + rep
            agreed = run_agreed(ctx, lambda: _run_case(ctx, case, seed), flag=lambda res: any(bad for _, bad in res))
            if agreed.skip_reason is not None:
                outcome = {"case": case.name, "status": "unsupported", "reason": agreed.skip_reason}
                break
            for where, bad in agreed.result:
                if bad is not None:
                    outcome["status"] = "wrong"
                    outcome["wrong"].append({"rep": rep, **where, **bad.to_dict()})
            if agreed.any_flag:
                break  # like nccl-tests -c: every rank stops at the first failing repetition
        outcomes.append(outcome)
    return outcomes


def _run_case(ctx: RankContext, case: Case, seed: int) -> list[tuple[dict[str, Any], Mismatch | None]]:
    """Issue the case (from every root, in every in-place form the op has) and verify it."""
    op, _, redop = case.op.partition("/")
    if op == "barrier":
        return [({}, _check_barrier(ctx, seed))]
    dtype = DTYPES[case.dtype]
    spec = OP_SPECS[op]
    if redop == "avg" and not dtype.is_floating_point:  # only ops run with every reduce op have one
        raise Unsupported("avg is checked for floating-point dtypes only (integer rounding is backend-defined)")
    if ctx.world_size < spec.min_ranks:
        raise Unsupported(spec.too_few)
    results = []
    rooted = spec.rooted
    for root in range(ctx.world_size) if rooted else [0]:
        for inplace in inplace_variants(op):
            coll = Collective(
                ctx.comm, op, dtype, case.count, ctx.device, redop=redop or "sum", root=root, inplace=inplace
            )
            where = {"root": root} if rooted else {}
            if len(inplace_variants(op)) > 1:
                where["inplace"] = inplace
            results.append((where, coll.check_once(seed + root)))
    return results


def _check_barrier(ctx: RankContext, seed: int) -> Mismatch | None:
    """A barrier must not release any rank before every rank has arrived: each rank posts a key
    to the store before entering; after leaving, every rank's key must be there. TCPStore's set
    does not wait for the store's answer, so each rank reads its own key back first (its
    connection's next answer: the set has landed), else a peer could look before it lands (seen
    across emulated nodes' slower links) and blame the barrier."""
    store = dist.distributed_c10d._get_default_store()
    prefix = f"distval/barrier/{seed}/"
    store.set(prefix + str(ctx.rank), b"1")
    store.get(prefix + str(ctx.rank))
    ctx.comm.barrier()
    missing = [r for r in range(ctx.world_size) if not store.check([prefix + str(r)])]
    if missing:
        return Mismatch(num_wrong=len(missing), index=missing[0], expected="arrived", got="missing")
    return None


# -- rank 0: verdicts ----------------------------------------------------------------------------


def summarize(per_rank: list[list[dict[str, Any]]], cfg: CheckConfig) -> list[Check]:
    checks = []
    by_case = list(zip(*per_rank))  # one tuple of per-rank outcomes per case
    for case, outcomes in zip(cases(cfg), by_case):
        checks.append(_verdict(case, list(outcomes), cfg))
    return checks


def _verdict(case: Case, outcomes: list[dict[str, Any]], cfg: CheckConfig) -> Check:
    op, _, redop = case.op.partition("/")
    where = {"op": case.op, "dtype": case.dtype, "count": case.count, "size_class": case.size_class}
    unsupported = [o for o in outcomes if o["status"] == "unsupported"]
    if unsupported:
        reason = unsupported[0]["reason"]
        return Check(f"comm.check {case.name}", Status.SKIP, f"{case.name}: not supported here: {reason}",
                     details={"reason": reason}, where=where)
    wrong = [{"rank": r, **w} for r, o in enumerate(outcomes) for w in o["wrong"]]
    size = (
        "all ranks arrive before any leaves"
        if op == "barrier"
        else f"{case.count} element{'s' if case.count != 1 else ''}"
    )
    if not wrong:
        reps = f", {cfg.iters} repetitions" if cfg.iters > 1 else ""
        return Check(f"comm.check {case.name}", Status.OK, f"{case.name} ({size}{reps}): exact on every rank",
                     where=where)
    first = wrong[0]
    ranks = sorted({w["rank"] for w in wrong})
    root = f" (root {first['root']})" if "root" in first else ""
    root += " (in-place)" if first.get("inplace") else ""
    summary = (f"{case.name} ({size}): {first['num_wrong']} element(s) wrong on rank {first['rank']}{root}, "
               f"first at index {first['index']}: expected {first['expected']!r}, got {first['got']!r}"
               + (f"; wrong on ranks {ranks}" if len(ranks) > 1 else ""))
    return Check(
        f"comm.check {case.name}", Status.FAIL, summary,
        details={"rank": first["rank"], "index": first["index"], "expected": first["expected"], "got": first["got"],
                 "num_wrong": first["num_wrong"], "wrong_ranks": ranks, "all": wrong},
        hint=("a collective returned wrong data: rerun with -c 20 to see whether it is intermittent, and compare "
              "the ranks named here (and their links) with a known-good node"),
        where={**where, "rank": first["rank"], "index": first["index"]},
    )


def matrix_table(checks: list[Check], cfg: CheckConfig) -> Table:
    """One row per op variant, one column per dtype: the verdict over all size classes."""
    table = Table("check_matrix", ["op", *cfg.dtypes], title="comm check: verdict per op and dtype over all sizes")
    cells: dict[str, dict[str, list[Status]]] = {}
    for c in checks:
        cells.setdefault(c.where["op"], {}).setdefault(c.where["dtype"], []).append(c.status)
    for op, by_dtype in cells.items():
        row: dict[str, Any] = {"op": op}
        for dtype, statuses in by_dtype.items():
            dtype_cols = cfg.dtypes if dtype == "-" else [dtype]
            for col in dtype_cols:
                row[col] = _cell(statuses)
        table.add(**row)
    return table


def _cell(statuses: list[Status]) -> str:
    if Status.FAIL in statuses:
        return "FAIL"
    if all(s == Status.SKIP for s in statuses):
        return "SKIP"
    if all(s == Status.OK for s in statuses):
        return "OK"
    return f"OK ({statuses.count(Status.SKIP)} skip)"


def build_report(job: JobResult, cfg: CheckConfig) -> Report:
    checks = summarize(job.results, cfg)
    report = Report("comm check", meta=meta.collect(job, cfg, num_cases=len(checks)), checks=checks)
    report.tables.append(matrix_table(checks, cfg))
    return report
