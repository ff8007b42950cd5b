"""`distval compare` as a library function that returns a Report (one run of `distval train`: train/run.py).

compare: a single-process reference run (world of 1, micro-batch = world x micro-batch, same
accumulation, same seed, so it sees exactly the samples all ranks see together), then each
strategy on `nproc` ranks; per strategy the parity of the final parameters with the reference
(max |p - p_ref| / max |p_ref|), step time, tokens/s, peak memory, collectives per step against
the strategy's expected volume, and the share of communication hidden behind compute
(1 - exposed/total, where exposed is the time the training thread waited on collectives; for
pytorch_ddp and pytorch_zero1 the wait inside backward from the last bucket's launch to backward's
return; fsdp2's collectives go through the layer as FSDP2's custom all-gather and reduce-scatter),
the model state each rank holds
(parameters, gradients, optimizer state, shards: the largest rank) against the strategy's formula
and the planner's prediction, and with `--calibration bench.json` the step time `distval plan`
predicts, category by category (forward+backward, optimizer, exposed communication), from the
bench's α–β fit and per-call cost and the step costs the reference's process measures on one rank
(docs/plan.md "Step costs"; saved into the calibration file).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import torch

from distval import meta, strategies
from distval.launch import JobResult, LaunchOptions, planned_world_size
from distval.launch.execute import execute
from distval.plan.calibration import STEP_COST_COLUMNS, StepCost
from distval.plan.schedule import COMM
from distval.results import Check, Report, Status, Table
from distval.stats import percentile
from distval.trace.config import TraceConfig
from distval.train.config import StepProbe, TrainConfig
from distval.train.loop import train_rank
from distval.train.run import add_trace
from distval.train.stepcosts import (
    at_rank_speed,
    forward_backward_s,
    measure,
    rank_threads,
    save_step_costs,
    step_costs,
)

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
    "measured_overlapped_comm_s",
    "predicted_overlapped_comm_s",
    "predicted_calls_per_step",
    "measured_optimizer_s",
    "predicted_optimizer_s",
    "predicted_overhead_s",
    "prediction_ratio",
    "prediction_miss",
]
MEMORY_RTOL = 0.10  # measured model state against the formula
# measured/predicted step time outside this band is a WARN naming the category that carries the error
PREDICTION_BAND = (0.67, 1.5)
PARITY_RTOL = 1e-5


def reference_rank(ctx: Any, cfg: TrainConfig) -> dict[str, Any]:
    """The reference run, then (cfg.probe) the step costs measured on its rank for the planner
    (train/stepcosts.py `measure`)."""
    result = train_rank(ctx, cfg)
    result["probes"] = {}
    if cfg.probe is not None:
        measure(ctx, cfg, result)
    return result


def predicted_step(cfg: TrainConfig, name: str, world: int, cost: StepCost, calibration: str,
                   num_tensors: int, device_type: str = "cpu") -> dict[str, float | None]:
    """The planner's step for this run, in the categories the harness measures: forward+backward
    (FLOPs at the MFU the plain model reached on one rank with a rank's micro-batch and threads, of
    the peak measured there, plus the strategy's own cost measured alike), the optimizer phase, and
    the communication not hidden behind them (the α–β fit of a `comm bench` on this fabric and its
    per-call cost, scheduled by the planner). Where the ranks' threads outnumber the cores (3
    ranks on 2), every rank's compute is slowed by its share of them. A strategy whose collectives
    are torch's own (fsdp2) waits for the gradient norm's all_reduce inside the optimizer phase the
    harness times: its predicted optimizer holds that all_reduce too, so the categories compare."""
    from distval.plan import PlanConfig, evaluate, resolve
    from distval.plan.steps import MIB, NORM_LABEL

    cost = at_rank_speed(cost, world, device_type)
    strategy = strategies.REGISTRY[name]
    bucket_mb = cfg.strategy_cfg.bucket_mb
    if strategy.call_per_tensor:  # the planner sees buckets of the mean tensor's size: each call pays its α
        bucket_mb = cost.num_params * 4 / num_tensors / MIB  # (simple_ddp's K syncs: not modelled)
    overlap = strategy.overlaps_backward and (device_type == "cuda" or not strategy.overlaps_only_with_streams)
    plan = PlanConfig(model=cfg.model, micro_batch=cfg.micro_batch, grad_accum=cfg.grad_accum, world_size=world,
                      peak_tflops=cost.peak_flops / 1e12, mfu=cost.mfu, strategy=strategy.plan_model,
                      bucket_mb=bucket_mb, calibration=calibration, overlap=overlap)
    result = evaluate(plan, dataclasses.replace(resolve(plan), cost=cost))
    step, compute = result.step_time_s, result.compute_time_s
    if step is None or compute is None:
        return {}
    compute += result.interference_time_s  # what overlapped collectives slow forward+backward by
    exposed = max(0.0, step - compute)
    norm = 0.0 if strategy.counts_all_comm else min(exposed, sum(
        p.repeat * (t.duration_s or 0.0) for p in result.phases for t in p.tasks if t.label == NORM_LABEL))
    return {"predicted_step_time_s": step, "predicted_compute_s": compute - result.optimizer_time_s,
            "predicted_optimizer_s": result.optimizer_time_s + norm, "predicted_overhead_s": result.overhead_time_s,
            "predicted_exposed_comm_s": exposed - norm,
            "predicted_overlapped_comm_s": max(0.0, (result.comm_time_s or 0.0) - exposed),
            # what the harness counts: not the norm's all_reduce where that is torch's own
            "predicted_calls_per_step": sum(p.repeat for p in result.phases for t in p.tasks if t.stream == COMM
                                            and (strategy.counts_all_comm or t.label != NORM_LABEL))}


CATEGORIES = {  # a category of the step: (measured column, predicted column)
    "compute": ("measured_compute_s", "predicted_compute_s"),
    "optimizer": ("measured_optimizer_s", "predicted_optimizer_s"),
    "exposed communication": ("measured_exposed_comm_s", "predicted_exposed_comm_s"),
}
HINTS = {  # where a miss is, and what to do
    "compute": ("the error is in forward and backward",
                "the plan's forward+backward is the model's FLOPs at the MFU the plain model reached on one rank, plus "
                "the strategy's own cost measured there; what only happens with peers (hooks waiting on them, the "
                "backend's threads taking the compute's cores) is not in it: trace the run (--trace) to see where "
                "the time goes"),
    "optimizer": ("the error is in the optimizer step",
                  "the plan's optimizer step is measured on one rank alone (its per-parameter part divided by "
                  "sharding); ranks updating at once share the host's memory bandwidth: trace the run (--trace)"),
    "exposed communication": ("the error is in the communication not hidden behind compute",
                              "the plan's collectives are the bench's α–β fit plus its measured per-call cost after "
                              "compute, with the overlap the planner schedules; the per-call cost varies on a shared "
                              "host (run `comm bench` again), and a trace (--trace) shows what this strategy hides"),
    "unsplit": ("the harness cannot split forward+backward from this strategy's communication (its collectives are "
                "torch's own and not timed)",
                "trace the run (--trace) to split it"),
}


def prediction_check(name: str, row: dict[str, Any]) -> Check | None:
    """Measured against predicted step time: OK inside PREDICTION_BAND, else a WARN naming the
    category (compute, optimizer, or the communication not hidden behind them) whose error is the
    largest, with what to do. Sets the row's `prediction_ratio` and `prediction_miss`; None without
    a prediction."""
    measured, predicted = row["step_time_p50_s"], row.get("predicted_step_time_s")
    if not predicted:
        return None
    ratio = row["prediction_ratio"] = measured / predicted
    lo, hi = PREDICTION_BAND
    known = {k: (row.get(m), row.get(p)) for k, (m, p) in CATEGORIES.items()
             if row.get(m) is not None and row.get(p) is not None}
    split = "; ".join(f"{k} {m * 1e3:.1f} vs {p * 1e3:.1f} ms" for k, (m, p) in known.items()) + (
        " (split by the trace)" if known and row.get("measured_split") == "trace" else "")
    text = f"{name}: measured {measured * 1e3:.1f} ms against the plan's {predicted * 1e3:.1f} ms ({ratio:.2f}x)" + (
        f": {split}" if split else "")
    details = {"ratio": ratio, "band": list(PREDICTION_BAND), "categories": {k: {"measured_s": m, "predicted_s": p}
                                                                             for k, (m, p) in known.items()}}
    if lo <= ratio <= hi:
        row["prediction_miss"] = None
        return Check(f"compare {name} prediction", Status.OK, text, details=details)
    errors = {k: abs(m - p) for k, (m, p) in known.items()}
    if "compute" not in known:  # forward+backward and the communication are one measured figure
        opt = known.get("optimizer", (0.0, 0.0))
        errors["unsplit"] = abs((measured - opt[0]) - (predicted - opt[1]))
    miss = max(errors, key=errors.__getitem__)
    row["prediction_miss"] = miss
    where, hint = HINTS[miss]
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
    runs = compare_runs(strategy_names, sizes)
    # with a calibration, the reference's rank also measures each strategy's own costs (step_costs)
    probe = StepProbe(tuple(dict.fromkeys(n for _, n, _ in runs if not strategies.REGISTRY[n].single_process)),
                      cfg.micro_batch, rank_threads(world), world) if calibration else None
    ref_cfg = dataclasses.replace(cfg, strategy="simple_ddp_ga", micro_batch=cfg.micro_batch * world,
                                  return_params=True, trace=TraceConfig(), probe=probe)
    reference = _one(ref_cfg, dataclasses.replace(opts, nproc=1), reference_rank)
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
    costs = {c.strategy: c for c in step_costs(cfg, reference)}
    if costs:  # in the report, and in the calibration file, where `plan --calibration` finds them
        rows = [dataclasses.asdict(c) for c in costs.values()]
        report.tables.append(Table("step_costs", STEP_COST_COLUMNS, rows=rows,
                                   title="each strategy's own costs, measured on one rank (the plan's step costs)",
                                   units={"overhead_s": "s", "optimizer_s": "s", "optimizer_per_param_s": "s"}))
        report.add(save_step_costs(calibration, report.tables[-1], world, reference.get("world_cost"),
                                   cfg.micro_batch))
    sweep: dict[str, list[dict[str, Any]]] = {}
    for label, name, size in runs:
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
            if name in costs:
                row.update(predicted_step(run_cfg, name, world, costs[name], calibration, len(reference["param_sizes"]),
                                          result["device"]))
            row.update(predicted_memory(run_cfg, name, world))
        exposed = None
        traced = add_trace(report, run_cfg, result["steps"], label=f" {label}") if run_cfg.trace.enabled else None
        if traced is not None:  # the trace splits any strategy's step, torch's own collectives included
            exposed, overlapped = traced
            row.update(measured_split="trace", measured_exposed_comm_s=exposed, measured_overlapped_comm_s=overlapped,
                       measured_compute_s=max(0.0, row["step_time_p50_s"] - exposed - row["measured_optimizer_s"]))
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
    """A bucket-size sweep: step time and exposed communication per bucket size, the best named."""
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


def _one(cfg: TrainConfig, opts: LaunchOptions, rank_fn: Any = train_rank) -> dict[str, Any] | Report:
    holder: dict[str, Any] = {}

    def build(job: JobResult) -> Report:
        holder["result"] = job.results[0]
        return Report("train")

    report = execute("train", rank_fn, cfg, opts, build)
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
        "comm_hidden_frac": None if comm_time == 0 else max(0.0, 1 - blocked / comm_time),  # None: nothing counted
        "predicted_step_time_s": None,
        # the step split as the harness sees it: the time the training thread waited on collectives, and the rest
        "measured_compute_s": None if uncounted else statistics.median(map(forward_backward_s, steps)),
        "measured_exposed_comm_s": None if uncounted else statistics.median(s["comm_blocked_s"] for s in steps),
        "measured_split": None if uncounted else "harness",  # "trace" when a trace of the run splits it
        "predicted_compute_s": None,
        "predicted_exposed_comm_s": None,
        # collectives in flight while the training thread went on (from each issue until its wait began)
        "measured_overlapped_comm_s": None if uncounted else max(0.0, comm_time - blocked) / len(steps),
        "predicted_overlapped_comm_s": None,
        "predicted_calls_per_step": None,
        "measured_optimizer_s": statistics.median(s["optimizer_s"] for s in steps),
        "predicted_optimizer_s": None,
        "predicted_overhead_s": None,
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
