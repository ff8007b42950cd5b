"""`comm bench` on real Gloo groups: rows obey nccl-tests' formulas exactly, results are
verified after timing, and the α–β fit is reported."""

import math
from types import SimpleNamespace

import pytest
import torch

from distval.comm.bench import GRAPH_NEEDS_CUDA, BenchConfig, burst_times, capture, csv_text
from distval.comm.ops import BENCH_OPS, busbw_factor, count_for_bytes
from distval.launch import LaunchOptions
from distval.report.views import nccl_text
from distval.results import Status

from conftest import run_bench

S_MULT = {"all_reduce": 1, "broadcast": 1, "reduce": 1, "sendrecv": 1}  # else S = n * count * elt


# sizes 1K, 16K, 256K, 4M: with 3 iterations on 3 ranks sharing 2 cores, three sizes up to 256K once fitted no
# line for any op (1K as slow as 256K), and the per-call table, which needs a fit, was missing
@pytest.mark.alone  # its overlap probe's ~20 ms of compute took 51 ms beside another job (bound 50 ms)
@pytest.mark.parametrize("nproc", [2, 3])
def test_every_op_obeys_nccl_tests_formulas(nproc):
    cfg = BenchConfig(ops=["all"], min_bytes=1024, max_bytes=4 * 2**20, factor=16, iters=3, warmup=1, check_iters=2)
    report = run_bench(cfg, LaunchOptions(nproc=nproc, timeout_s=30))
    rows = report.table("bench").rows
    assert {r["op"] for r in rows} == set(BENCH_OPS)
    for r in rows:
        elt = 4
        assert r["count"] == count_for_bytes(
            r["op"], r["bytes"] if r["op"] in S_MULT else r["count"] * nproc * elt, elt, nproc
        )
        assert r["bytes"] == S_MULT.get(r["op"], nproc) * r["count"] * elt
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us_p50"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] / r["algbw_gbps"] == pytest.approx(busbw_factor(r["op"], nproc))
        assert r["time_us_min"] <= r["time_us_p50"] <= r["time_us_p95"] <= r["time_us_max"]
        assert r["wrong"] == 0
        assert r["busbw_pct_of_copy"] == pytest.approx(100 * r["busbw_gbps"] / report.meta["copy_ceiling_gbps"])
    # in-place rows exist exactly where the op has an in-place form in torch
    forms = {(r["op"], r["inplace"]) for r in rows}
    assert ("all_gather", True) in forms and ("reduce_scatter", True) in forms and ("all_reduce", True) in forms
    assert ("all_to_all", True) not in forms and ("all_reduce", False) not in forms
    assert report.meta["world_size"] == nproc and report.meta["copy_ceiling_gbps"] > 0
    fits = {f["op"]: f for f in report.table("alpha_beta").rows}
    for f in fits.values():
        assert f["beta_gbps"] > 0 and f["alpha_us"] >= 0 and -1 <= f["r2"] <= 1
        assert f["n_half_bytes"] == pytest.approx(f["alpha_us"] * 1e-6 * f["beta_gbps"] * 1e9)
    assert all(c.status is Status.OK for c in report.checks)
    # a call as training issues it: after 0.25, 1 and 5 ms of compute, and back to back, per op the planner uses
    # (against the op's fit: an op whose 3-iteration sweep fitted no line has no row); and the gradient norm's
    # 4-byte all_reduce right after a reduce_scatter, against all_reduce's fit
    calls = report.table("call_costs").rows
    assert [(r["op"], r["compute_s"], r["back_to_back"]) for r in calls] == [
        (op, c, b) for op in ("all_reduce", "all_gather", "reduce_scatter") if op in fits
        for c, b in ((0.00025, False), (0.001, False), (0.005, False), (0.005, True))
    ] + [("norm", 0.0, True)] * ("all_reduce" in fits) and calls
    for r in calls:
        fit = fits["all_reduce" if r["op"] == "norm" else r["op"]]
        assert r["bytes"] == 4 if r["op"] == "norm" else r["bytes"] in (65536, 65520)  # 64 KiB rounded as the sweep
        assert r["call_us"] > 0
        assert r["fit_us"] == pytest.approx(fit["alpha_us"] + r["bytes"] / (fit["beta_gbps"] * 1e3))
        assert r["overhead_us"] == pytest.approx(r["call_us"] - r["fit_us"])
    # an all_reduce overlapped with ~20 ms of compute, sized to take about as long alone (at least 16 KiB)
    (overlap,) = report.table("overlap_costs").rows
    assert overlap["op"] == "all_reduce" and 16 * 2**10 <= overlap["bytes"] <= 64 * 2**20
    assert 2_000 < overlap["compute_us"] < 50_000 and overlap["comm_us"] > 0
    assert overlap["interference"] == pytest.approx(
        (overlap["both_us"] - max(overlap["compute_us"], overlap["comm_us"]))
        / min(overlap["compute_us"], overlap["comm_us"]))
    if nproc == 3:  # nccl-tests' own numbers for -b 1K float32 at 3 ranks, written out by hand
        first = {(r["op"], r["inplace"]): r for r in rows if r["bytes"] in (1024, 1008)}
        expected = {  # op: (count, bytes, busbw/algbw)
            "all_reduce": (256, 1024, 4 / 3), "broadcast": (256, 1024, 1.0), "reduce": (256, 1024, 1.0),
            "sendrecv": (256, 1024, 1.0), "all_gather": (84, 1008, 2 / 3), "reduce_scatter": (84, 1008, 2 / 3),
            "all_to_all": (84, 1008, 2 / 3), "gather": (84, 1008, 2 / 3), "scatter": (84, 1008, 2 / 3),
        }
        for op, (count, size, factor) in expected.items():
            r = first[(op, op in ("all_reduce", "broadcast", "reduce"))]
            assert (r["count"], r["bytes"]) == (count, size), op
            assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor), op


def test_sizes_between_1m_and_16m_and_the_text_and_csv_forms():
    cfg = BenchConfig(
        ops=["all_reduce", "all_gather"], min_bytes=2**20, max_bytes=16 * 2**20, factor=2, iters=5, warmup=1,
        call_cost=False)
    report = run_bench(cfg, LaunchOptions(nproc=2, timeout_s=60))
    rows = report.table("bench").rows
    assert sorted({r["bytes"] for r in rows if r["op"] == "all_reduce"}) == [
        2**20,
        2 * 2**20,
        4 * 2**20,
        8 * 2**20,
        16 * 2**20,
    ]
    assert all(
        r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * (1.0 if r["op"] == "all_reduce" else 0.5)) for r in rows
    )
    ar = next(f for f in report.table("alpha_beta").rows if f["op"] == "all_reduce")
    assert ar["num_points"] == 5 and not math.isnan(ar["r2"])
    text = nccl_text(report.table("bench"), report.meta)
    assert "out-of-place" in text and "in-place" in text and "# Out of bounds values : 0 OK" in text
    assert f"{16 * 2**20:>12} {4 * 2**20:>12}" in text  # size and count columns as nccl-tests
    lines = csv_text(report.table("bench")).splitlines()
    assert lines[0].startswith("op,dtype,bytes,count,inplace") and len(lines) == len(rows) + 1


def test_wrong_results_after_timing_are_counted(monkeypatch):
    # nth=0 corrupts every call on rank 1: the verification pass must see it
    monkeypatch.setenv("DISTVAL_FAULT", "op=all_gather,rank=1,index=7")
    cfg = BenchConfig(
        ops=["all_gather"], min_bytes=4096, max_bytes=4096, iters=2, warmup=0, check_iters=3, copy_ceiling=False,
        call_cost=False)
    report = run_bench(cfg, LaunchOptions(nproc=2, timeout_s=30))
    rows = report.table("bench").rows
    assert [r["wrong"] for r in rows] == [3, 3]  # one element per pass, both in-place forms
    (check,) = report.checks
    assert check.status is Status.FAIL and report.exit_code() == 1 and "6 wrong element(s)" in check.summary


def test_bookkeeping_is_not_measured_traffic(monkeypatch):
    """Barriers and the reductions of timings and #wrong go over the control group: a fault on
    every all_reduce of the measured layer must not touch an all_gather sweep."""
    monkeypatch.setenv("DISTVAL_FAULT", "op=all_reduce,rank=0,index=0")
    cfg = BenchConfig(ops=["all_gather"], min_bytes=4096, max_bytes=4096, iters=3, warmup=0, check_iters=2,
                      call_cost=False)
    report = run_bench(cfg, LaunchOptions(nproc=2, timeout_s=30))
    assert [r["wrong"] for r in report.table("bench").rows] == [0, 0]
    assert all(r["time_us_p50"] > 0 for r in report.table("bench").rows)


def test_burst_timing_on_cpu_is_named_in_the_header_and_obeys_the_formulas():
    """`--timing burst` on Gloo: bursts of -n back-to-back ops timed with the host clock, the
    per-op time burst / n; the table's title, the meta and the nccl-tests text say so."""
    cfg = BenchConfig(ops=["all_reduce"], min_bytes=64 * 1024, max_bytes=1024 * 1024, factor=4, iters=6, warmup=1,
                      timing="burst", bursts=3, call_cost=False)
    report = run_bench(cfg, LaunchOptions(nproc=2, timeout_s=30))
    method = "3 bursts of 6 back-to-back ops after 1 warm-up, timed with the host clock, one wait at the end"
    assert report.table("bench").title.startswith(method) and report.meta["timing"].startswith(method)
    assert nccl_text(report.table("bench"), report.meta).splitlines()[0] == f"# distval comm bench: 2 ranks, " \
        f"{report.table('bench').title}"
    for r in report.table("bench").rows:
        assert r["time_us_min"] <= r["time_us_p50"] <= r["time_us_p95"] <= r["time_us_max"] and r["wrong"] == 0
        assert r["busbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us_p50"] * 1e-6) / 1e9)  # factor 1 at 2 ranks
    assert all(c.status is Status.OK for c in report.checks)


class _Clock:
    """A clock whose bursts take 8 s, then 4 s."""

    def __init__(self):
        self.spans, self.starts = [8.0, 4.0], 0

    def start(self):
        self.starts += 1

    def stop(self):
        return self.spans.pop(0)


def test_burst_arithmetic_per_op_time_is_burst_time_over_ops():
    calls, barriers = [], []
    ctx = SimpleNamespace(device=torch.device("cpu"),
                          control_comm=SimpleNamespace(barrier=lambda: barriers.append(1)))
    clock = _Clock()
    times = burst_times(ctx, lambda: calls.append(1), ops=4, bursts=2, clock=clock)
    assert times.tolist() == [2.0, 1.0] and len(calls) == 8 and len(barriers) == 2  # one barrier per burst
    assert clock.starts == 2 and clock.spans == []  # the clock spans each burst, once


def test_timing_choices_and_the_graph_needs_cuda(cli):
    assert BenchConfig().method(torch.device("cpu")) == "blocking"
    assert BenchConfig().method(torch.device("cuda", 0)) == "burst"  # as nccl-tests, on GPUs
    assert BenchConfig(timing="blocking").method(torch.device("cuda", 0)) == "blocking"
    assert "captured once in a CUDA graph" in BenchConfig(graph=True).describe(torch.device("cuda", 0))
    assert "timed with CUDA events" in BenchConfig().describe(torch.device("cuda", 0))
    with pytest.raises(ValueError, match="^timing must be auto, blocking, burst"):
        BenchConfig(timing="events")
    with pytest.raises(ValueError, match="^graph replays bursts .* it times bursts, not timing blocking"):
        BenchConfig(timing="blocking", graph=True)
    with pytest.raises(ValueError, match="needs CUDA devices"):
        capture(lambda: None, 4, torch.device("cpu"))
    res = cli("comm", "bench", "-G", "--nproc", "2")
    assert res.returncode == 2 and res.stderr.strip() == f"distval: error: {GRAPH_NEEDS_CUDA}"
