"""The ladder's climb: each stage in order, a typed result per stage, one report (docs/ladder.md)."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from distval import launch, meta
from distval.comm import bench, check
from distval.health.diagnose import WorkerFailure
from distval.ladder.config import (
    COMPARE_STRATEGIES,
    DRILLS,
    IN_JOB_A,
    LOCAL_ONLY,
    SCALED_STRATEGY,
    STAGES,
    TRACED_STRATEGY,
    RunConfig,
)
from distval.launch import JobResult, LaunchOptions
from distval.launch.execute import failure_check
from distval.rank import RankContext
from distval.results import CannotRun, Check, Report, Status, Table, atomic_write_text, write_json

LADDER_COLUMNS = ["stage", "status", "seconds", "headline", "hint"]
_SEVERITY = (Status.ERROR, Status.FAIL, Status.WARN, Status.OK, Status.SKIP)  # a stage takes its worst check's
_STOPS = (Status.ERROR, Status.FAIL)
_STATUS_PREFIX = {"doctor": "doctor", "comm check": "check", "comm bench": "bench"}  # job A's rank status -> stage

# Under an outer launcher the rank function runs in this very process: what the ranks agreed
# inside job A is known on every rank here, so every rank takes the same next stage.
_AGREED: dict[str, bool] = {}


class Progress:
    """The progress display's two moments (the command prints them; the library stays silent)."""

    def start(self, index: int, total: int, name: str) -> None:
        """Stage `index` (from 0) of `total` begins."""

    def end(self, index: int, total: int, result: StageResult) -> None:
        """Stage `index` ended with `result`."""


@dataclass
class StageResult:
    name: str
    status: Status
    seconds: float = 0.0
    headline: str = ""
    hint: str = ""
    checks: list[Check] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, checks: list[Check], tables: list[Table], headline: str) -> StageResult:
        """The stage's status is its worst check's; a stage that is not OK leads with the summary
        and hint of the check that made it so."""
        status = next((s for s in _SEVERITY if any(c.status is s for c in checks)), Status.SKIP)
        worst = next((c for c in checks if c.status is status), None)
        if status in (Status.OK, Status.SKIP) or worst is None:
            return cls(name, status, headline=headline, checks=checks, tables=tables)
        return cls(name, status, headline=worst.summary, hint=worst.hint, checks=checks, tables=tables)

    @classmethod
    def skipped(cls, name: str, why: str, hint: str = "") -> StageResult:
        return cls(name, Status.SKIP, headline=why, hint=hint)


def job_a_rank(ctx: RankContext, cfg: RunConfig) -> dict[str, Any]:
    """Doctor's rank probe, then the check, then the bench, in one set of workers. The ranks
    agree whether the check found a wrong result; if it did, no rank runs the bench."""
    from distval.doctor.run import rank_probe

    out: dict[str, Any] = {"seconds": {}}
    began = time.monotonic()

    def timed(stage: str) -> None:
        nonlocal began
        out["seconds"][stage] = time.monotonic() - began
        began = time.monotonic()

    if "doctor" in cfg.stages:
        out["ranks"] = rank_probe(ctx, cfg.doctor)
        timed("doctor")
    check_ok = True
    if "check" in cfg.stages:
        out["check"] = check.check_rank(ctx, cfg.check)
        check_ok = max(ctx.exchange(int(any(o["status"] == "wrong" for o in out["check"])))) == 0
        timed("check")
    out["check_ok"] = _AGREED["check_ok"] = check_ok
    if "bench" in cfg.stages and (check_ok or cfg.keep_going):
        out["bench"] = bench.bench_rank(ctx, cfg.bench)
        timed("bench")
    return out


class Ladder:
    """One climb, shown stage by stage through `progress`."""

    def __init__(self, cfg: RunConfig, opts: LaunchOptions, progress: Progress | None = None):
        self.cfg, self.opts = cfg, opts
        self.progress = progress or Progress()
        _AGREED.clear()
        self.mode = launch.detect_mode()
        self.reporter = self.mode == "local" or os.environ.get("RANK", "0") == "0"
        self.cfg = replace(cfg, doctor=replace(cfg.doctor, under_launcher=self.mode != "local"))
        self.out = Path(cfg.out_dir)
        self.results: dict[str, StageResult] = {}
        self.stopped_by: str | None = None
        self.world = launch.planned_world_size(opts)
        self.calibration: str | None = None  # bench.json, once the bench has run
        self.job_a: JobResult | StageResult | None = None  # a StageResult: the job failed in that stage
        self.job_a_ran = False
        self.trained: Report | None = None
        self.trained_ran = False

    # -- the climb ---------------------------------------------------------------------------------
    def run(self) -> Report | None:
        started = time.monotonic()
        chosen = [s for s in STAGES if s in self.cfg.stages]
        for index, name in enumerate(chosen):
            if self.reporter:
                self.progress.start(index, len(chosen), name)
            began = time.monotonic()
            why = self._why_not(name)
            result = StageResult.skipped(name, *why) if why else getattr(self, f"_{name}")()
            if result is None:  # a rank other than 0 under an outer launcher: rank 0 reports
                result = StageResult(name, Status.SKIP)
            if not result.seconds:
                result.seconds = time.monotonic() - began
            self.results[name] = result
            if result.status in _STOPS and not self.cfg.keep_going and self.stopped_by is None:
                self.stopped_by = name
            if self.reporter:
                self.progress.end(index, len(chosen), result)
        return self._report(time.monotonic() - started) if self.reporter else None

    def _why_not(self, name: str) -> tuple[str, str] | None:
        """Why a stage does not run (its headline and hint), or None. Under an outer launcher a
        stage that launches ranks goes by what every rank knows (job A's outcome, the check's
        agreed verdict), never by rank 0's report alone, so no rank enters a job its peers skip."""
        mend = "mend that stage, or rerun with --keep-going"
        if self.mode != "local" and name in LOCAL_ONLY:
            return (f"{name} starts local jobs of its own: run `distval run --only {name}` on one node", "")
        if self.mode != "local" and name in ("trace", "health"):
            if isinstance(self.job_a, StageResult):
                return f"not run: the job failed in {self.job_a.name}", mend
            if not _AGREED.get("check_ok", True) and not self.cfg.keep_going:
                return "not run: check failed first", mend
            return None
        return (f"not run: {self.stopped_by} failed first", mend) if self.stopped_by else None

    # -- job A: doctor, check, bench ------------------------------------------------------------------
    def _doctor(self) -> StageResult:
        from distval.doctor import ranks
        from distval.doctor import report as doctor_report

        began = time.monotonic()
        checks, tables = [], []
        if self.mode == "local":  # this host, before any worker starts: a broken interface stops here
            host, facts = doctor_report.host_checks(self.cfg.doctor)
            checks += host
            tables.append(doctor_report.interfaces_table(facts))
            if any(c.status in _STOPS for c in host) and not self.cfg.keep_going:
                return StageResult.of("doctor", checks, tables, "")
        job = self._run_job_a()
        if isinstance(job, StageResult):  # the job failed: in the probe (the doctor's ERROR) or in a later stage
            if job.name == "doctor":
                return job
            line = f"the ranks rendezvoused; the job then failed in {job.name}"
            return StageResult.of("doctor", checks, tables, line) if checks else StageResult.skipped("doctor", line)
        if job is None:
            return None
        if self.mode == "local":
            rank_checks, table = ranks.compare([r["ranks"] for r in job.results], job.ranks, job.world_size,
                                               self.cfg.doctor.expect_world)
            checks += rank_checks
            tables.append(table)
        else:
            built = doctor_report.build_ranks_report(_stage_job(job, "ranks"), self.cfg.doctor)
            checks, tables = built.checks, built.tables
        result = StageResult.of("doctor", checks, tables, self._doctor_line(checks))
        later = job.results[0]["seconds"]  # the job's start-up and probe are the doctor's, the rest its stages'
        result.seconds = time.monotonic() - began - later.get("check", 0.0) - later.get("bench", 0.0)
        return result

    def _doctor_line(self, checks: list[Check]) -> str:
        hosts = {c.where.get("host") for c in checks if c.where.get("host")}
        return (f"{sum(c.status is Status.OK for c in checks)} checks OK on {len(hosts) or 1} host(s); "
                f"{self.world} ranks rendezvoused")

    def _run_job_a(self) -> JobResult | StageResult | None:
        """Job A once, for whichever of its stages comes first; a failed job is the ERROR of the
        stage its ranks were in."""
        if self.job_a_ran:  # None on ranks other than 0 under an outer launcher: rank 0 reports
            return self.job_a
        self.job_a_ran = True
        first = next(s for s in IN_JOB_A if s in self.cfg.stages)
        try:
            self.job_a = launch.run(job_a_rank, self.cfg, self.opts)
        except CannotRun as e:
            if self.mode != "local" and isinstance(e, WorkerFailure) and not self.reporter:
                raise
            last = getattr(e, "last_status", "") or ""
            stage = next((s for p, s in _STATUS_PREFIX.items() if last.startswith(p) and s in self.cfg.stages), first)
            self.job_a = StageResult.of(stage, [failure_check("run", e)], [], "")
        return self.job_a

    def _job_a_stage(self, name: str) -> JobResult | StageResult | None:
        job = self._run_job_a()
        if isinstance(job, StageResult):
            return job if job.name == name else StageResult.skipped(name, f"not run: the job failed in {job.name}")
        return job

    def _check(self) -> StageResult | None:
        job = self._job_a_stage("check")
        if not isinstance(job, JobResult):
            return job
        report = check.build_report(_stage_job(job, "check"), self.cfg.check)
        counts = report.counts()
        unsupported = f"; {counts['SKIP']} not supported by {job.backend}" if counts["SKIP"] else ""
        return _in_job(job, StageResult.of("check", report.checks, report.tables,
                                           f"{counts['OK']} cases exact on {job.world_size} ranks{unsupported}"))

    def _bench(self) -> StageResult | None:
        job = self._job_a_stage("bench")
        if not isinstance(job, JobResult):
            return job
        if "bench" not in job.results[0]:
            return StageResult.skipped("bench", "not run: the check found wrong results on this fabric",
                                       "mend the check first; bandwidth of wrong results means nothing")
        report = bench.build_report(_stage_job(job, "bench"), self.cfg.bench)
        path = str(self.out / "bench.json")
        write_json(report, path)  # `distval plan --calibration` reads it too
        if job.world_size >= 2:  # one rank crosses no link: nothing to calibrate compare's plan with
            self.calibration = path
        return _in_job(job, StageResult.of("bench", report.checks, report.tables, _bench_line(report)))

    # -- compare, plan, drills ---------------------------------------------------------------------------
    def _plan(self) -> StageResult | None:
        """After compare: the plan extrapolates from the model compare just checked (the bench's
        α–β and per-call cost, the step costs and MFU compare measured on one rank, saved in
        bench.json); without compare, at the assumed MFU."""
        if not self.reporter:
            return None
        from distval.plan import report as plan_report
        from distval.plan.config import PlanConfig

        plan = PlanConfig(model=self.cfg.model, micro_batch=2, world_size=self.world, device=_device_preset(),
                          strategy="ddp", calibration=self.calibration)  # compare's micro-batch
        report = plan_report.build_report(plan)
        for t in report.tables:
            t.name = f"plan_{t.name}"
        step = report.table("plan_step").rows[0]
        comm = (f"comm {step['comm_time_s'] * 1e3:.2f} ms per step with the measured α–β" if step["comm_time_s"]
                is not None else "no link to plan the communication with (no bench ran)")
        if self.world < 2:
            comm = "no communication on one rank"
        total = f"step {step['step_time_s'] * 1e3:.2f} ms, " if step["step_time_s"] is not None else ""
        mfu = next(r for r in report.table("plan_assumptions").rows if r["input"] == "MFU")
        compute = (f"compute at the {mfu['value']:.0%} MFU and step costs compare measured"
                   if mfu["source"].startswith("measured") else
                   f"compute at an assumed {mfu['value']:.0%} MFU (the compare stage measures it)")
        line = f"ddp on {self.world} ranks: {total}{comm}; {compute}"
        return StageResult.of("plan", report.checks, report.tables, line)

    def _compare(self) -> StageResult:
        from distval.train.compare import run_compare
        from distval.train.config import TrainConfig

        report = run_compare(TrainConfig(model=self.cfg.model, steps=self.cfg.compare_steps),
                             list(COMPARE_STRATEGIES), self.opts, calibration=self.calibration)
        return StageResult.of("compare", report.checks, report.tables, _compare_line(report, self.world))

    def _scale(self) -> StageResult:
        """The quick form of `distval scale`: one rank and all of them, planned with the bench's
        α–β and the step costs compare saved in bench.json (no bench, no probe of its own)."""
        from distval.scale.config import ScaleConfig
        from distval.scale.run import run_scale
        from distval.train.config import TrainConfig

        if self.world < 2:
            return StageResult.skipped("scale", "one rank: nothing to scale to")
        report = run_scale(TrainConfig(model=self.cfg.model, strategy=SCALED_STRATEGY, steps=self.cfg.scale_steps),
                           ScaleConfig(worlds=(1, self.world), bench=False), self.opts, calibration=self.calibration)
        table = report.table("scaling")
        if table is None:
            return StageResult.of("scale", report.checks, report.tables, "")
        last = table.rows[-1]
        planned = f" (planned {last['planned_efficiency']:.2f})" if last["planned_efficiency"] is not None else ""
        line = (f"{SCALED_STRATEGY} 1 -> {last['world_size']} ranks: {last['tokens_per_s']:,.0f} tokens/s, "
                f"efficiency {last['efficiency']:.2f}{planned}")
        return StageResult.of("scale", report.checks, report.tables, line)

    def _drills(self) -> StageResult:
        from distval.drill import DrillConfig, run_drills

        if self.world < 2:
            return StageResult.skipped("drills", "the drills fault rank 1: they need at least 2 ranks")
        report = run_drills(DrillConfig(nproc=self.world, model=self.cfg.model, steps=self.cfg.drill_steps,
                                        drills=DRILLS))
        passed = sum(c.status is Status.OK for c in report.checks)
        return StageResult.of("drills", report.checks, report.tables,
                              f"{passed} of {len(DRILLS)} drills detected and recovered ({', '.join(DRILLS)})")

    # -- a traced run and its health ---------------------------------------------------------------------
    def _train(self) -> Report | StageResult | None:
        """The traced run, once, for the trace and the health stage."""
        if self.trained_ran:
            return self.trained
        self.trained_ran = True
        from distval.health.monitor import HealthConfig
        from distval.train.config import TrainConfig
        from distval.train.run import run_train

        trace = _trace_config(self.cfg, self.out) if "trace" in self.cfg.stages else None
        every = max(1, self.cfg.trace_steps // 3)  # the replica check runs three times in the short run
        cfg = TrainConfig(model=self.cfg.model, strategy=TRACED_STRATEGY, steps=self.cfg.trace_steps,
                          health=HealthConfig(replicas_every=every))
        if trace is not None:
            cfg = replace(cfg, trace=trace)
        self.trained = run_train(cfg, self.opts)
        return self.trained

    def _trace(self) -> StageResult | None:
        report = self._train()
        if report is None:
            return None
        checks = [c for c in report.checks if not c.name.startswith("health")]
        tables = [t for t in report.tables if t.name in ("steps", "trace_breakdown")]
        return StageResult.of("trace", checks, tables, _trace_line(report))

    def _health(self) -> StageResult | None:
        report = self._train()
        if report is None:
            return None
        checks = [c for c in report.checks if c.name.startswith("health")]
        if not checks:  # the run failed: its ERROR is the trace stage's (or this one's, alone)
            checks = [c for c in report.checks if c.status in _STOPS]
        tables = [t for t in report.tables if t.name in ("health", "rank_health")]
        found = [c for c in checks if c.status not in (Status.OK, Status.SKIP)]
        line = (f"{len(checks)} monitors quiet over {self.cfg.trace_steps} steps: no straggler, finite numerics, "
                "equal replicas, balanced memory") if not found else ""
        return StageResult.of("health", checks, tables, line)

    # -- the report ----------------------------------------------------------------------------------
    def _report(self, seconds: float) -> Report:
        report = Report("run", meta=meta.collect(self.job_a if isinstance(self.job_a, JobResult) else None, self.cfg,
                                                 world_size=self.world, backend=self.opts.backend, launch=self.mode,
                                                 stages=list(self.cfg.stages), quick=self.cfg.quick,
                                                 keep_going=self.cfg.keep_going, seconds=round(seconds, 1)))
        ladder = Table("ladder", LADDER_COLUMNS, title="the acceptance ladder, bottom layer first",
                       units={"seconds": "s"})
        report.tables.append(ladder)
        for r in self.results.values():
            ladder.add(stage=r.name, status=r.status.value, seconds=round(r.seconds, 2), headline=r.headline,
                       hint=r.hint or None)
            report.checks += r.checks
            report.tables += r.tables
        if self.stopped_by is not None:
            report.meta["stopped_at"] = self.stopped_by
        return report


def write_outputs(report: Report, out_dir: Path) -> dict[str, Path]:
    from distval.report.html import render_html

    paths = {"json": out_dir / "report.json", "html": out_dir / "report.html"}
    write_json(report, paths["json"])
    atomic_write_text(paths["html"], render_html(report.to_dict()))
    return paths


def run_ladder(cfg: RunConfig, opts: LaunchOptions, progress: Progress | None = None) -> Report | None:
    """The whole climb; the report on the rank that reports (None on the others)."""
    return Ladder(cfg, opts, progress).run()


# -- helpers ------------------------------------------------------------------------------------------
def _in_job(job: JobResult, result: StageResult) -> StageResult:
    """A stage of job A takes the time rank 0 spent in it (the job's start-up is the doctor's)."""
    result.seconds = job.results[0]["seconds"].get(result.name, 0.0)
    return result


def _stage_job(job: JobResult, key: str) -> JobResult:
    return JobResult(job.mode, job.backend, job.world_size, [r[key] for r in job.results], job.ranks)


def _device_preset() -> str:
    """The plan's device: the GPU's preset where one matches its name, else this host's CPU."""
    import torch

    from distval import device as devices
    from distval.plan import presets

    if torch.cuda.is_available():
        return presets.preset_for(devices.gpu_identity(torch.device("cuda", 0))) or "cpu"
    return "cpu"


def _trace_config(cfg: RunConfig, out: Path):
    """The traced run's folder (OUT/traces/run), emptied of an earlier run's rank files."""
    from distval.trace.config import TraceConfig

    folder = out / "traces" / "run"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return TraceConfig(cfg.trace_skip, cfg.trace_active, str(folder))


def _bench_line(report: Report) -> str:
    fits = {r["op"]: r for r in report.table("alpha_beta").rows} if report.table("alpha_beta") else {}
    rows = [r for r in report.table("bench").rows if r["op"] == "all_reduce"] if report.table("bench") else []
    if not rows:
        return f"{len(report.checks)} checks"
    top = max(rows, key=lambda r: r["bytes"])
    fit = fits.get("all_reduce")
    alpha = f"; α {fit['alpha_us']:.0f} µs, β {fit['beta_gbps']:.2f} GB/s" if fit and fit.get("alpha_us") else ""
    return f"all_reduce {top['busbw_gbps']:.2f} GB/s busbw at {top['bytes'] / 2**20:g} MiB{alpha}"


def _compare_line(report: Report, world: int) -> str:
    table = report.table("strategies")
    rows = table.rows if table else []
    if not rows:
        return ""
    ratios = [r["step_time_p50_s"] / r["predicted_step_time_s"] for r in rows if r.get("predicted_step_time_s")]
    plan = (f"; measured/planned step time {min(ratios):.2f}–{max(ratios):.2f}" if ratios else
            f"; no plan to compare with ({'one rank: no link measured' if world < 2 else 'no bench ran'})")
    return (f"{len(rows)} strategies match the reference; step {min(r['step_time_p50_s'] for r in rows) * 1e3:.1f}–"
            f"{max(r['step_time_p50_s'] for r in rows) * 1e3:.1f} ms{plan}")


def _trace_line(report: Report) -> str:
    table = report.table("trace_breakdown")
    if not table or not table.rows:
        steps = report.table("steps")
        times = [r["step_time_s"] for r in steps.rows[1:]] if steps else []
        return f"{len(times) + 1} steps, {statistics.median(times) * 1e3:.1f} ms median (not traced)" if times else ""
    mean = {k: statistics.fmean(r[k] for r in table.rows) for k in ("step_ms", "compute", "comm_exposed",
                                                                      "waiting_for_peers", "idle")}
    return (f"step {mean['step_ms']:.1f} ms: compute {mean['compute']:.0f}%, exposed comm {mean['comm_exposed']:.0f}%, "
            f"waiting {mean['waiting_for_peers']:.0f}%, idle {mean['idle']:.0f}% (mean over {len(table.rows)} ranks)")
