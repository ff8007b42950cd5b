"""--calibration: a bench JSON with the keys `comm bench --json` writes (docs/report-schema.md),
its sweep following a known α–β curve, drives the plan; the plan reproduces the fitted
curve at the bench's world size, extrapolates by the ring formula, says what is measured, and
rejects files that are not distval bench reports (one line, exit 2)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys

import pytest
import torch

from distval.comm.fit import fit_alpha_beta
from distval.plan import PlanConfig, evaluate
from distval.plan.calibration import StepCost, load
from distval.plan.report import collectives_rows
from test_plan_cli import plan, plan_json

SWEEP = [256 * 2**10 * 4**i for i in range(4)]  # 256K … 16M, factor 4


def write_bench(path, curves: dict[str, tuple[float, float]], world_size: int = 2, hosts=("box",)) -> dict:
    """A `comm bench --json` file with the keys of docs/report-schema.md: per op a sweep whose p50
    times follow alpha + S/beta (p95 1% above), fitted by distval's own α–β fit.
    `curves`: op -> (alpha_s, beta in B/s)."""
    bench, fits = [], []
    for op, (alpha, beta) in curves.items():
        factor = 2 * (world_size - 1) / world_size if op == "all_reduce" else (world_size - 1) / world_size
        times = []
        for size in SWEEP:
            t = alpha + size / beta
            times.append(t)
            bench.append(
                {
                    "op": op,
                    "dtype": "float32",
                    "bytes": size,
                    "count": size // 4 // (1 if op == "all_reduce" else world_size),
                    "inplace": op == "all_reduce",
                    "redop": "sum" if op == "all_reduce" else None,
                    "root": None,
                    "time_us_p50": t * 1e6,
                    "time_us_p95": t * 1.01e6,
                    "time_us_min": t * 0.99e6,
                    "time_us_max": t * 1.05e6,
                    "algbw_gbps": size / t / 1e9,
                    "busbw_gbps": size / t / 1e9 * factor,
                    "busbw_pct_of_copy": None,
                    "wrong": 0,
                }
            )
        fit = fit_alpha_beta(SWEEP, times)
        fits.append({"op": op, "dtype": "float32", "alpha_us": fit.alpha_us, "beta_gbps": fit.beta_gbps, "r2": fit.r2,
                     "n_half_bytes": fit.n_half_bytes, "num_points": fit.num_points})
    doc = {
        "schema": "distval.report/1",
        "command": "comm bench",
        "meta": {
            "time": "2026-01-01T00:00:00+00:00",
            "argv": ["distval", "comm", "bench", "--nproc", str(world_size)],
            "versions": {"distval": "0.1.0", "torch": "2.13.0"},
            "world_size": world_size,
            "backend": "gloo",
            "launch": "local",
            "hosts": {h: [r for r in range(world_size) if r % len(hosts) == i] for i, h in enumerate(hosts)},
            "devices": ["cpu"],
            "copy_ceiling_gbps": 6.0,
            "sizes_bytes": SWEEP,
            "timing": "blocking per op",
        },
        "summary": {"OK": len(curves), "WARN": 0, "FAIL": 0, "SKIP": 0, "ERROR": 0},
        "checks": [
            {
                "name": f"comm.bench {op} float32",
                "status": "OK",
                "summary": "",
                "details": {},
                "hint": "",
                "where": {"op": op},
            }
            for op in curves
        ],
        "tables": {
            "bench": {"name": "bench", "title": "", "columns": list(bench[0]), "units": {}, "rows": bench},
            "alpha_beta": {"name": "alpha_beta", "title": "", "columns": list(fits[0]), "units": {}, "rows": fits},
        },
    }
    path.write_text(json.dumps(doc, indent=2))
    return doc


@pytest.fixture
def bench_file(tmp_path):
    path = tmp_path / "bench.json"
    doc = write_bench(path, {"all_reduce": (150e-6, 1.2e9)})
    (fit,) = doc["tables"]["alpha_beta"]["rows"]
    return path, fit


def test_calibrated_all_reduce_reproduces_the_fit_at_the_bench_world_size(bench_file):
    path, fit = bench_file
    alpha, beta = fit["alpha_us"] * 1e-6, fit["beta_gbps"] * 1e9
    assert alpha == pytest.approx(150e-6, rel=0.05) and beta == pytest.approx(1.2e9, rel=0.05)
    net = evaluate(PlanConfig(model="small", world_size=2, calibration=str(path), device="H100")).inputs.network
    for size in (3 * 2**20, 768 * 2**10, 100 * 2**20):  # sizes not in the sweep
        t, algorithm, source = net.time("all_reduce", size)
        assert t == pytest.approx(alpha + size / beta, rel=1e-9) and source == "calibrated" and algorithm == "ring"


def test_calibration_extrapolates_along_the_ring_formula(bench_file):
    path, fit = bench_file
    alpha, beta = fit["alpha_us"] * 1e-6, fit["beta_gbps"] * 1e9
    # at n = 2 the fit says: per-step alpha = alpha/2, bus bandwidth B = beta
    net = evaluate(PlanConfig(model="small", world_size=8, calibration=str(path), device="H100")).inputs.network
    size, n = 8e6, 8
    assert net.time("all_reduce", size)[0] == pytest.approx(2 * (n - 1) * alpha / 2 + 2 * (n - 1) / n * size / beta)
    # all_gather was not benched: derived from the same link, its own ring formula
    t, _, source = net.time("all_gather", size)
    assert source == "derived" and t == pytest.approx((n - 1) * alpha / 2 + (n - 1) / n * size / beta)


def test_a_fitted_all_gather_is_used_for_all_gather(tmp_path):
    path = tmp_path / "bench.json"
    doc = write_bench(path, {"all_reduce": (150e-6, 1.2e9), "all_gather": (90e-6, 2.0e9)})
    fits = {r["op"]: r for r in doc["tables"]["alpha_beta"]["rows"]}
    net = evaluate(PlanConfig(model="small", world_size=2, calibration=str(path), device="H100")).inputs.network
    ag = fits["all_gather"]
    t, _, source = net.time("all_gather", 5e6)
    assert source == "calibrated" and t == pytest.approx(ag["alpha_us"] * 1e-6 + 5e6 / (ag["beta_gbps"] * 1e9))


def test_calibrated_ddp_step_is_the_sum_over_buckets(bench_file):
    path, fit = bench_file
    alpha, beta = fit["alpha_us"] * 1e-6, fit["beta_gbps"] * 1e9
    r = evaluate(PlanConfig(model="small", world_size=2, calibration=str(path), device="H100"))
    grads = r.inputs.model.num_params * 4
    buckets = [c for c in collectives_rows(r)]
    assert sum(b["count"] * b["bytes_per_rank"] for b in buckets) == pytest.approx(grads, abs=len(buckets))
    assert r.comm_time_s == pytest.approx(
        sum(b["count"] * (alpha + b["bytes_per_rank"] / beta) for b in buckets), rel=1e-6
    )


def test_two_level_plan_uses_a_one_host_bench_for_the_intra_node_link(bench_file):
    path, _ = bench_file
    net = evaluate(PlanConfig(model="small", num_nodes=2, devices_per_node=4, inter_link="10GbE", calibration=str(path),
                              device="H100")).inputs.network
    assert net.link_for("intra", "all_reduce").source == "calibrated"
    assert net.link_for("inter", "all_reduce").source == "preset"


def test_report_says_which_numbers_are_measured(capsys, tmp_path, bench_file):
    path, _ = bench_file
    doc = plan_json(
        capsys, tmp_path, "--model", "small", "--world", "2", "--calibration", str(path), "--device", "H100"
    )
    assert {c["source"] for c in doc["tables"]["collectives"]["rows"]} == {"calibrated"}
    checks = {c["name"]: c for c in doc["checks"]}
    assert (
        checks["plan.calibration"]["status"] == "OK"
        and "gloo, 2 ranks, intra-node" in checks["plan.calibration"]["summary"]
    )
    sources = {r["input"]: r["source"] for r in doc["tables"]["assumptions"]["rows"]}
    assert sources["calibration"].startswith("measured") and sources["link, all_reduce"].startswith("calibrated")
    assert sources["link, all_gather"].startswith("derived") and sources["MFU"] == "assumed (default)"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"foo": 1}', "is not a distval comm bench report (schema None, command None)"),
        ("[1, 2]", "is not a distval comm bench report"),
        ("not json at all", "is not JSON"),
        (
            '{"schema": "distval.report/1", "command": "comm check", "meta": {"world_size": 2}, "tables": {}}',
            "is not a distval comm bench report (schema 'distval.report/1', command 'comm check')",
        ),
        (
            '{"schema": "distval.report/1", "command": "comm bench", "meta": {"world_size": 2}, "tables": {}}',
            "has no alpha_beta table",
        ),
        (
            '{"schema": "distval.report/1", "command": "comm bench", "meta": {"world_size": 1}, "tables": {}}',
            "a calibration needs a bench of at least 2 ranks",
        ),
        (
            '{"schema": "distval.report/1", "command": "comm bench", "meta": {"world_size": 2}, '
            '"tables": {"alpha_beta": {"rows": [{"op": "all_reduce", "alpha_us": 10, "beta_gbps": -1}]}}}',
            "needs alpha_us >= 0 and beta_gbps > 0",
        ),
        (
            '{"schema": "distval.report/1", "command": "comm bench", "meta": {"world_size": 2}, '
            '"tables": {"alpha_beta": {"rows": [{"op": "broadcast", "alpha_us": 10, "beta_gbps": 1}]}}}',
            "has no alpha-beta fit of all_reduce",
        ),
    ],
)
def test_files_that_are_not_bench_reports_are_rejected(capsys, tmp_path, content, message):
    path = tmp_path / "x.json"
    path.write_text(content)
    out = tmp_path / "plan.json"
    code, _, stderr = plan(capsys, "--model", "small", "--world", "2", "--calibration", str(path), "--json", str(out))
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and message in stderr, stderr
    assert not out.exists()


def test_compare_warns_when_the_plan_misses_and_names_the_category():
    """Figures measured on this host: fsdp2 3.6x off (its forward+backward and collectives cannot be split:
    torch's own; its optimizer is near), zero2 1.19x (OK); a counted strategy whose exposed
    communication carries the error is named as such; an optimizer step far off is named."""
    from distval.report.html import _step_time_figure
    from distval.train.compare import prediction_check

    fsdp2 = {"step_time_p50_s": 0.0321, "predicted_step_time_s": 0.0089, "measured_compute_s": None,
             "measured_exposed_comm_s": None, "predicted_compute_s": 0.0058, "predicted_exposed_comm_s": 0.0011,
             "measured_optimizer_s": 0.0062, "predicted_optimizer_s": 0.0020}
    check = prediction_check("fsdp2", fsdp2)
    assert check.status.value == "WARN" and check.where == {"strategy": "fsdp2", "category": "unsplit"}
    assert check.summary.startswith("fsdp2: measured 32.1 ms against the plan's 8.9 ms (3.61x): optimizer 6.2 vs 2.0 "
                                    "ms; outside 0.67-1.5x: the harness cannot split forward+backward from this "
                                    "strategy's communication")
    slow_update = dict(fsdp2, step_time_p50_s=0.0200, measured_optimizer_s=0.0150)  # the rest: 5.0 vs 6.9 ms
    assert prediction_check("fsdp2", slow_update).where["category"] == "optimizer"
    zero2 = {"step_time_p50_s": 0.0107, "predicted_step_time_s": 0.0090, "measured_compute_s": 0.0080,
             "measured_exposed_comm_s": 0.0027, "predicted_compute_s": 0.0078, "predicted_exposed_comm_s": 0.0012}
    ok = prediction_check("zero2", zero2)
    assert ok.status.value == "OK" and zero2["prediction_miss"] is None and round(zero2["prediction_ratio"], 2) == 1.19
    comm = {"step_time_p50_s": 0.0300, "predicted_step_time_s": 0.0100, "measured_compute_s": 0.0085,
            "measured_exposed_comm_s": 0.0215, "predicted_compute_s": 0.0080, "predicted_exposed_comm_s": 0.0020}
    warn = prediction_check("pytorch_ddp", comm)
    assert warn.where["category"] == "exposed communication" and "exposed communication 21.5 vs 2.0 ms" in warn.summary
    assert prediction_check("dp", {"step_time_p50_s": 0.01, "predicted_step_time_s": None}) is None
    rows = [{"strategy": "fsdp2", **fsdp2}, {"strategy": "zero2", **zero2}]
    (svg,) = _step_time_figure({"strategies": {"rows": rows}})["charts"]
    assert "⚠ fsdp2" in svg and "off: step not split" in svg and "⚠ zero2" not in svg


def _with_costs(path, costs: list[dict], calls: list[dict]) -> None:
    """Add compare's step_costs and comm bench's call_costs tables to a bench file."""
    doc = json.loads(path.read_text())
    doc["tables"]["step_costs"] = {"name": "step_costs", "rows": costs}
    doc["tables"]["call_costs"] = {"name": "call_costs", "rows": calls}
    path.write_text(json.dumps(doc))


COST = {"model": "small", "units": 5, "num_params": 1_000_000, "overhead_s": 0.010, "optimizer_s": 0.004,
        "optimizer_per_param_s": 2e-9, "mfu": 0.25, "peak_flops": 8e10}
CALLS = [{"op": op, "compute_s": c, "back_to_back": b, "overhead_us": us * scale}
         for op, scale in (("all_reduce", 1.0), ("reduce_scatter", -1.0))  # its fit's α too high: a correction
         for c, b, us in ((0.001, False, 200.0), (0.005, False, 1000.0), (0.005, True, 300.0))]


def test_step_costs_and_call_costs_enter_the_plan(tmp_path):
    """The calibrated terms: the strategy's own cost per unit and micro-batch, the optimizer step (its
    per-parameter part divided by sharding, its per-tensor part not), the sharded strategies'
    gradient-norm all_reduce, the measured per-call cost after compute (from the back-to-back figure
    at none, interpolated through the probe's points, flat beyond), and the measured MFU and peak."""
    from distval.plan.schedule import COMPUTE
    from distval.plan.steps import units

    path = tmp_path / "bench.json"
    write_bench(path, {"all_reduce": (150e-6, 1.2e9), "reduce_scatter": (100e-6, 1.0e9)})
    _with_costs(path, [dict(COST, strategy="pytorch_ddp", plan_model="ddp"),
                       dict(COST, strategy="zero1", plan_model="zero1", overhead_s=0.0)], CALLS)
    ddp = evaluate(PlanConfig(model="small", world_size=2, grad_accum=2, calibration=str(path)))
    inp = ddp.inputs
    assert inp.cost.strategy == "pytorch_ddp" and inp.mfu == 0.25 and inp.peak_flops == 8e10
    assert "measured" in inp.mfu_source and "step costs" in inp.peak_source
    n_units = len(units(inp))
    assert ddp.overhead_time_s == pytest.approx(0.010 / 5 * n_units * 2)  # per unit, per micro-batch
    fixed = 0.004 - 2e-9 * 1e6  # measured over 1e6 parameters: what does not grow with them
    assert ddp.optimizer_time_s == pytest.approx(fixed + 2e-9 * inp.model.num_params)
    tasks = [t for p in ddp.phases for t in p.tasks]
    assert tasks[-1].label == "optimizer step" and tasks[-1].stream == COMPUTE
    assert not any(t.label == "grad norm all_reduce" for t in tasks)
    cal = inp.calibration
    ar = functools.partial(cal.call_cost, op="all_reduce")
    assert ar(0.0) == pytest.approx(300e-6)  # no compute before it: as back to back
    assert ar(0.0005) == pytest.approx(250e-6) and ar(0.003) == pytest.approx(600e-6)
    assert ar(0.5) == pytest.approx(1000e-6) and ar(None) == pytest.approx(300e-6)
    # per op: a negative figure corrects an op's fit; an op the probe did not time (all_gather) gets the
    # mean over the ops, at least 0 (here 0: +x and -x)
    assert cal.call_cost(0.003, "reduce_scatter") == pytest.approx(-600e-6)
    assert cal.call_cost(0.003, "all_gather") == 0.0 and cal.call_cost(None) == 0.0
    assert "all_reduce 200/1000/300 µs, reduce_scatter -200/-1000/-300 µs" in cal.describe()
    (bucket,) = [t for t in tasks if t.op == "all_reduce"][:1]  # the first bucket, after its share of backward
    chunk = tasks[tasks.index(bucket) - 1].duration_s
    fitted = inp.network.time("all_reduce", bucket.size_bytes)[0]
    assert bucket.duration_s == pytest.approx(fitted + ar(chunk))
    assert "per-call cost" in bucket.source

    zero1 = evaluate(PlanConfig(model="small", world_size=4, strategy="zero1", calibration=str(path)))
    assert zero1.optimizer_time_s == pytest.approx(fixed + 2e-9 * zero1.inputs.model.num_params / 4)
    labels = [t.label for p in zero1.phases for t in p.tasks]
    norm = labels.index("grad norm all_reduce")
    assert labels[norm + 1] == "optimizer step" and labels[norm + 2] == "params all_gather (step)"
    given = evaluate(PlanConfig(model="small", world_size=2, mfu=0.5, calibration=str(path)))
    assert given.inputs.mfu == 0.5 and given.inputs.mfu_source == "given"
    plain = evaluate(PlanConfig(model="small", world_size=2, strategy="zero3", calibration=str(path), device="H100"))
    assert plain.inputs.cost is None and plain.optimizer_time_s == 0 and plain.overhead_time_s == 0
    # the flat tensor's rate times the parameters can exceed the whole measured phase (small: 5.6 ns a
    # parameter, 71 ms, against a 35 ms phase): capped, the phase is reproduced where it was measured
    slow_flat = StepCost(**dict(COST, strategy="pytorch_ddp", plan_model="ddp", num_params=12_587_904,
                                optimizer_s=0.035, optimizer_per_param_s=5.6e-9))
    assert slow_flat.optimizer_time(12_587_904) == pytest.approx(0.035)
    assert slow_flat.optimizer_time(12_587_904 / 2) == pytest.approx(0.0175)  # sharded: all of it shrinks


def test_the_gradient_norms_all_reduce_is_costed_by_its_own_probe_where_the_bench_timed_it(tmp_path):
    """The sharded strategies' 4-byte norm all_reduce follows the backward's last collective: a bench
    that timed it so (call_costs row "norm") gives its cost beyond all_reduce's fit; an older bench
    leaves it at all_reduce's back-to-back figure, measured on 64 KiB calls. The row stands for
    itself: the mean that stands for untimed ops does not take it in."""
    from distval.comm.config import NORM
    from distval.plan.steps import NORM_LABEL

    path = tmp_path / "bench.json"
    write_bench(path, {"all_reduce": (150e-6, 1.2e9), "reduce_scatter": (100e-6, 1.0e9)})

    def norm_s() -> float:
        result = evaluate(PlanConfig(model="small", world_size=2, strategy="zero3", calibration=str(path)))
        (norm,) = [t for p in result.phases for t in p.tasks if t.label == NORM_LABEL]
        assert norm.op == "all_reduce" and norm.size_bytes == 4
        return norm.duration_s

    _with_costs(path, [], CALLS)
    assert norm_s() == pytest.approx(150e-6 + 4 / 1.2e9 + 300e-6)  # back to back, as 64 KiB calls
    _with_costs(path, [], CALLS + [{"op": NORM, "compute_s": 0.0, "back_to_back": True, "overhead_us": -100.0}])
    assert norm_s() == pytest.approx(150e-6 + 4 / 1.2e9 - 100e-6)  # below the fit's α: as the probe found it
    cal = load(str(path))
    assert cal.call_cost(0.003, "all_gather") == 0.0 and cal.call_cost(None) == 0.0  # the mean of +x, -x alone
    assert cal.call_cost(0.003, "all_reduce", NORM) == pytest.approx(-100e-6)
    assert cal.call_cost(0.003, "all_reduce") == pytest.approx(600e-6)  # other all_reduces: the per-op figures
    assert "the gradient norm's all_reduce -100 µs beyond the fit" in cal.describe()


def test_each_strategy_divides_the_per_parameter_rate_of_what_its_optimizer_updates():
    """ZeRO updates flat shards, fsdp2 the model's tensors as DTensor shards: each gets the AdamW
    rate of its layout, less what a tensor costs whatever its size (timed on one-element tensors).
    fsdp2's phase beyond that rate (DTensor dispatch per tensor) stays when sharding halves its
    parameters; measured on `small` it was 49.5 ms on one rank against 35 for the plain model, 37.4
    on 2 ranks, and the phase taken as all per-parameter predicted 26.2."""
    from distval.train.config import TrainConfig
    from distval.train.stepcosts import PLAIN, adamw_per_param, adamw_step_s, step_costs

    many_small = [64] * 200  # per-tensor cost dominates: the whole step over the parameters overstates the rate
    per_tensor_heavy = adamw_step_s(many_small, torch.device("cpu")) / sum(many_small)
    assert 0 <= adamw_per_param(many_small, torch.device("cpu")) < per_tensor_heavy / 2
    assert 1e-11 < adamw_per_param([1_000_000], torch.device("cpu")) < 1e-7
    phase = {"step_s": 0.80, "optimizer_s": 0.0495, "fb_s": 0.70, "mfu_fb": 0.4}
    reference = {"probes": {PLAIN: dict(phase, optimizer_s=0.035), "fsdp2": phase, "zero2": phase},
                 "num_params": 12_587_904, "optimizer_per_param_s": 5.6e-9, "optimizer_per_param_tensors_s": 2.8e-9,
                 "probe_peak_flops": 1e11}
    costs = {c.strategy: c for c in step_costs(TrainConfig(model="small"), reference)}
    assert costs["zero2"].optimizer_per_param_s == 5.6e-9 and costs["fsdp2"].optimizer_per_param_s == 2.8e-9
    half = 12_587_904 / 2
    assert costs["fsdp2"].optimizer_time(half) == pytest.approx(0.0495 - 2.8e-9 * half)  # ~32 ms: 14.3 ms stays
    assert costs["zero2"].optimizer_time(half) == pytest.approx(0.0495 / 2)  # capped at the phase: all of it halves


def test_fsdp2s_step_cost_holds_the_work_it_leaves_out_on_one_rank(tmp_path):
    """FSDP2 skips its all-gather path (copy-in, the call, copy-out) and DTensor's redistributions
    when its group has one rank, so the reference rank's one-rank step never runs them. worldcost
    starts N local processes that time fsdp2 on a fake group of one and on a real Gloo group of N
    (sharded there: a rank holds 1/N of the parameters), and compare adds the differences to fsdp2's
    forward+backward overhead and optimizer phase and to no other strategy's."""
    from distval.plan.calibration import STEP_COST_COLUMNS
    from distval.results import Table
    from distval.train.config import TrainConfig
    from distval.train.stepcosts import PLAIN, save_step_costs, step_costs

    done = subprocess.run([sys.executable, "-m", "distval.train.worldcost", "--strategy", "fsdp2", "--model", "tiny",
                           "--micro-batch", "2", "--world", "2", "--threads", "1"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout.splitlines()[-1])
    assert doc["held"] == {"1": 1.0, "2": pytest.approx(0.5, abs=0.01)}  # it did shard, over 2 real ranks
    assert all(0 < seconds < 1 for phase in ("fb_s", "optimizer_s") for seconds in doc[phase].values())
    assert 0 < doc["norm_s"] < 0.1  # the real group's 4-byte all_reduce: a real collective, not the fake one's 0
    phase = {"step_s": 0.010, "optimizer_s": 0.002, "fb_s": 0.006, "mfu_fb": 0.2}
    reference = {"probes": {PLAIN: phase, "fsdp2": phase, "zero3": phase}, "num_params": 115_008,
                 "optimizer_per_param_s": 2e-9, "optimizer_per_param_tensors_s": 2e-9, "probe_peak_flops": 1e11,
                 "world_cost": {"fsdp2": {"fb_s": 0.0015, "optimizer_s": 0.0007}}}
    costs = {c.strategy: c for c in step_costs(TrainConfig(model="tiny"), reference)}
    assert costs["zero3"].overhead_s == pytest.approx(0.002)  # its one-rank step: 10 - 2 - 6 ms
    assert costs["zero3"].optimizer_s == pytest.approx(0.002)
    assert costs["fsdp2"].overhead_s == pytest.approx(0.0035)
    assert costs["fsdp2"].optimizer_s == pytest.approx(0.0027)
    # said in the step costs' check; a local group that did not run is a WARN, the figures left out
    path = tmp_path / "bench.json"
    write_bench(path, {"all_reduce": (150e-6, 1.2e9)})
    table = Table("step_costs", STEP_COST_COLUMNS, rows=[dataclasses.asdict(c) for c in costs.values()])
    said = save_step_costs(str(path), table, 2, reference["world_cost"])
    assert said.status.value == "OK"
    assert "fsdp2 +3.5 ms/micro-batch (+1.5 of it at world 2), optimizer 2.7 ms (+0.7 at world 2)" in said.summary
    reference["world_cost"] = {"fsdp2": None}
    table = Table("step_costs", STEP_COST_COLUMNS, rows=[dataclasses.asdict(c) for c in step_costs(
        TrainConfig(model="tiny"), reference)])
    said = save_step_costs(str(path), table, 2, reference["world_cost"], micro_batch=4)
    assert said.status.value == "WARN" and "not measured: the work fsdp2 skips on one rank" in said.summary
    assert "python -m distval.train.worldcost --strategy fsdp2 --model tiny --micro-batch 4 --world 2" in said.hint


def test_fsdp2s_predicted_optimizer_holds_the_norm_all_reduce_it_waits_for(tmp_path, monkeypatch):
    """fsdp2's collectives are torch's own: the optimizer phase the harness times holds its wait for
    the gradient norm's all_reduce, so compare's prediction puts that all_reduce (α + per-call cost of
    4 bytes) in the optimizer category and out of the exposed communication; the step is the same. A
    strategy whose collectives the layer times keeps it as communication."""
    from distval import strategies
    from distval.plan.steps import NORM_LABEL
    from distval.train.compare import predicted_step
    from distval.train.config import TrainConfig

    path = tmp_path / "bench.json"
    write_bench(path, {op: (300e-6, 1.0e9) for op in ("all_reduce", "all_gather", "reduce_scatter")})
    _with_costs(path, [], CALLS)
    cost = StepCost(**dict(COST, strategy="fsdp2", plan_model="fsdp"))
    holds = predicted_step(TrainConfig(model="small"), "fsdp2", 2, cost, str(path), 20)
    monkeypatch.setattr(strategies.REGISTRY["fsdp2"], "counts_all_comm", True)
    timed = predicted_step(TrainConfig(model="small"), "fsdp2", 2, cost, str(path), 20)
    result = evaluate(PlanConfig(model="small", world_size=2, strategy="fsdp", calibration=str(path)))
    (norm,) = [t.duration_s for p in result.phases for t in p.tasks if t.label == NORM_LABEL]
    assert norm == pytest.approx(300e-6 + 4 / 1e9 + 300e-6)  # α, 4 bytes, all_reduce's back-to-back per-call cost
    assert holds["predicted_step_time_s"] == timed["predicted_step_time_s"]
    assert holds["predicted_optimizer_s"] == pytest.approx(timed["predicted_optimizer_s"] + norm)
    assert holds["predicted_exposed_comm_s"] == pytest.approx(timed["predicted_exposed_comm_s"] - norm)
    assert holds["predicted_compute_s"] == timed["predicted_compute_s"]


def test_overlap_interference_slows_what_overlaps_and_nothing_else(tmp_path, capsys):
    """`comm bench`'s overlap probe (table overlap_costs): while a collective and compute run at
    once each goes at 1/(1 + k); the probe's own arithmetic (B = max(T, C) + k min(T, C)) is what
    the schedule gives back; a DDP step with overlapped buckets gets slower and says by how much,
    one without overlap does not; a malformed row is one line, exit 2."""
    from distval.plan.schedule import COMM, COMPUTE, Task, run

    for compute, comm in ((5.0, 3.0), (2.0, 7.0)):
        both = (Task("backward", COMPUTE, compute), Task("all_reduce", COMM, comm))
        assert run(both, 0.4) == pytest.approx((max(compute, comm) + 0.4 * min(compute, comm), compute + 0.4 * min(
            compute, comm) if comm < compute else compute * 1.4))
    chain = (Task("forward", COMPUTE, 2.0), Task("bucket", COMM, 3.0, (0,)), Task("backward", COMPUTE, 1.0, (0,)))
    assert run(chain, 0.0) == (5.0, 3.0) and run(chain, 1.0) == pytest.approx((6.0, 4.0))  # serial while both run

    path = tmp_path / "bench.json"
    write_bench(path, {"all_reduce": (150e-6, 1.2e9)})
    plain = evaluate(PlanConfig(model="small", world_size=4, bucket_mb=4, calibration=str(path)))
    doc = json.loads(path.read_text())
    doc["tables"]["overlap_costs"] = {"name": "overlap_costs", "rows": [
        {"op": "all_reduce", "bytes": 2**20, "compute_us": 5000.0, "comm_us": 4000.0, "both_us": 7000.0,
         "interference": 0.75}]}
    path.write_text(json.dumps(doc))
    slowed = evaluate(PlanConfig(model="small", world_size=4, bucket_mb=4, calibration=str(path)))
    assert slowed.inputs.calibration.interference == 0.75 and plain.interference_time_s == 0
    assert slowed.interference_time_s > 0 and slowed.step_time_s > plain.step_time_s
    assert slowed.step_time_s <= plain.step_time_no_overlap_s + slowed.interference_time_s + 1e-12
    serial = evaluate(PlanConfig(model="small", world_size=4, bucket_mb=4, overlap=False, calibration=str(path)))
    assert serial.interference_time_s == 0 and serial.step_time_s == pytest.approx(plain.step_time_no_overlap_s)
    step = plan_json(capsys, tmp_path, "--model", "small", "--world", "4", "--bucket-mb", "4",
                     "--calibration", str(path))["tables"]["step"]["rows"][0]
    assert step["interference_time_s"] == pytest.approx(slowed.interference_time_s)
    doc["tables"]["overlap_costs"]["rows"][0]["interference"] = "fast"
    path.write_text(json.dumps(doc))
    code, _, stderr = plan(capsys, "--model", "small", "--world", "2", "--calibration", str(path))
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "overlap_costs row needs" in stderr, stderr


def test_compare_saves_its_step_costs_into_the_calibration_file(tmp_path, capsys):
    """What compare measured on one rank lands in the bench file, where `plan --calibration` finds it;
    a malformed step_costs table is one line, exit 2."""
    from distval.plan.calibration import STEP_COST_COLUMNS
    from distval.results import Table
    from distval.train.stepcosts import save_step_costs

    path = tmp_path / "bench.json"
    write_bench(path, {"all_reduce": (150e-6, 1.2e9)})
    table = Table("step_costs", STEP_COST_COLUMNS, rows=[dict(COST, strategy="fsdp2", plan_model="fsdp")])
    check = save_step_costs(str(path), table, 2)
    assert check.status.value == "OK" and "fsdp2 +10.0 ms/micro-batch, optimizer 4.0 ms" in check.summary
    assert json.loads(path.read_text())["tables"]["step_costs"]["rows"][0]["strategy"] == "fsdp2"
    report = plan_json(capsys, tmp_path, "--model", "small", "--world", "2", "--strategy", "fsdp",
                       "--calibration", str(path))
    step = report["tables"]["step"]["rows"][0]
    assert step["optimizer_time_s"] > 0 and step["overhead_time_s"] > 0
    assumed = {r["input"]: r for r in report["tables"]["assumptions"]["rows"]}
    assert "fsdp2" in assumed["strategy's own cost, optimizer step"]["value"]
    doc = json.loads(path.read_text())
    doc["tables"]["step_costs"]["rows"][0]["mfu"] = 3
    path.write_text(json.dumps(doc))
    code, _, stderr = plan(capsys, "--model", "small", "--world", "2", "--calibration", str(path))
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "step_costs of fsdp2 need" in stderr, stderr


def test_each_probe_lasts_about_a_second_in_rounds_but_a_slow_step_is_not_repeated():
    """compare's one-rank probes: a host's speed moves by more than the band between 0.1 s windows,
    so each probed model measures about PROBE_SECONDS of steps, in up to three rounds taken in turn;
    a step too slow for that (small, 0.7 s) keeps the fewest steps, one round."""
    from distval.train.stepcosts import PROBE_ROUNDS, PROBE_SECONDS, PROBE_STEPS, PROBE_WARMUP, probe_rounds

    least = PROBE_STEPS - PROBE_WARMUP
    for step_s in (0.002, 0.008, 0.03):  # tiny on this host: 5-10 ms
        rounds, steps = probe_rounds(step_s)
        assert rounds == PROBE_ROUNDS and steps >= least
        assert PROBE_SECONDS <= rounds * steps * step_s < PROBE_SECONDS + rounds * step_s
    assert probe_rounds(0.05) == (2, 10) and probe_rounds(0.1) == (1, 10)
    assert probe_rounds(0.7) == probe_rounds(30.0) == (1, least)


def test_ranks_outnumbering_the_cores_pay_the_one_rank_costs_at_their_share(monkeypatch):
    """compare's prediction (and fsdp2_split's) takes the step costs measured on one rank alone; 3
    one-thread ranks on 2 cores each get 2/3 of a core, so forward+backward (the peak the MFU is a
    share of), the strategy's own cost and the optimizer phase all take 1.5x as long; ranks that
    fit the cores, and GPU ranks, pay them as measured."""
    from distval.train.stepcosts import at_rank_speed

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cost = StepCost(**dict(COST, strategy="zero2", plan_model="zero2", overhead_s=0.003, optimizer_s=0.006,
                           optimizer_per_param_s=3e-9))
    shared = at_rank_speed(cost, 3)
    assert shared.overhead_s == pytest.approx(0.0045) and shared.optimizer_s == pytest.approx(0.009)
    assert shared.optimizer_per_param_s == pytest.approx(4.5e-9) and shared.peak_flops == pytest.approx(
        cost.peak_flops * 2 / 3)
    assert shared.mfu == cost.mfu
    assert at_rank_speed(cost, 2) == cost and at_rank_speed(cost, 3, "cuda") == cost
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # 2 ranks of 2 threads on 2 cores: half a core each
    assert at_rank_speed(cost, 2).overhead_s == pytest.approx(0.006)


def test_fsdp2s_work_at_world_n_timed_on_more_ranks_than_cores_is_kept_as_one_rank_pays_it(monkeypatch):
    """worldcost times its N ranks on the cores there are: 3 one-thread ranks on 2 cores took 1.5x
    as long on both sides of the difference, so compare keeps the difference at 2/3, and the
    prediction's share (at_rank_speed) brings it back: counted once, not twice."""
    from distval.train.config import TrainConfig
    from distval.train.stepcosts import as_one_rank, at_rank_speed, step_costs
    from distval.train.worldcost import WorldCost

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    timed = WorldCost(fb_s=0.0045, optimizer_s=0.0015)
    assert as_one_rank(timed, 2) == {"fb_s": 0.0045, "optimizer_s": 0.0015}  # the ranks fit the cores
    assert as_one_rank(None, 3) is None  # not timed: the step costs' check WARNs (above)
    kept = as_one_rank(timed, 3)
    assert kept == {"fb_s": pytest.approx(0.003), "optimizer_s": pytest.approx(0.001)}
    phase = {"step_s": 0.010, "optimizer_s": 0.002, "fb_s": 0.008, "mfu_fb": 0.2}
    reference = {"probes": {"simple_ddp_ga": phase, "fsdp2": phase}, "num_params": 115_008,
                 "optimizer_per_param_s": 0.0, "optimizer_per_param_tensors_s": 0.0, "probe_peak_flops": 1e11,
                 "world_cost": {"fsdp2": kept}}
    cost = step_costs(TrainConfig(model="tiny"), reference)[0]
    assert cost.overhead_s == pytest.approx(0.003) and cost.optimizer_s == pytest.approx(0.003)
    at_three = at_rank_speed(cost, 3)  # what a rank of 3 on 2 cores pays: the timed figure again
    assert at_three.overhead_s == pytest.approx(0.0045) and at_three.optimizer_s == pytest.approx(0.0045)
