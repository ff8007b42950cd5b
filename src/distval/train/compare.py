"""`distval compare` as a library function that returns a Report (one run of `distval train`: train/run.py).

compare: a single-process reference run (world of 1, micro-batch = world x micro-batch, same
accumulation, same seed, so it sees exactly the samples all ranks see together), then each
strategy on `nproc` ranks; per strategy the parity of the final parameters with the reference
(max |p - p_ref| / max |p_ref|), step time, tokens/s, peak memory, collectives per step against
the strategy's expected volume, and the share of communication hidden behind compute
(1 - exposed/total, where exposed is the time the training thread waited on collectives; for
pytorch_ddp and pytorch_zero1 the wait inside backward from the last bucket's launch to backward's
return; None for fsdp2, whose collectives are torch's own), the model state each rank holds
(parameters, gradients, optimizer state, shards: the largest rank) against the strategy's formula
and the planner's prediction, and with `--calibration bench.json` the step time `distval plan`
predicts (compute at the reference run's measured MFU, communication from the bench's α–β fit).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import torch

from distval import meta, strategies
from distval.launch import JobResult, LaunchOptions, planned_world_size
from distval.launch.execute import execute
from distval.results import Check, Report, Status, Table
from distval.stats import percentile
from distval.trace.config import TraceConfig
from distval.train.config import TrainConfig
from distval.train.loop import train_rank
from distval.train.run import add_trace

COMPARE_COLUMNS = [
    "strategy",
    "max_rel_param_diff",
    "bitwise_equal",
    "final_loss",
    "step_time_p50_s",
    "step_time_p95_s",
    "tokens_per_s",
    "peak_mem_bytes",
    "model_state_bytes",
    "expected_model_state_bytes",
    "predicted_model_state_bytes",
    "predicted_peak_mem_bytes",
    "comm_calls_per_step",
    "comm_bytes_per_step",
    "expected_comm_bytes_per_step",
    "comm_wire_bytes_per_step",
    "comm_hidden_frac",
    "predicted_step_time_s",
    "measured_compute_s",
    "measured_exposed_comm_s",
    "measured_split",
    "predicted_compute_s",
    "predicted_exposed_comm_s",
    "prediction_ratio",
    "prediction_miss",
]
MEMORY_RTOL = 0.10  # measured model state against the formula
# measured/predicted step time outside this band is a WARN naming the category that carries the error
PREDICTION_BAND = (0.67, 1.5)
PARITY_RTOL = 1e-5


def predicted_step(cfg: TrainConfig, name: str, world: int, reference: dict[str, Any], peak_flops: float,
                   calibration: str | None) -> dict[str, float | None]:
    """The planner's step for this run, in the categories the harness measures: step time, compute
    and the communication not hidden behind it. Compute at the MFU the reference run achieved, of
    the peak each rank measured (`peak_flops`: a rank of the distributed run has its own share of
    the cores — one intra-op thread per worker — while the single-process reference has them all),
    communication from the α–β fit of a `comm bench` on this fabric. Nothing without a calibration
    (no link to plan with)."""
    if calibration is None:
        return {}
    from distval.plan import PlanConfig, evaluate
    from distval.plan.steps import MIB

    steps = reference["steps"][1:] or reference["steps"]
    mfu = statistics.median(s["mfu"] for s in steps)
    strategy = strategies.REGISTRY[name]
    bucket_mb = cfg.strategy_cfg.bucket_mb
    if strategy.call_per_tensor:  # the planner sees buckets of the mean tensor's size: each call pays its α
        bucket_mb = reference["num_params"] * 4 / reference["num_tensors"] / MIB  # (simple_ddp's K syncs: not modelled)
    plan = PlanConfig(model=cfg.model, micro_batch=cfg.micro_batch, grad_accum=cfg.grad_accum, world_size=world,
                      peak_tflops=peak_flops / 1e12, mfu=min(mfu, 1.0), strategy=strategy.plan_model,
                      bucket_mb=bucket_mb, overlap=strategy.overlaps_backward, calibration=calibration)
    result = evaluate(plan)
    step, compute = result.step_time_s, result.compute_time_s
    return {"predicted_step_time_s": step, "predicted_compute_s": compute,
            "predicted_exposed_comm_s": max(0.0, step - compute) if step is not None and compute is not None else None}


def prediction_check(name: str, row: dict[str, Any]) -> Check | None:
    """Measured against predicted step time: OK inside PREDICTION_BAND, else a WARN naming the
    category (compute, or the communication not hidden behind it) whose error is the larger, with
    what to do. Sets the row's `prediction_ratio` and `prediction_miss`; None without a prediction."""
    measured, predicted = row["step_time_p50_s"], row.get("predicted_step_time_s")
    if not predicted:
        return None
    ratio = row["prediction_ratio"] = measured / predicted
    lo, hi = PREDICTION_BAND
    parts = {"compute": (row.get("measured_compute_s"), row.get("predicted_compute_s")),
             "exposed communication": (row.get("measured_exposed_comm_s"), row.get("predicted_exposed_comm_s"))}
    known = {k: (m, p) for k, (m, p) in parts.items() if m is not None and p is not None}
    split = "; ".join(f"{k} {m * 1e3:.1f} vs {p * 1e3:.1f} ms" for k, (m, p) in known.items()) + (
        " (split by the trace)" if known and row.get("measured_split") == "trace" else "")
    text = f"{name}: measured {measured * 1e3:.1f} ms against the plan's {predicted * 1e3:.1f} ms ({ratio:.2f}x)" + (
        f": {split}" if split else "")
    details = {"ratio": ratio, "band": list(PREDICTION_BAND), "categories": {k: {"measured_s": m, "predicted_s": p}
                                                                             for k, (m, p) in known.items()}}
    if lo <= ratio <= hi:
        row["prediction_miss"] = None
        return Check(f"compare {name} prediction", Status.OK, text, details=details)
    if len(known) == 2:
        miss = max(known, key=lambda k: abs(known[k][0] - known[k][1]))
    else:  # the harness could not split the step (the strategy's collectives are torch's own)
        miss = "unsplit"
    row["prediction_miss"] = miss
    if miss == "exposed communication":
        where = "the error is in the communication not hidden behind compute"
        hint = ("the plan's collectives come from the bench's α–β fit: per-call overhead, the number of calls and the "
                "overlap this strategy really gets are not all in it; trace the run (--trace) to see where it waits")
    elif miss == "compute":
        where = "the error is in compute"
        hint = ("the plan's compute is 6·N FLOPs per token at the reference run's MFU: a strategy's own per-layer cost "
                "(hooks, gathers and reshards, DTensor) is not modelled; weigh the plan for this strategy accordingly, "
                "or trace the run (--trace) to see where the time goes")
    else:
        where = ("the harness cannot split this step (the strategy's collectives are torch's own and not timed): "
                 "compute or its communication")
        hint = ("trace the run (--trace) to split it; FSDP2's per-layer all-gathers, reduce-scatters and hooks are "
                "what the plan does not model yet")
    return Check(f"compare {name} prediction", Status.WARN, f"{text}; outside {lo}-{hi}x: {where}", details=details,
                 hint=hint, where={"strategy": name, "category": miss})


def predicted_memory(cfg: TrainConfig, name: str, world: int) -> dict[str, float]:
    """The planner's model-state and peak bytes per rank for this run (fp32 parameters, gradients
    and Adam state; activations of one micro-batch; communication buffers)."""
    from distval.plan import PlanConfig, memory_rows, resolve

    plan = PlanConfig(model=cfg.model, micro_batch=cfg.micro_batch, grad_accum=cfg.grad_accum, world_size=world,
                      strategy=strategies.REGISTRY[name].plan_model, bucket_mb=cfg.strategy_cfg.bucket_mb,
                      param_dtype="fp32", optim_dtype="fp32")
    row = next(r for r in memory_rows(resolve(plan)) if r["chosen"])
    return {"predicted_model_state_bytes": row["model_state_bytes"], "predicted_peak_mem_bytes": row["total_bytes"]}


def compare_runs(names: list[str], sizes: list[float]) -> list[tuple[str, str, float | None]]:
    """(label, strategy, bucket MiB or None for the config's) of every run of a compare: with
    several sizes, each bucketed strategy once per size (`bucket_ddp_async@5MiB`)."""
    runs = []
    for name in names:
        if len(sizes) > 1 and name in strategies.BUCKETED:
            runs += [(f"{name}@{size:g}MiB", name, size) for size in sizes]
        else:
            runs.append((name, name, None))
    return runs


def run_compare(cfg: TrainConfig, strategy_names: list[str], opts: LaunchOptions,
                calibration: str | None = None, traces: dict[str, TraceConfig] | None = None,
                bucket_sizes: list[float] | None = None) -> Report:
    """Every strategy against a one-process reference; `traces`: each run's --trace (by label);
    `bucket_sizes`: the --bucket-mb sweep."""
    world = planned_world_size(opts)  # the strategies' ranks: the reference trains on their global batch
    traces = traces or {}
    sizes = bucket_sizes or [cfg.strategy_cfg.bucket_mb]
    ref_cfg = dataclasses.replace(
        cfg, strategy="simple_ddp_ga", micro_batch=cfg.micro_batch * world, return_params=True, trace=TraceConfig()
    )
    reference = _one(ref_cfg, dataclasses.replace(opts, nproc=1))
    report = Report("compare", meta=meta.collect(None, cfg, world_size=world, backend=opts.backend,
                                                 strategies=strategy_names, parity_rtol=PARITY_RTOL))
    table = Table(
        "strategies",
        COMPARE_COLUMNS,
        title=f"strategies on {world} ranks against a single-process reference",
        units={
            "step_time_p50_s": "s",
            "step_time_p95_s": "s",
            "peak_mem_bytes": "B",
            "comm_bytes_per_step": "B",
            "expected_comm_bytes_per_step": "B",
        },
    )
    report.tables.append(table)
    if isinstance(reference, Report):
        return reference
    sweep: dict[str, list[dict[str, Any]]] = {}
    for label, name, size in compare_runs(strategy_names, sizes):
        strategy_cfg = cfg.strategy_cfg if size is None else dataclasses.replace(cfg.strategy_cfg, bucket_mb=size)
        run_cfg = dataclasses.replace(cfg, strategy=name, return_params=True, strategy_cfg=strategy_cfg,
                                      trace=traces.get(label, TraceConfig()))
        run_opts = opts
        if strategies.REGISTRY[name].single_process:  # dp: one process, the whole batch, as the reference
            from distval.strategies.dataparallel import unavailable

            if (why := unavailable()) is not None:
                report.add(Check(f"compare {label}", Status.SKIP, why, details={"reason": why}))
                continue
            run_cfg = dataclasses.replace(run_cfg, micro_batch=cfg.micro_batch * world)
            run_opts = dataclasses.replace(opts, nproc=1)
        result = _one(run_cfg, run_opts)
        if isinstance(result, Report):  # the run failed: its ERROR check says why
            report.checks += result.checks
            continue
        row = compare_row(label, result, reference)
        if not strategies.REGISTRY[name].single_process:  # the planner models one process per device, not dp
            row.update(predicted_step(run_cfg, name, world, reference, result["peak_flops"], calibration))
            row.update(predicted_memory(run_cfg, name, world))
        exposed = None
        if run_cfg.trace.enabled:
            exposed = add_trace(report, run_cfg, result["steps"], label=f" {label}")
        if exposed is not None:  # the trace splits any strategy's step, torch's own collectives included
            row.update(measured_split="trace", measured_exposed_comm_s=exposed,
                       measured_compute_s=max(0.0, row["step_time_p50_s"] - exposed))
        predicted = prediction_check(label, row)
        table.add(**row)
        report.add(parity_check(label, row))
        report.add(memory_check(label, row))
        if predicted is not None:
            report.add(predicted)
        if result.get("peak_mem_per_gpu"):
            report.add(gpu_memory_check(label, result["peak_mem_per_gpu"]))
        if size is not None:
            steps = result["steps"][1:] or result["steps"]
            blocked = statistics.median(s["comm_blocked_s"] for s in steps) if row["comm_calls_per_step"] else None
            sweep.setdefault(name, []).append({"strategy": name, "bucket_mb": size,
                                               "step_time_p50_s": row["step_time_p50_s"],
                                               "exposed_comm_s": exposed if exposed is not None else blocked,
                                               "comm_calls_per_step": row["comm_calls_per_step"]})
    if sweep:
        add_bucket_sweep(report, sweep)
    return report


def add_bucket_sweep(report: Report, sweep: dict[str, list[dict[str, Any]]]) -> None:
    """Seed 003's exercise 5: step time and exposed communication per bucket size, the best named."""
    table = Table("bucket_sweep", ["strategy", "bucket_mb", "step_time_p50_s", "exposed_comm_s", "comm_calls_per_step"],
                  title="bucket size sweep (exposed communication: from the trace with --trace, else the time the "
                        "strategy waited on its collectives)", units={"bucket_mb": "MiB", "step_time_p50_s": "s",
                                                                      "exposed_comm_s": "s"})
    for name, rows in sweep.items():
        for r in rows:
            table.add(**r)
        best = min(rows, key=lambda r: r["step_time_p50_s"])
        others = ", ".join(f"{r['bucket_mb']:g} MiB {r['step_time_p50_s'] * 1e3:.1f} ms" for r in rows if r is not best)
        exposed = f"; exposed communication {best['exposed_comm_s'] * 1e3:.2f} ms per step" \
            if best["exposed_comm_s"] is not None else ""
        report.add(Check(f"compare buckets {name}", Status.OK,
                         f"best bucket size {best['bucket_mb']:g} MiB: {best['step_time_p50_s'] * 1e3:.1f} ms per step "
                         f"({others}){exposed}", details={"best_bucket_mb": best["bucket_mb"], "rows": rows}))
    report.tables.append(table)


def _one(cfg: TrainConfig, opts: LaunchOptions) -> dict[str, Any] | Report:
    holder: dict[str, Any] = {}

    def build(job: JobResult) -> Report:
        holder["result"] = job.results[0]
        return Report("train")

    report = execute("train", train_rank, cfg, opts, build)
    return holder.get("result", report)


def compare_row(name: str, result: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    steps = result["steps"][1:] or result["steps"]  # the first step pays for warm-up
    times = [s["step_time_s"] for s in steps]
    comm_time = sum(s["comm_time_s"] for s in steps)
    blocked = sum(s["comm_blocked_s"] for s in steps)
    diff = parity(result["params"], reference["params"])
    counted = statistics.median(s["comm_bytes"] for s in steps)
    uncounted = not result["counts_all_comm"] and counted == 0  # every collective is torch's own
    return {
        "strategy": name,
        "max_rel_param_diff": diff,
        "bitwise_equal": bool(torch.equal(result["params"], reference["params"])),
        "final_loss": result["steps"][-1]["loss"],
        "step_time_p50_s": statistics.median(times),
        "step_time_p95_s": percentile(times, 95),
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in steps),
        "peak_mem_bytes": max(s["peak_mem_bytes"] for s in steps),
        "model_state_bytes": result["steps"][-1]["model_state_bytes"],
        "expected_model_state_bytes": result["expected_model_state_bytes"],
        "comm_calls_per_step": None if uncounted else statistics.median(s["comm_calls"] for s in steps),
        "comm_bytes_per_step": None if uncounted else counted,
        "expected_comm_bytes_per_step": result["expected_comm_bytes_per_step"],
        "comm_wire_bytes_per_step": None if uncounted else statistics.median(s["comm_wire_bytes"] for s in steps),
        "comm_hidden_frac": None if comm_time == 0 else max(0.0, 1 - blocked / comm_time),  # fsdp2: nothing counted
        "predicted_step_time_s": None,
        # the step split as the harness sees it: the time the training thread waited on collectives, and the rest
        "measured_compute_s": None if uncounted else statistics.median(s["step_time_s"] - s["comm_blocked_s"]
                                                                        for s in steps),
        "measured_exposed_comm_s": None if uncounted else statistics.median(s["comm_blocked_s"] for s in steps),
        "measured_split": None if uncounted else "harness",  # "trace" when a trace of the run splits it
        "predicted_compute_s": None,
        "predicted_exposed_comm_s": None,
        "prediction_ratio": None,
        "prediction_miss": None,
    }


def gpu_memory_check(name: str, peaks: list[int]) -> Check:
    """One process over every GPU (dp): GPU 0 gathers the outputs and holds the optimizer, so it
    peaks above the others; how far is the cost of the single process."""
    others = max(peaks[1:]) if len(peaks) > 1 else 0
    ratio = f", {peaks[0] / others:.2f}x the others" if others else ""
    return Check(f"compare {name} memory", Status.OK, f"GPU 0 peaks at {peaks[0] / 2**20:,.0f} MiB, the other "
                 f"{len(peaks) - 1} at up to {others / 2**20:,.0f} MiB{ratio}", details={"peak_bytes_per_gpu": peaks})


def memory_check(name: str, row: dict[str, Any]) -> Check:
    measured, expected = row["model_state_bytes"], row["expected_model_state_bytes"]
    rel = abs(measured - expected) / expected
    ok = rel <= MEMORY_RTOL
    return Check(
        f"compare {name} model state",
        Status.OK if ok else Status.WARN,
        f"{name}: {measured / 2**20:.2f} MiB of parameters, gradients and optimizer state on the largest rank, "
        f"{rel:.1%} from the formula's {expected / 2**20:.2f} MiB",
        details={"model_state_bytes": measured, "expected_model_state_bytes": expected, "rel_diff": rel},
        hint=""
        if ok
        else "the strategy holds more (or less) than its sharding promises: look for unfreed gradients "
        "or unevenly split shards",
        where={"strategy": name},
    )


def parity(params: torch.Tensor, reference: torch.Tensor) -> float:
    """max |p - p_ref| / max |p_ref| over all parameters."""
    return float((params - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


def parity_check(name: str, row: dict[str, Any]) -> Check:
    diff = row["max_rel_param_diff"]
    ok = diff <= PARITY_RTOL
    how = "bitwise equal to" if row["bitwise_equal"] else f"within {diff:.2e} (relative) of"
    return Check(
        f"compare {name} parity",
        Status.OK if ok else Status.FAIL,
        f"{name}: parameters {how} the single-process run"
        if ok
        else f"{name}: parameters differ from the single-process run by {diff:.2e} (relative), above {PARITY_RTOL:g}",
        details={"max_rel_param_diff": diff, "bitwise_equal": row["bitwise_equal"]},
        hint="" if ok else "the strategy does not compute the same gradient mean: check its averaging and accumulation",
        where={"strategy": name},
    )
