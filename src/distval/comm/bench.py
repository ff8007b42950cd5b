"""`distval comm bench`: an nccl-tests-compatible bandwidth sweep through torch.distributed.

Per (op, size, in-place form): `warmup` untimed ops, then the timed ones, by one of two methods
(`--timing`; the table's title and the report's meta say which produced the numbers):

  blocking  `iters` ops, each on its own: barrier, issue, wait for completion, timed on every rank
            with the host's monotonic clock. An iteration's time is the slowest rank's (max over
            ranks: the collective is done when the last rank is done); rows report
            p50/p95/min/max over iterations. The default on CPU, where Gloo blocks anyway.
  burst     `bursts` bursts of `iters` back-to-back ops (a barrier before each burst only), as
            nccl-tests times: on CUDA between two events on the stream the ops are ordered on, on
            CPU with the host clock and a wait at the end; the per-op time is burst time / iters,
            the slowest rank's; rows report p50/p95/min/max over bursts. The default on CUDA:
            per-op issue and host round trips no longer add to the latency. `-G` captures each
            burst once in a CUDA graph and replays it (nccl-tests' -G), so even the launch cost
            per op is gone.

algbw = S / t_p50 and busbw = algbw x factor with nccl-tests' S and factors (`names.py`). After
timing, `-c N` passes re-fill the same buffers with exact inputs, issue one op and count wrong
elements over all ranks (`#wrong`). On CPU each rank also copies a large buffer concurrently with
the others to measure this host's memory-copy ceiling, and busbw is reported as a share of it.
Per op an α–β model is fitted over the sweep (`fit.py`).
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any, Callable

import torch

from distval import device as devices
from distval import meta
from distval.comm.agree import run_agreed
from distval.comm.config import GRAPH_NEEDS_CUDA, NORM, NORM_BYTES, TIMINGS, BenchConfig  # noqa: F401 (re-exported)
from distval.comm.fit import fit_alpha_beta
from distval.comm.inputs import DTYPES
from distval.comm.names import OP_SPECS
from distval.comm.ops import Collective, count_for_bytes, inplace_variants
from distval.results import Check, Report, Status, Table
from distval.stats import percentile
from distval.units import format_size

if TYPE_CHECKING:  # types only: the launcher and the rank context sit above the collective layer
    from distval.rank import RankContext
    from distval.results import JobResult

BENCH_COLUMNS = ["op", "dtype", "bytes", "count", "inplace", "redop", "root", "time_us_p50", "time_us_p95",
                 "time_us_min", "time_us_max", "algbw_gbps", "busbw_gbps", "busbw_pct_of_copy", "wrong"]
FIT_COLUMNS = ["op", "dtype", "alpha_us", "beta_gbps", "r2", "n_half_bytes", "num_points"]
CALL_COLUMNS = ["op", "bytes", "compute_s", "back_to_back", "call_us", "fit_us", "overhead_us"]
CALL_OPS = ("all_reduce", "all_gather", "reduce_scatter")  # what training issues (the planner's ops)
CALL_BYTES = 64 * 2**10
CALL_COMPUTE_S = (0.00025, 0.001, 0.005)  # compute before each timed call, on every rank: the cost grows with it
CALL_ITERS = 20  # per op and compute time (the calibration corrects each op's fit with its own figures)
CALL_BURST = 4  # back to back: after the compute, one op untimed, then this many timed, per op
# The gradient norm's all_reduce (comm/config.py NORM) is timed as such, after a reduce_scatter: 64 KB calls
# back to back are no measure of it (on a shaped link they queue behind each other's bytes; it has none)
NORM_AFTER = "reduce_scatter"
COPY_BYTES = 64 * 2**20
OVERLAP_COLUMNS = ["op", "bytes", "compute_us", "comm_us", "both_us", "interference"]
OVERLAP_COMPUTE_S = 0.02  # the probe's compute: long enough that the scheduler's noise averages out
OVERLAP_ITERS = 12  # repeats of compute alone, the all_reduce alone, and both (~1 s)
OVERLAP_BYTES = (16 * 2**10, 64 * 2**20)  # the all_reduce's size is chosen in this range to take ~the compute's time


# -- per-rank -------------------------------------------------------------------------------------


def bench_rank(ctx: RankContext, cfg: BenchConfig) -> dict[str, Any]:
    if cfg.root >= ctx.world_size:
        raise ValueError(f"-r {cfg.root} is not a rank of this world of {ctx.world_size}")
    if cfg.graph and ctx.device.type != "cuda":
        raise ValueError(GRAPH_NEEDS_CUDA)
    dtype = DTYPES[cfg.dtype]
    elt = dtype.itemsize
    rows, skipped = [], {}
    for op in cfg.ops:
        if ctx.world_size < OP_SPECS[op].min_ranks:
            skipped[op] = OP_SPECS[op].too_few
            continue
        forms = [f for f in inplace_variants(op) if cfg.inplace == "both" or f == (cfg.inplace == "in")]
        seen_counts = set()
        for size in cfg.sizes():
            count = count_for_bytes(op, size, elt, ctx.world_size)
            if count == 0 or count in seen_counts or op in skipped:
                continue  # nccl-tests rounding can map several sizes onto one count
            seen_counts.add(count)
            for inplace in forms:
                ctx.status(f"comm bench {op} {cfg.dtype} {format_size(size)} {'in' if inplace else 'out-of'}-place")
                row = _bench_one(ctx, cfg, op, dtype, count, inplace)
                if isinstance(row, str):
                    skipped[op] = row
                    break
                rows.append(row)
    copy_gbps = measure_copy_gbps(ctx) if cfg.copy_ceiling and ctx.device.type == "cpu" else None
    timed = [op for op in CALL_OPS
             if cfg.call_cost and op in cfg.ops and op not in skipped and ctx.world_size >= OP_SPECS[op].min_ranks]
    calls = [call_times(ctx, cfg, op, dtype, compute_s, burst) for op in timed
             for compute_s, burst in [(c, 0) for c in CALL_COMPUTE_S] + [(CALL_COMPUTE_S[-1], CALL_BURST)]]
    if "all_reduce" in timed:  # after the reduce_scatter where there is one, else after a 64 KB all_reduce
        lead = NORM_AFTER if NORM_AFTER in timed else "all_reduce"
        calls.append(call_times(ctx, cfg, "all_reduce", dtype, CALL_COMPUTE_S[1], lead=lead, size=NORM_BYTES))
    overlap = overlap_times(ctx, dtype) if cfg.call_cost and "all_reduce" in cfg.ops and "all_reduce" not in skipped \
        else None
    return {"rows": rows, "skipped": skipped, "copy_gbps": copy_gbps, "timing": cfg.describe(ctx.device),
            "calls": calls, "overlap": overlap}


def call_times(ctx: RankContext, cfg: BenchConfig, op: str, dtype: torch.dtype, compute_s: float,
               burst: int = 0, lead: str | None = None, size: int = CALL_BYTES) -> dict[str, Any]:
    """One op of `size` bytes issued as training issues it: after `compute_s` of matmuls on every
    rank (a barrier lines them up first), not after a barrier alone as the sweep times it. On a
    shared CPU host the backend's threads must win a core back from the compute first, and where
    ranks outnumber cores the last rank's compute ends later the longer it is: what the α of the
    sweep does not hold. With `burst`, the op right after the compute is untimed and the `burst`
    ops issued back to back after it are timed (per op): a per-tensor strategy's calls after
    backward. With `lead`, a CALL_BYTES call of that op comes untimed between the compute and the
    timed one (the gradient norm's all_reduce after the last reduce_scatter). Seconds per call, the
    mean over ranks: a rank's call holds its wait for the slowest rank's compute, and the mean of
    those waits is what a step pays beyond the mean rank's compute (the max would count the slowest
    rank's lead again on top of the compute the plan predicts)."""
    def collective(name: str, nbytes: int) -> Collective:
        c = Collective(ctx.comm, name, dtype, count_for_bytes(name, nbytes, dtype.itemsize, ctx.world_size),
                       ctx.device, redop=cfg.redop, root=cfg.root, inplace=inplace_variants(name)[0])
        c.fill(seed=1)
        return c

    coll = collective(op, size)
    first = coll if burst else collective(lead, CALL_BYTES) if lead else None
    a = torch.randn(256, 256, device=ctx.device)
    times = torch.empty(CALL_ITERS, dtype=torch.float64)
    for i in range(CALL_ITERS + 1):  # the first warms up
        ctx.control_comm.barrier()
        began = time.perf_counter()
        while time.perf_counter() - began < compute_s:
            a = torch.tanh(a @ a)
            devices.synchronize(ctx.device)
        if first is not None:
            first()
            devices.synchronize(ctx.device)
        start = time.perf_counter()
        for _ in range(max(1, burst)):
            coll()
        devices.synchronize(ctx.device)
        if i:
            times[i - 1] = (time.perf_counter() - start) / max(1, burst)
    ctx.control_comm.all_reduce(times, "sum")
    times /= ctx.world_size
    return {"op": NORM if lead else op, "bytes": coll.size_bytes, "compute_s": 0.0 if lead else compute_s,
            "back_to_back": bool(burst or lead), "times_s": times.tolist()}


def overlap_times(ctx: RankContext, dtype: torch.dtype) -> dict[str, Any]:
    """An all_reduce issued before compute and waited for after it, as DDP overlaps a bucket's
    all_reduce with the rest of backward: per repeat the compute alone (T), the all_reduce alone
    (C) and both (B, from the issue until both have ended), every rank at once after a barrier,
    each the slowest rank's. Sized so C is about T. The interference k = (B - max(T, C)) / min(T, C)
    is what the planner's schedule slows overlapped work by (0: perfect overlap, 1: no better than
    one after the other); on a CPU host the backend's threads and the kernel's packet work take
    cores from the compute."""
    a = torch.randn(256, 256, device=ctx.device)

    def timed(fn: Callable[[], Any]) -> float:
        ctx.control_comm.barrier()
        start = time.perf_counter()
        fn()
        devices.synchronize(ctx.device)
        return time.perf_counter() - start

    def compute(n: int) -> None:
        x = a
        for _ in range(n):
            x = torch.tanh(x @ x)

    timed(lambda: compute(4))  # warm up
    per = torch.tensor([statistics.median(timed(lambda: compute(8)) for _ in range(5)) / 8], dtype=torch.float64)
    ctx.control_comm.all_reduce(per, "max")  # every rank the same count (each timing is a barrier: never per rank)
    n = max(1, round(OVERLAP_COMPUTE_S / per.item()))
    elt = dtype.itemsize
    buf = torch.zeros(OVERLAP_BYTES[0] // elt, dtype=dtype, device=ctx.device)
    for _ in range(2):  # twice: the first sizing can land far off where α dominates
        took = statistics.median(timed(lambda: ctx.comm.all_reduce(buf)) for _ in range(3))
        want = torch.tensor([buf.numel() * elt * OVERLAP_COMPUTE_S / max(took, 1e-6)], dtype=torch.float64)
        ctx.control_comm.all_reduce(want, "max")  # one size on every rank
        size = int(min(max(want.item(), OVERLAP_BYTES[0]), OVERLAP_BYTES[1])) // elt * elt
        buf = torch.zeros(size // elt, dtype=dtype, device=ctx.device)

    def both() -> None:
        work = ctx.comm.all_reduce(buf, async_op=True)
        compute(n)
        work.wait()

    times = torch.tensor([[timed(lambda: compute(n)), timed(lambda: ctx.comm.all_reduce(buf)), timed(both)]
                          for _ in range(OVERLAP_ITERS + 1)][1:], dtype=torch.float64)  # the first warms up
    ctx.control_comm.all_reduce(times, "max")
    return {"op": "all_reduce", "bytes": buf.numel() * elt, "compute_s": times[:, 0].tolist(),
            "comm_s": times[:, 1].tolist(), "both_s": times[:, 2].tolist()}


def _bench_one(
    ctx: RankContext, cfg: BenchConfig, op: str, dtype: torch.dtype, count: int, inplace: bool
) -> dict[str, Any] | str:
    """One row, or the backend's reason when every rank's backend rejects the op. Only the op
    under test goes through `ctx.comm`; barriers and the reductions of timings and #wrong go
    through the Gloo control group, so they are neither timed, nor counted, nor faulted."""
    coll = Collective(ctx.comm, op, dtype, count, ctx.device, redop=cfg.redop, root=cfg.root, inplace=inplace)
    coll.fill(seed=1)
    probe = run_agreed(ctx, lambda: (coll(), devices.synchronize(ctx.device)))
    if probe.skip_reason is not None:
        return probe.skip_reason
    for _ in range(cfg.warmup):
        coll()
    devices.synchronize(ctx.device)
    control = ctx.control_comm
    if cfg.method(ctx.device) == "burst":
        times = burst_times(ctx, coll, cfg.iters, cfg.bursts, cfg.graph)
    else:
        times = torch.empty(cfg.iters, dtype=torch.float64)
        for i in range(cfg.iters):
            control.barrier()
            start = time.perf_counter()
            coll()
            devices.synchronize(ctx.device)
            times[i] = time.perf_counter() - start
    control.all_reduce(times, "max")  # the iteration (or burst) ends when the slowest rank ends
    wrong = sum(bad.num_wrong for bad in (coll.check_once(seed=100 + rep) for rep in range(cfg.check_iters)) if bad)
    total_wrong = torch.tensor([wrong], dtype=torch.int64)
    control.all_reduce(total_wrong, "sum")
    # S of the bandwidth formulas; for every op it is also nccl-tests' size column, the larger of
    # the send and receive buffers.
    return {"op": op, "count": count, "inplace": inplace, "bytes": coll.size_bytes,
            "busbw_factor": coll.busbw_factor, "times_s": times.tolist(), "wrong": int(total_wrong)}


class Clock:
    """Seconds between start() and stop(): the host clock with a wait for the device at the end,
    or, on CUDA, two events on the current stream (the ops are ordered on it), so nothing but the
    ops themselves is timed."""

    def __init__(self, device: torch.device):
        self.device = device
        self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) \
            if device.type == "cuda" else None
        self.began = 0.0

    def start(self) -> None:
        if self.events:
            self.events[0].record()
        else:
            self.began = time.perf_counter()

    def stop(self) -> float:
        if self.events:
            self.events[1].record()
            self.events[1].synchronize()
            return self.events[0].elapsed_time(self.events[1]) / 1e3
        devices.synchronize(self.device)
        return time.perf_counter() - self.began


def burst_times(ctx: RankContext, coll: Collective, ops: int, bursts: int, graph: bool = False,
                clock: Clock | None = None) -> torch.Tensor:
    """Per-op seconds of each burst of `ops` back-to-back ops (burst time / ops), this rank's;
    a barrier on the control group before each burst lines the ranks up."""
    clock = clock or Clock(ctx.device)
    issue = capture(coll, ops, ctx.device) if graph else lambda: [coll() for _ in range(ops)]
    times = torch.empty(bursts, dtype=torch.float64)
    for b in range(bursts):
        ctx.control_comm.barrier()
        clock.start()
        issue()
        times[b] = clock.stop() / ops
    return times


def capture(coll: Collective, ops: int, device: torch.device) -> Callable[[], None]:
    """`ops` issues of the collective captured once in a CUDA graph; returns its replay. The
    capture runs on a side stream after one eager issue there, as torch.cuda.graph requires."""
    if device.type != "cuda":
        raise ValueError(GRAPH_NEEDS_CUDA)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        coll()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(ops):
            coll()
    torch.cuda.synchronize(device)
    return graph.replay


def measure_copy_gbps(ctx: RankContext, size_bytes: int = COPY_BYTES, reps: int = 5) -> float:
    """This rank's memory-copy bandwidth while every other rank copies too (they share DRAM):
    bytes copied / best time. Larger than the last-level cache so it measures memory."""
    src = torch.ones(size_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    best = float("inf")
    for _ in range(reps):
        ctx.control_comm.barrier()
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return size_bytes / best / 1e9


# -- rank 0: tables and verdicts ------------------------------------------------------------------


def build_tables(per_rank: list[dict[str, Any]], cfg: BenchConfig) -> tuple[Table, Table, float | None]:
    """Rank 0's view: every rank holds the same max-over-ranks times and #wrong after the
    all-reduces, so rank 0's rows are the job's rows. The copy ceiling is the slowest rank's."""
    copies = [r["copy_gbps"] for r in per_rank if r["copy_gbps"]]
    copy_gbps = min(copies) if copies else None
    bench = Table(
        "bench",
        BENCH_COLUMNS,
        title=per_rank[0]["timing"],
        units={
            "bytes": "B",
            "time_us_p50": "us",
            "time_us_p95": "us",
            "time_us_min": "us",
            "time_us_max": "us",
            "algbw_gbps": "GB/s (1e9)",
            "busbw_gbps": "GB/s (1e9)",
            "busbw_pct_of_copy": "%",
        },
    )
    for r in per_rank[0]["rows"]:
        t = r["times_s"]
        p50 = statistics.median(t)
        algbw = r["bytes"] / p50 / 1e9 if p50 > 0 else 0.0
        busbw = algbw * r["busbw_factor"]
        bench.add(op=r["op"], dtype=cfg.dtype, bytes=r["bytes"], count=r["count"], inplace=r["inplace"],
                  redop=cfg.redop if OP_SPECS[r["op"]].reduces else None,
                  root=cfg.root if OP_SPECS[r["op"]].rooted else None,
                  time_us_p50=p50 * 1e6, time_us_p95=percentile(t, 95) * 1e6, time_us_min=min(t) * 1e6,
                  time_us_max=max(t) * 1e6, algbw_gbps=algbw, busbw_gbps=busbw,
                  busbw_pct_of_copy=100 * busbw / copy_gbps if copy_gbps else None, wrong=r["wrong"])
    fits = Table("alpha_beta", FIT_COLUMNS, title="alpha-beta model t(S) = alpha + S/beta (weighted least squares)",
                 units={"alpha_us": "us", "beta_gbps": "GB/s (1e9)", "n_half_bytes": "B"})
    for op in cfg.ops:
        rows = [r for r in bench.rows if r["op"] == op]
        # one point per size: out-of-place where the op has it (as nccl-tests' first columns)
        oop = [r for r in rows if not r["inplace"]] or rows
        fit = fit_alpha_beta([r["bytes"] for r in oop], [r["time_us_p50"] * 1e-6 for r in oop])
        if fit:
            fits.add(op=op, dtype=cfg.dtype, alpha_us=fit.alpha_us, beta_gbps=fit.beta_gbps, r2=fit.r2,
                     n_half_bytes=fit.n_half_bytes, num_points=fit.num_points)
    return bench, fits, copy_gbps


def call_table(per_rank: list[dict[str, Any]], fits: Table) -> Table | None:
    """Per op and compute time: the mean of a call issued after compute (a step of ten or twenty
    calls pays about their mean each, stalls included: with the median the plan fell short of the
    measured waits; docs/results/2026-11-27-plan-accuracy.md), the sweep's fit at that size, and the difference
    (the per-call cost training pays beyond the fit, per op: negative where the sweep's α, timed
    after a barrier, is above the op in training's rhythm); the row "norm": the gradient norm's
    4-byte all_reduce right after a reduce_scatter, against all_reduce's fit."""
    table = Table("call_costs", CALL_COLUMNS, title=f"one op after compute (mean of {CALL_ITERS}, mean over ranks: a "
                  "step pays the sum) against the alpha-beta fit at its size",
                  units={"bytes": "B", "compute_s": "s", "call_us": "us", "fit_us": "us", "overhead_us": "us"})
    for call in per_rank[0].get("calls") or []:
        fit_op = "all_reduce" if call["op"] == NORM else call["op"]
        fit = next((f for f in fits.rows if f["op"] == fit_op), None)
        if fit is None:
            continue
        after = statistics.fmean(call["times_s"]) * 1e6
        fitted = fit["alpha_us"] + call["bytes"] / (fit["beta_gbps"] * 1e3)
        table.add(op=call["op"], bytes=call["bytes"], compute_s=call["compute_s"], back_to_back=call["back_to_back"],
                  call_us=after, fit_us=fitted, overhead_us=after - fitted)
    return table if table.rows else None


def bench_checks(bench: Table, fits: Table, cfg: BenchConfig, world_size: int, copy_gbps: float | None,
                 skipped: dict[str, str] | None = None) -> list[Check]:
    checks = []
    for op in cfg.ops:
        rows = [r for r in bench.rows if r["op"] == op]
        name = f"comm.bench {op} {cfg.dtype}"
        if skipped and op in skipped:
            checks.append(Check(name, Status.SKIP, f"{op} {cfg.dtype}: not supported here: {skipped[op]}",
                                details={"reason": skipped[op]}, where={"op": op}))
            continue
        if not rows:
            checks.append(
                Check(
                    name,
                    Status.SKIP,
                    f"{op}: no size in the sweep gives a non-empty buffer at {world_size} ranks",
                    hint="raise -e",
                )
            )
            continue
        bad = [r for r in rows if r["wrong"]]
        top = sorted(rows, key=lambda r: r["bytes"])[-3:]
        plateau = statistics.median(r["busbw_gbps"] for r in top)
        fit = next((f for f in fits.rows if f["op"] == op), None)
        fit_text = (f"; α {fit['alpha_us']:.1f} µs, β {fit['beta_gbps']:.2f} GB/s, R² {fit['r2']:.3f}" if fit
                    else "; no α–β fit (the sweep shows no bandwidth-bound sizes: raise -e)" if world_size > 1
                    else "")
        if world_size == 1:  # busbw = algbw x 2(n-1)/n ... = 0: no link is crossed
            fit_text += "; bus bandwidth is not defined on one rank (no data crosses a link): run 2 or more ranks"
        share = (
            f" ({100 * plateau / copy_gbps:.0f}% of this host's {copy_gbps:.1f} GB/s copy ceiling)" if copy_gbps else ""
        )
        details = {"plateau_busbw_gbps": plateau, "largest_bytes": top[-1]["bytes"], "rows": len(rows)}
        if bad:
            first = bad[0]
            checks.append(
                Check(
                    name,
                    Status.FAIL,
                    f"{op}: {sum(r['wrong'] for r in bad)} wrong element(s) after timing, "
                    f"first at {format_size(first['bytes'])} "
                    f"({'in' if first['inplace'] else 'out-of'}-place)",
                    details={**details, "wrong_rows": bad},
                    hint="run `distval comm check` with -c 20 to localise the rank and index",
                    where={"op": op, "bytes": first["bytes"], "inplace": first["inplace"]},
                )
            )
        else:
            checks.append(
                Check(
                    name,
                    Status.OK,
                    f"{op}: busbw {plateau:.2f} GB/s at the largest sizes{share}{fit_text}; #wrong 0",
                    details=details,
                    where={"op": op},
                )
            )
    return checks


def csv_text(bench: Table) -> str:
    import csv
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=bench.columns, lineterminator="\n")
    writer.writeheader()
    for row in bench.rows:
        writer.writerow(row)
    return buf.getvalue()


def overlap_table(per_rank: list[dict[str, Any]]) -> Table | None:
    """The overlap probe's medians and its interference (None when it did not run)."""
    probe = per_rank[0].get("overlap")
    if not probe:
        return None
    compute, comm, both = (statistics.median(probe[k]) for k in ("compute_s", "comm_s", "both_s"))
    table = Table("overlap_costs", OVERLAP_COLUMNS,
                  title=f"an all_reduce overlapped with compute (median of {OVERLAP_ITERS}, max over ranks): "
                  "interference = (both - max(compute, comm)) / min(compute, comm); 0 hides it fully, 1 not at all",
                  units={"bytes": "B", "compute_us": "us", "comm_us": "us", "both_us": "us"})
    table.add(op=probe["op"], bytes=probe["bytes"], compute_us=compute * 1e6, comm_us=comm * 1e6, both_us=both * 1e6,
              interference=(both - max(compute, comm)) / min(compute, comm))
    return table


def build_report(job: JobResult, cfg: BenchConfig) -> Report:
    bench, fits, copy_gbps = build_tables(job.results, cfg)
    report = Report(
        "comm bench",
        meta=meta.collect(
            job,
            cfg,
            copy_ceiling_gbps=copy_gbps,
            sizes_bytes=cfg.sizes(),
            timing=job.results[0]["timing"],
        ),
    )
    report.checks = bench_checks(bench, fits, cfg, job.world_size, copy_gbps, job.results[0]["skipped"])
    report.tables += [bench, fits]
    report.tables += [t for t in (call_table(job.results, fits), overlap_table(job.results)) if t is not None]
    return report
