"""`distval scale`: one training workload measured at a ladder of world sizes, next to the planner.

A point is one real launch of the training harness (`train/loop.py`) at a world size W, the same
model, strategy and per-rank batch (weak scaling; `--strong` keeps the global batch of the largest
world instead). Every rank trains with one intra-op thread on CPU, so a rank is a core at every
point and the one-rank point is no faster than a rank of the others (GPUs: one device a rank).
After training, each point times an all_reduce of the gradient's bytes on its ranks (`busbw_gbps`).

Locally (`--nproc N`) distval launches every point itself (1, 2, 4, ... and N ranks, or
`--worlds`). Under torchrun, Slurm or `distval emulate` the command measures the one point of the
job it runs in and writes it (`--json`); `--join p1.json,p2.json,...` joins points measured by
separate jobs (one per node count) into the table. Either way the rows come from one function,
`scaling_rows`.

The prediction is the planner's (`train/compare.py` `predicted_step`, which calls
`plan.evaluate`): calibrated from this run's `comm bench` at the largest world (its α–β and
per-call cost; `--calibration FILE` gives one instead) and the strategy's own step costs, measured
on the one-rank point's rank after it trains (compare's reference probe). planned efficiency =
planned tokens/s(W) / (W x planned tokens/s(1)). Where measured and planned efficiency differ by
more than PLAN_BAND (20%), the row's `gap` names the category of the step whose error is the
largest (compute, optimizer, exposed communication), and where the ranks outnumber the cores it
says the compute shares them: the model already divides a rank's speed by its share of the cores,
and the host's scheduler does worse than that share; the table is not tuned to this host. A point
outside compare's PREDICTION_BAND (0.67-1.5x) of the plan is a WARN.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from distval import device as devices
from distval import meta
from distval.comm import bench
from distval.comm.config import BenchConfig
from distval.launch import LaunchOptions, planned_world_size
from distval.launch.execute import execute
from distval.plan import presets
from distval.plan.calibration import STEP_COST_COLUMNS, StepCost, load, save_costs
from distval.rank import RankContext
from distval.results import SCHEMA, Check, JobResult, Report, Status, Table, write_json
from distval.scale.config import PLAN_BAND, ScaleConfig
from distval.scale.pairs import allreduce_busbw, placement
from distval.train.compare import PREDICTION_BAND, predicted_step, reference_rank
from distval.train.config import StepProbe, TrainConfig
from distval.train.loop import train_rank
from distval.train.stepcosts import forward_backward_s, step_costs

SCALING_COLUMNS = ["world_size", "nodes", "ranks_per_node", "tokens_per_s", "step_time_s", "efficiency",
                   "planned_efficiency", "planned_step_time_s", "busbw_gbps", "grad_bytes", "oversubscribed", "gap"]
POINT_COLUMNS = ["world_size", "nodes", "ranks_per_node", "micro_batch", "tokens_per_step", "step_time_s",
                 "tokens_per_s", "compute_s", "optimizer_s", "exposed_comm_s", "busbw_gbps", "grad_bytes",
                 "num_tensors", "ranks_per_machine", "cores", "threads", "device"]
SKIP_STEPS = 3  # the first steps pay for allocation and warm-up
CALIBRATION_BENCH = BenchConfig(ops=("all_reduce", "all_gather", "reduce_scatter"), min_bytes=1024,
                                max_bytes=16 * 2**20, factor=4, iters=20, warmup=5, check_iters=0)
BUSBW_ITERS = 5
CATEGORIES = (("compute", "compute_s", "predicted_compute_s"), ("optimizer", "optimizer_s", "predicted_optimizer_s"),
              ("exposed communication", "exposed_comm_s", "predicted_exposed_comm_s"))


@dataclass(frozen=True)
class PointConfig:
    """One point's job: train, time the gradient's all_reduce, and optionally calibrate."""

    train: TrainConfig
    bench: BenchConfig | None = None  # the planner's calibration bench, at this point's world


# -- per rank ----------------------------------------------------------------------------------------


def point_rank(ctx: RankContext, cfg: PointConfig) -> dict[str, Any]:
    if ctx.device.type == "cpu":
        torch.set_num_threads(1)  # a rank is a core at every point, the one-rank point included
    hosts, machines = placement(ctx)
    result = reference_rank(ctx, cfg.train) if cfg.train.probe is not None else train_rank(ctx, cfg.train)
    grad_bytes = sum(result["param_sizes"]) * 4
    out = {"steps": result["steps"], "param_sizes": result["param_sizes"], "device": ctx.device.type,
           "hosts": hosts, "machines": machines, "threads": torch.get_num_threads(),
           "cores": len(os.sched_getaffinity(0)), "grad_bytes": grad_bytes, "busbw_gbps": None}
    if cfg.train.probe is not None:
        out["reference"] = {k: result[k] for k in ("probes", "world_cost", "probe_peak_flops", "num_params",
                                                    "optimizer_per_param_s", "optimizer_per_param_tensors_s")
                            if k in result}
    if ctx.world_size > 1:
        ctx.status("scale all_reduce at the gradient's size")
        out["busbw_gbps"] = grad_busbw(ctx, grad_bytes)
    if cfg.bench is not None:
        out["bench"] = bench.bench_rank(ctx, cfg.bench)
    return out


def grad_busbw(ctx: RankContext, grad_bytes: int) -> float:
    """all_reduce bus bandwidth (GB/s) at the gradient's size: median over BUSBW_ITERS blocking
    calls of the slowest rank's time."""
    buf = torch.ones(max(1, grad_bytes // 4), dtype=torch.float32, device=ctx.device)
    ctx.comm.all_reduce(buf)  # untimed: connections, allocation
    times = []
    for _ in range(BUSBW_ITERS):
        ctx.control_comm.barrier()
        start = time.perf_counter()
        ctx.comm.all_reduce(buf)
        devices.synchronize(ctx.device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        ctx.control_comm.all_reduce(elapsed, op="max")
        times.append(elapsed.item())
    return allreduce_busbw(buf, 1, statistics.median(times), ctx.world_size)


# -- one point's figures -----------------------------------------------------------------------------


def point_row(job: JobResult, cfg: TrainConfig) -> dict[str, Any]:
    """What a point measured, as a row of `scale_points` (the figures `scaling_rows` needs)."""
    result = job.results[0]
    steps = result["steps"][SKIP_STEPS:] or result["steps"]
    hosts, machines = result["hosts"], result["machines"]

    def median(f: Any) -> float:
        return statistics.median(f(s) for s in steps)

    spec = presets.model(cfg.model)
    return {"world_size": job.world_size, "nodes": len(set(hosts)),
            "ranks_per_node": max(hosts.count(h) for h in hosts), "micro_batch": cfg.micro_batch,
            "tokens_per_step": cfg.global_batch_for(job.world_size) * spec.seq_len,
            "step_time_s": median(lambda s: s["step_time_s"]), "tokens_per_s": median(lambda s: s["tokens_per_s"]),
            "compute_s": median(forward_backward_s), "optimizer_s": median(lambda s: s["optimizer_s"]),
            "exposed_comm_s": median(lambda s: s["comm_blocked_s"]), "busbw_gbps": result["busbw_gbps"],
            "grad_bytes": result["grad_bytes"], "num_tensors": len(result["param_sizes"]),
            "ranks_per_machine": max(machines.count(m) for m in machines), "cores": result["cores"],
            "threads": result["threads"], "device": result["device"]}


def oversubscribed(point: dict[str, Any]) -> bool:
    return point["device"] == "cpu" and point["ranks_per_machine"] * point["threads"] > point["cores"]


# -- the table ---------------------------------------------------------------------------------------


def scaling_rows(points: list[dict[str, Any]], cfg: TrainConfig, calibration: str | None,
                 cost: StepCost | None) -> list[dict[str, Any]]:
    """The `scaling` table from the points: measured efficiency against the smallest world's
    throughput per rank, planned efficiency from the planner at every world (needs a calibration
    and the strategy's step cost), and the category carrying a gap larger than PLAN_BAND."""
    points = sorted(points, key=lambda p: p["world_size"])
    base = points[0]
    planned = {p["world_size"]: _planned(p, cfg, calibration, cost) for p in points}
    plan_base = planned[base["world_size"]]
    rows = []
    for p in points:
        world, plan = p["world_size"], planned[p["world_size"]]
        per_rank = base["tokens_per_s"] / base["world_size"]
        efficiency = p["tokens_per_s"] / (world * per_rank)
        planned_eff = None
        if plan and plan_base:
            planned_eff = (p["tokens_per_step"] / plan["predicted_step_time_s"]) / (
                world / base["world_size"] * base["tokens_per_step"] / plan_base["predicted_step_time_s"])
        rows.append({"world_size": world, "nodes": p["nodes"], "ranks_per_node": p["ranks_per_node"],
                     "tokens_per_s": p["tokens_per_s"], "step_time_s": p["step_time_s"], "efficiency": efficiency,
                     "planned_efficiency": planned_eff,
                     "planned_step_time_s": plan["predicted_step_time_s"] if plan else None,
                     "busbw_gbps": p["busbw_gbps"], "grad_bytes": p["grad_bytes"], "oversubscribed": oversubscribed(p),
                     "gap": _gap(p, plan, base, plan_base, efficiency, planned_eff)})
    return rows


def _planned(point: dict[str, Any], cfg: TrainConfig, calibration: str | None,
             cost: StepCost | None) -> dict[str, Any] | None:
    if calibration is None or cost is None:
        return None
    at = dataclasses.replace(cfg, micro_batch=point["micro_batch"], global_batch=None)
    plan = predicted_step(at, cfg.strategy, point["world_size"], cost, calibration, point["num_tensors"],
                          point["device"])
    return plan or None


def _gap(point: dict[str, Any], plan: dict[str, Any] | None, base: dict[str, Any], plan_base: dict[str, Any] | None,
         efficiency: float, planned: float | None) -> str:
    """Where a gap beyond PLAN_BAND comes from. measured/planned efficiency is (the one-rank
    point's plan error) / (this point's plan error), each error = measured / planned step time:
    the larger of the two carries the gap, and within it the category of the step furthest from
    its plan."""
    if plan is None or plan_base is None or planned is None or abs(efficiency / planned - 1) <= PLAN_BAND:
        return ""
    errors = {"this point": (point, plan), "the smallest point": (base, plan_base)}
    which = max(errors, key=lambda k: abs(math.log(errors[k][0]["step_time_s"]
                                                   / errors[k][1]["predicted_step_time_s"])))
    measured_point, predicted = errors[which]
    ratio = measured_point["step_time_s"] / predicted["predicted_step_time_s"]
    diffs = {name: measured_point[m] - predicted[p] for name, m, p in CATEGORIES
             if measured_point.get(m) is not None and predicted.get(p) is not None}
    name = max(diffs, key=lambda k: abs(diffs[k]))
    what = (f"{which} took {ratio:.2f}x its planned step, most in {name} ({'+' if diffs[name] >= 0 else '-'}"
            f"{abs(diffs[name]) * 1e3:.1f} ms)")
    if name == "compute" and oversubscribed(measured_point):
        return f"{what}: compute sharing cores ({measured_point['ranks_per_machine']} ranks x " \
               f"{measured_point['threads']} thread(s) on {measured_point['cores']} cores)"
    return what


def scaling_checks(rows: list[dict[str, Any]], strong: bool) -> list[Check]:
    """A WARN per point whose measured efficiency is outside PREDICTION_BAND of the plan (compare's
    band for a step time: a miss to act on, not the host's draw), the row's `gap` saying where; one
    OK line with the largest point."""
    checks = []
    low, high = PREDICTION_BAND
    for r in rows[1:]:
        where = {"world_size": r["world_size"], "nodes": r["nodes"]}
        ratio = r["efficiency"] / r["planned_efficiency"] if r["planned_efficiency"] else None
        if r["gap"] and ratio is not None and not low <= ratio <= high:
            checks.append(Check(f"scale world {r['world_size']}", Status.WARN,
                                f"{r['world_size']} ranks: efficiency {r['efficiency']:.2f} against "
                                f"{r['planned_efficiency']:.2f} planned ({ratio:.2f}x, outside {low:g}-{high:g}x): "
                                f"{r['gap']}", where=where, details=r,
                                hint="the planner models what it measured at the largest world and on one rank; "
                                     "trace the point (`distval train --trace`) to see where the step goes"))
    kind = "strong" if strong else "weak"
    last = rows[-1]
    planned = f" (planned {last['planned_efficiency']:.2f})" if last["planned_efficiency"] is not None else \
        " (no plan: no calibration)"
    marks = [str(r["world_size"]) for r in rows if r["oversubscribed"]]
    crowded = f"; ranks outnumber cores at {', '.join(marks)} ranks" if marks else ""
    checks.append(Check("scale", Status.OK,
                        f"{kind} scaling {rows[0]['world_size']} -> {last['world_size']} ranks: "
                        f"{last['tokens_per_s']:,.0f} tokens/s, efficiency {last['efficiency']:.2f}{planned}{crowded}",
                        details={"rows": rows}))
    return checks


def scale_report(points: list[dict[str, Any]], cfg: TrainConfig, scale: ScaleConfig, calibration: str | None,
                 cost: StepCost | None, extra: list[Table], job: JobResult | None = None) -> Report:
    rows = scaling_rows(points, cfg, calibration, cost)
    report = Report("scale", meta=meta.collect(job, cfg, scaling="strong" if scale.strong else "weak",
                                               calibration=calibration, worlds=[p["world_size"] for p in points]))
    report.tables.append(Table("scaling", SCALING_COLUMNS, rows=rows,
                               title=f"{'strong' if scale.strong else 'weak'} scaling of {cfg.strategy} on "
                                     f"{cfg.model}: measured against planned",
                               units={"tokens_per_s": "tokens/s", "step_time_s": "s", "planned_step_time_s": "s",
                                      "busbw_gbps": "GB/s", "grad_bytes": "B"}))
    report.tables.append(Table("scale_points", POINT_COLUMNS, rows=points,
                               title="what each point measured (medians over its steps after the first "
                                     f"{SKIP_STEPS})",
                               units={"step_time_s": "s", "compute_s": "s", "optimizer_s": "s", "exposed_comm_s": "s",
                                      "busbw_gbps": "GB/s", "grad_bytes": "B"}))
    report.tables += extra
    report.checks += scaling_checks(rows, scale.strong)
    return report


# -- running the ladder ------------------------------------------------------------------------------


def at_world(cfg: TrainConfig, scale: ScaleConfig, world: int, top: int) -> TrainConfig:
    """The workload at `world`: weak scaling keeps the micro-batch; strong scaling keeps the global
    batch of the largest world (one line, exit 2, when it does not split evenly)."""
    if not scale.strong:
        return dataclasses.replace(cfg, global_batch=None)
    total = cfg.micro_batch * top
    if total % world:
        raise ValueError(f"--strong: the global batch {total} (--micro-batch {cfg.micro_batch} x {top} ranks) does "
                         f"not split over {world} ranks; choose --worlds that divide it")
    return dataclasses.replace(cfg, micro_batch=total // world, global_batch=None)


def run_scale(cfg: TrainConfig, scale: ScaleConfig, opts: LaunchOptions, calibration: str | None = None,
              progress: Any = None) -> Report:
    """Every point of the ladder launched here (local mode); `calibration`: a bench report to plan
    with instead of benching (its step costs used when it has the strategy's)."""
    top = planned_world_size(opts)
    worlds = scale.ladder(top)
    configs = {w: at_world(cfg, scale, w, worlds[-1]) for w in worlds}
    given = load(calibration) if calibration else None
    cost = given.cost(strategy_plan_model(cfg.strategy), cfg.strategy) if given else None
    cost = cost if cost is not None and cost.strategy == cfg.strategy else None
    with tempfile.TemporaryDirectory(prefix="distval-scale-") as scratch:
        points, extra, reference = [], [], None
        for world in worlds:
            bench_here = world == worlds[-1] and world > 1 and scale.bench and given is None
            probe = world == 1 and cost is None and (scale.bench or given is not None)  # step costs: one rank
            train = configs[world]
            if probe:
                train = dataclasses.replace(train, probe=StepProbe((cfg.strategy,), train.micro_batch, 1, worlds[-1]))
            if progress:
                progress(world)
            job_or_report = _launch(PointConfig(train, CALIBRATION_BENCH if bench_here else None),
                                    dataclasses.replace(opts, nproc=world))
            if isinstance(job_or_report, Report):
                return job_or_report  # a point failed: its ERROR says why
            job = job_or_report
            points.append(point_row(job, configs[world]))
            if probe:
                reference = job.results[0]
            if bench_here:
                path = str(Path(scratch) / "bench.json")
                bench_report = bench.build_report(_bench_job(job), CALIBRATION_BENCH)
                write_json(bench_report, path)
                extra += bench_report.tables
                calibration = path
        if reference is not None and calibration is not None:
            cost, costs_table = _probe_cost(cfg, reference, calibration)
            extra.append(costs_table)
        return scale_report(points, cfg, scale, calibration if cost else None, cost, extra)


def strategy_plan_model(name: str) -> str:
    from distval import strategies

    return strategies.REGISTRY[name].plan_model


def _launch(cfg: PointConfig, opts: LaunchOptions) -> JobResult | Report | None:
    """One point's job: its JobResult on the reporting process, a report of its failure, or None
    on ranks other than 0 under an outer launcher."""
    holder: dict[str, JobResult] = {}

    def build(job: JobResult) -> Report:
        holder["job"] = job
        return Report("scale")

    report = execute("scale", point_rank, cfg, opts, build)
    return holder.get("job") or report


def _bench_job(job: JobResult) -> JobResult:
    return dataclasses.replace(job, results=[r["bench"] for r in job.results])


def _costs_table(cfg: TrainConfig, reference: dict[str, Any]) -> tuple[StepCost | None, Table]:
    """The strategy's step cost from the one-rank point's probe, and its `step_costs` table."""
    costs = step_costs(cfg, {**reference["reference"], "param_sizes": reference["param_sizes"]})
    table = Table("step_costs", STEP_COST_COLUMNS, rows=[dataclasses.asdict(c) for c in costs],
                  title="the strategy's own costs, measured on the one-rank point's rank (the plan's step costs)",
                  units={"overhead_s": "s", "optimizer_s": "s", "optimizer_per_param_s": "s"})
    return (costs[0] if costs else None), table


def _probe_cost(cfg: TrainConfig, reference: dict[str, Any], calibration: str) -> tuple[StepCost | None, Table]:
    """The step cost and its table, saved into the calibration file (where `plan --calibration`
    finds it, as compare saves its own)."""
    cost, table = _costs_table(cfg, reference)
    save_costs(calibration, table.to_dict())
    return cost, table


# -- one point under an outer launcher, and points joined ---------------------------------------------


def run_point(cfg: TrainConfig, scale: ScaleConfig, opts: LaunchOptions) -> Report | None:
    """Under torchrun/Slurm/emulate: the one point of this job (with the probe at world 1 and the
    calibration bench at 2+ ranks), as a scale report of one row; None on ranks other than 0."""
    world = planned_world_size(opts)
    train = at_world(cfg, scale, world, world)
    if world == 1 and scale.bench:
        train = dataclasses.replace(train, probe=StepProbe((cfg.strategy,), train.micro_batch, 1, 1))
    point_cfg = PointConfig(train, CALIBRATION_BENCH if world > 1 and scale.bench else None)
    job = _launch(point_cfg, opts)
    if not isinstance(job, JobResult):
        return job  # a report with the failure's ERROR, or None on ranks other than 0
    extra: list[Table] = []
    if point_cfg.bench is not None:
        extra += bench.build_report(_bench_job(job), CALIBRATION_BENCH).tables
    if train.probe is not None:
        extra.append(_costs_table(cfg, job.results[0])[1])
    out = scale_report([point_row(job, train)], cfg, scale, None, None, extra, job)
    out.add(Check("scale point", Status.OK, f"one point at {world} ranks ({out.table('scaling').rows[0]['nodes']} "
                  "node(s)); join the points of several jobs with `distval scale --join p1.json,p2.json,...`"))
    return out


def join_points(cfg: TrainConfig, scale: ScaleConfig) -> Report:
    """`--join`: the points of several `scale --json` files; the plan calibrated from the largest
    point's bench and the one-rank point's step costs."""
    docs = [_read_point(path) for path in scale.from_reports]
    points = [row for doc in docs for row in doc["tables"]["scale_points"]["rows"]]
    worlds = [p["world_size"] for p in points]
    if len(set(worlds)) != len(worlds):
        raise ValueError(f"--join: two files measured the same world size ({sorted(worlds)})")
    benched = [d for d in docs if "alpha_beta" in d["tables"]]
    costs = [d for d in docs if "step_costs" in d["tables"]]
    if not benched or not costs:
        return scale_report(points, cfg, scale, None, None, [])
    top = max(benched, key=lambda d: d["meta"].get("world_size", 0))
    with tempfile.TemporaryDirectory(prefix="distval-scale-") as scratch:
        path = str(Path(scratch) / "bench.json")
        tables = {k: v for k, v in top["tables"].items() if k in ("bench", "alpha_beta", "call_costs", "overlap_costs")}
        tables["step_costs"] = costs[0]["tables"]["step_costs"]
        doc = {"schema": SCHEMA, "command": "comm bench", "meta": top["meta"], "tables": tables}
        Path(path).write_text(json.dumps(doc), encoding="utf-8")
        cost = load(path).cost(strategy_plan_model(cfg.strategy), cfg.strategy)
        return scale_report(points, cfg, scale, path, cost, [])


def _read_point(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--join {path}: cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--join {path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or doc.get("command") != "scale" or "scale_points" not in doc.get("tables", {}):
        raise ValueError(f"--join {path}: not a `distval scale --json` report; write one with "
                         "`distval scale --json FILE` in each job")
    return doc
