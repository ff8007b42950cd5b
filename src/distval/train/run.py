"""`distval train`: one strategy trained on every rank (train/loop.py), and its report: the step
table, the training and replica checks, the health monitor's findings (with the launcher's
lost-time rule) and, with --trace, the analysis of the recorded steps. `compare` (train/compare.py)
builds its per-strategy runs from the same pieces."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from distval import meta
from distval.health.lost import LostTime
from distval.health.report import add_health as report_health
from distval.launch import JobResult, LaunchOptions, Watcher
from distval.launch.execute import execute, known_world_size, say_finding
from distval.protocol import Kind
from distval.results import Check, Report, Status, Table
from distval.train.config import TrainConfig
from distval.train.loop import train_rank

STEP_COLUMNS = ["step", "loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "comm_calls", "comm_bytes",
                "comm_time_s", "comm_blocked_s", "optimizer_s", "mfu", "peak_mem_bytes", "slowest_rank", "compute_skew"]


def steps_table(result: dict[str, Any]) -> Table:
    table = Table("steps", STEP_COLUMNS, title="training steps (loss: mean over ranks; step time: max over ranks)",
                  units={"step_time_s": "s", "optimizer_s": "s", "comm_bytes": "B", "peak_mem_bytes": "B",
                         "tokens_per_s": "tokens/s"})
    for row in result["steps"]:
        table.add(**{c: row[c] for c in STEP_COLUMNS})
    return table


def comm_ops_table(steps: list[dict[str, Any]]) -> Table | None:
    """What a step spends in each collective op on rank 0 (medians over the steps after the first):
    calls, bytes, issue to end, and the part the training thread waited (exposed communication,
    the step table's comm_blocked_s split by op). None when no step issued a collective."""
    steps = steps[1:] or steps  # the first step pays for warm-up
    ops = sorted({op for s in steps for op in s.get("comm_ops", {})})
    if not ops:
        return None
    table = Table("comm_ops", ["op", "calls", "bytes", "time_s", "blocked_s", "blocked_per_call_s"],
                  title="collectives per step on rank 0 (medians over the steps after the first; blocked: the "
                        "training thread waiting, the exposed communication)",
                  units={"bytes": "B", "time_s": "s", "blocked_s": "s", "blocked_per_call_s": "s"})
    for op in ops:
        calls, size, took, blocked = (statistics.median(s.get("comm_ops", {}).get(op, [0, 0, 0.0, 0.0])[i]
                                                        for s in steps) for i in range(4))
        table.add(op=op, calls=calls, bytes=size, time_s=took, blocked_s=blocked,
                  blocked_per_call_s=blocked / calls if calls else None)
    return table


def run_train(cfg: TrainConfig, opts: LaunchOptions, watchers: list[Watcher] | tuple = ()) -> Report | None:
    lost = LostTime(known_world_size(opts) or 1, cfg.health, step=_latest_step, on_finding=say_finding)

    def build(job: JobResult) -> Report:
        r0 = job.results[0]
        r0 = {**r0, "health": r0.get("health", []) + [f.to_dict() for f in lost.findings], "host": lost.host_note()}
        checksums = {r["checksum"] for r in job.results}
        report = Report(
            "train", meta=meta.collect(job, cfg, param_checksum=r0["checksum"], num_params=r0["num_params"])
        )
        report.tables.append(steps_table(r0))
        report.tables.extend(t for t in [comm_ops_table(r0["steps"])] if t is not None)
        first, last = r0["steps"][0]["loss"], r0["steps"][-1]["loss"]
        report.add(Check(f"train {cfg.strategy}", Status.OK, f"{cfg.steps} steps, loss {first:.3f} -> {last:.3f}",
                         details={"final_loss": last}))
        report.add(Check("train replicas", Status.OK if len(checksums) == 1 else Status.FAIL,
                         "every rank holds the same parameters" if len(checksums) == 1
                         else f"ranks disagree on the parameters: {len(checksums)} different checksums",
                         hint="" if len(checksums) == 1 else "the strategy does not keep replicas in sync"))
        add_health(report, r0, cfg)
        if cfg.trace.enabled:
            add_trace(report, cfg, r0["steps"])
        return report

    return execute("train", train_rank, cfg, opts, build, [*watchers, lost])


def _latest_step(reader: Any) -> int | None:
    row = reader.latest(0, Kind.STEP)
    return row.get("step") if row else None


def add_health(report: Report, result: dict[str, Any], cfg: TrainConfig) -> None:
    """The health monitor's findings (health/monitor.py), as a launched script's (health/report.py)."""
    checks = result.get("health_checks", {})
    if not checks.get("replicas_applicable", True):
        replicas = f"SKIP: {cfg.strategy} shards the parameters: no replicas to compare"
    elif not checks.get("replicas"):
        replicas = (f"SKIP: no check ran: {cfg.steps} steps, a check every {cfg.health.replicas_every} "
                    "(--check-replicas-every)")
    else:
        replicas = (f"every rank's parameters bitwise equal at {checks['replicas']} check(s), every "
                    f"{cfg.health.replicas_every} steps")
    report_health(report, result.get("health", []), result.get("health_ranks", []), cfg.health, replicas,
                  host=result.get("host"))


def add_trace(report: Report, cfg: TrainConfig, steps: list[dict[str, Any]],
              label: str = "") -> tuple[float, float] | None:
    """The analysis of the run's traces (trace/report.py): its breakdown table, and a check that
    its step times are the harness's (the traces mark the same region). Returns the exposed
    communication and waiting, and the communication overlapped with compute, per step (s, mean
    over ranks)."""
    from distval.trace.report import analyze, harness_check

    traced = analyze([Path(cfg.trace.dir)])
    report.add(harness_check(traced, {s["step"]: s["step_time_s"] for s in steps}, f"trace{label}", cfg.trace.dir))
    for c in traced.checks:
        if c.status is not Status.OK and c.name != "trace matching":
            c.name = f"trace{label} {c.name.removeprefix('trace ')}"
            report.add(c)
    breakdown = traced.table("trace_breakdown")
    if label and report.table("trace_breakdown"):  # compare: one table, a row per strategy and rank
        report.table("trace_breakdown").rows += [{"run": label.strip(), **r} for r in breakdown.rows]
    else:
        breakdown.columns = ["run", *breakdown.columns]
        breakdown.rows = [{"run": label.strip() or cfg.strategy, **r} for r in breakdown.rows]
        report.tables.append(breakdown)
    if not breakdown.rows:
        return None

    def per_step(*shares: str) -> float:  # the rows give shares of the step in percent
        return statistics.fmean(sum(r[k] for k in shares) / 100 * r["step_ms"] / 1e3 for r in breakdown.rows)

    return per_step("comm_exposed", "waiting_for_peers"), per_step("comm_overlapped")
