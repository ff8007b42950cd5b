"""`distval run`: the ladder climbs its stages in order, each with a verdict, a headline and a
hint, and stops at the first broken layer with the hint that mends it."""

from __future__ import annotations

import json

import pytest

from distval.ladder import STAGES, select
from distval.plan import calibration, presets

from conftest import run_cli


def _ladder(doc: dict) -> dict[str, dict]:
    return {r["stage"]: r for r in doc["tables"]["ladder"]["rows"]}


@pytest.mark.alone  # its bench fits each op's α–β and its compare meets the plan: another test's load skews them
# (a reduce_scatter whose larger sizes ran no slower under load had no fit, so no call cost: tests/parallel.py)
def test_quick_ladder_climbs_every_stage_and_the_plan_meets_the_measurement(tmp_path):
    """Every stage but the drills (their 63 s are `make run`'s, each drill is tested in
    test_drill/test_hang/test_ckpt_*): OK, in order, the bench's fits calibrating the plan and the
    compare's predictions, the traced run's breakdown and health per rank, the page written."""
    out = tmp_path / "report"
    res = run_cli("run", "--quick", "--nproc", "2", "--skip", "drills", "--out", str(out), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"distval: created {out} (--out)" in res.stderr.splitlines()
    doc = json.loads((out / "report.json").read_text())
    ladder = _ladder(doc)
    assert list(ladder) == [s for s in STAGES if s != "drills"]
    assert all(r["status"] in ("OK", "WARN") for r in ladder.values()), ladder
    assert all(ladder[s]["seconds"] > 0 for s in ("doctor", "check", "bench", "compare", "trace")), ladder
    progress = [line for line in res.stdout.splitlines() if line.startswith("[")]
    assert [line.split()[1] for line in progress] == list(ladder)  # one progress line per stage, as it ends
    assert "cases exact on 2 ranks" in ladder["check"]["headline"]
    assert "all_reduce" in ladder["bench"]["headline"] and "GB/s busbw" in ladder["bench"]["headline"]
    plan = next(c for c in doc["checks"] if c["name"] == "plan.calibration")  # the plan's links: the bench's fits
    assert plan["status"] == "OK" and "link numbers measured: bench.json: gloo, 2 ranks" in plan["summary"]
    compare = ladder["compare"]  # a plan that misses a strategy by more than 0.67-1.5x makes the stage WARN
    assert ("4 strategies match the reference" in compare["headline"]) == (compare["status"] == "OK"), compare
    assert compare["status"] == "OK" or "outside 0.67-1.5x" in compare["headline"], compare
    # the bench's own report: the plan's calibration, and `distval plan --calibration` reads it too, with the
    # per-call cost the bench measured and the step costs compare measured on one rank
    saved = calibration.load(str(out / "bench.json"))
    assert saved.fits["all_reduce"].beta_bytes_per_s > 0
    assert sorted(saved.call_costs) == ["*", "all_gather", "all_reduce", "norm", "reduce_scatter"]
    assert all([c for c, _ in cost.after] == [0.00025, 0.001, 0.005] for op, cost in saved.call_costs.items()
               if op != "norm")
    assert not saved.call_costs["norm"].after  # the norm's all_reduce: one figure, right after a reduce_scatter
    assert 0 <= saved.interference <= 2 and doc["tables"]["overlap_costs"]["rows"][0]["both_us"] > 0
    assert [c.strategy for c in saved.costs] == ["pytorch_ddp", "bucket_ddp_async", "zero2", "fsdp2"]
    assert all(0 < c.mfu <= 1 and c.optimizer_s > 0 and c.units == 3 for c in saved.costs)
    rows = {r["strategy"]: r for r in doc["tables"]["strategies"]["rows"]}
    assert list(rows) == ["pytorch_ddp", "bucket_ddp_async", "zero2", "fsdp2"]
    # the plan stage comes after compare and extrapolates from the model compare checked: its ddp step is
    # compare's pytorch_ddp prediction
    assert "compute at the" in ladder["plan"]["headline"] and "MFU and step costs compare measured" in \
        ladder["plan"]["headline"], ladder["plan"]
    planned = doc["tables"]["plan_step"]["rows"][0]["step_time_s"]
    assert planned == pytest.approx(rows["pytorch_ddp"]["predicted_step_time_s"], rel=1e-6)
    # the scale stage: one rank and both, planned with the bench's fits and compare's step costs (no probe of its own)
    scaling = doc["tables"]["scaling"]["rows"]
    assert [r["world_size"] for r in scaling] == [1, 2] and scaling[0]["efficiency"] == pytest.approx(1.0)
    assert all(r["planned_efficiency"] is not None and r["tokens_per_s"] > 0 for r in scaling)
    assert scaling[1]["busbw_gbps"] > 0 and "efficiency" in ladder["scale"]["headline"]
    predictions = {c["where"].get("strategy", c["name"].split()[1]): c for c in doc["checks"]
                   if c["name"].endswith(" prediction")}
    for name, row in rows.items():  # compute at the reference's measured rate plus the fitted comm
        assert row["max_rel_param_diff"] <= 1e-5, name
        assert 0.2 < row["predicted_step_time_s"] / row["step_time_p50_s"] < 5, (name, row)
        if row["comm_calls_per_step"] is not None:  # the plan issues the collectives the strategy issued
            assert row["predicted_calls_per_step"] == row["comm_calls_per_step"], (name, row)
        inside = 0.67 <= row["prediction_ratio"] <= 1.5  # the check follows the ratio, and names the category
        assert (predictions[name]["status"] == "OK") == inside and (row["prediction_miss"] is None) == inside, row
    assert {r["rank"] for r in doc["tables"]["trace_breakdown"]["rows"]} == {0, 1}
    assert [r["rank"] for r in doc["tables"]["rank_health"]["rows"]] == [0, 1]
    assert all(r["peak_mem_bytes"] > 0 for r in doc["tables"]["rank_health"]["rows"])
    health = {c["name"]: c for c in doc["checks"] if c["name"].startswith("health")}
    assert set(health) == {"health stragglers", "health numerics", "health replicas", "health memory"}
    assert "bitwise equal at 3 check(s)" in health["health replicas"]["summary"]  # every 4 of the 12 steps
    assert sorted(p.name for p in (out / "traces" / "run").iterdir()) == ["rank_0.json.gz", "rank_1.json.gz"]
    html = (out / "report.html").read_text()
    assert html.index('id="verdict"') < html.index('id="findings"') < html.index('id="figures"')
    assert "measured against the plan" in html.lower() or "prediction" in html


def test_a_bad_gloo_socket_ifname_stops_the_ladder_at_the_doctor(tmp_path):
    """Before any worker starts: the doctor names the variable and the fix; no other stage runs."""
    out = tmp_path / "report"
    res = run_cli("run", "--quick", "--out", str(out), "--json", str(tmp_path / "new" / "r.json"),
                  env={"GLOO_SOCKET_IFNAME": "nosuchnic0"}, timeout=60)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-2000:]
    doc = json.loads((out / "report.json").read_text())
    ladder = _ladder(doc)
    assert ladder["doctor"]["status"] == "FAIL" and "nosuchnic0" in ladder["doctor"]["headline"]
    assert "GLOO_SOCKET_IFNAME" in ladder["doctor"]["hint"]
    assert all(ladder[s]["status"] == "SKIP" and ladder[s]["headline"] == "not run: doctor failed first"
               for s in STAGES[1:])
    assert doc["meta"]["stopped_at"] == "doctor"
    assert "[1/9] doctor   FAIL" in res.stdout
    # --json's missing folder is made and said, like --out
    assert f"distval: created {tmp_path / 'new'} (--json)" in res.stderr.splitlines()
    assert json.loads((tmp_path / "new" / "r.json").read_text())["tables"]["ladder"] == doc["tables"]["ladder"]


def test_a_corrupting_collective_stops_the_ladder_at_the_check_inside_the_job(tmp_path):
    """Rank 1's all_reduce result is corrupted: the check FAILs naming the op; the ranks agree not
    to run the bench (no bandwidth of wrong results), and nothing after it runs."""
    out = tmp_path / "report"
    res = run_cli("run", "--quick", "--nproc", "2", "--only", "check,bench,plan", "--out", str(out),
                  env={"DISTVAL_FAULT": "op=all_reduce,rank=1,index=0,nth=1"}, timeout=120)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-2000:]
    doc = json.loads((out / "report.json").read_text())
    ladder = _ladder(doc)
    assert list(ladder) == ["check", "bench", "plan"]
    assert ladder["check"]["status"] == "FAIL" and "all_reduce" in ladder["check"]["headline"]
    assert ladder["check"]["hint"]
    assert ladder["bench"]["status"] == "SKIP" and "not run" in ladder["bench"]["headline"]
    assert ladder["plan"]["headline"] == "not run: check failed first"
    assert "bench" not in doc["tables"] and not (out / "bench.json").exists()


def test_one_rank_climbs_bench_and_plan_without_a_calibration(tmp_path):
    """One GPU (as on a single-H200 machine): a bench of one rank crosses no link, so it is no
    calibration; the plan says so instead of stopping the ladder with --calibration's error."""
    out = tmp_path / "report"
    res = run_cli("run", "--quick", "--nproc", "1", "--only", "bench,plan", "--out", str(out), timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    ladder = _ladder(json.loads((out / "report.json").read_text()))
    assert ladder["bench"]["status"] == "OK" and (out / "bench.json").exists()
    assert ladder["plan"]["status"] == "OK" and "no communication on one rank" in ladder["plan"]["headline"]


def test_stage_selection():
    assert select(None, None) == STAGES
    assert select(["trace", "doctor"], None) == ("doctor", "trace")  # ladder order, whatever the flag's
    assert select(None, ["drills", "compare"]) == ("doctor", "check", "bench", "plan", "scale", "trace", "health")


def test_bad_stage_names_are_one_line_exit_2(cli):
    res = cli("run", "--only", "doctor,benchmark")
    assert res.returncode == 2 and "--only benchmark: not a stage; the stages are doctor, check" in res.stderr
    res = cli("run", "--only", "doctor", "--skip", "doctor")
    assert res.returncode == 2 and "leave no stage" in res.stderr


def test_gpu_names_map_to_their_device_preset():
    assert presets.device_named("NVIDIA H100 80GB HBM3") == "H100"
    assert presets.device_named("NVIDIA H200") == "H200"
    assert presets.device_named("NVIDIA A100-SXM4-80GB") == "A100"
    assert presets.device_named("NVIDIA GeForce RTX 4070") == "RTX-4070"
    assert presets.device_named("Tesla T4") is None
