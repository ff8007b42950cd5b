"""Human units in the terminal's tables (453.4 MiB, 14.8 ms) while the JSON keeps bytes and
seconds: the formatters, the one rule that picks a column's unit, and the real renderer."""

import io
import json
import math

import pytest
from rich.console import Console

from distval.report.terminal import render
from distval.report.views import with_plan
from distval.results import Report, Table, write_json
from distval.units import format_bytes, format_seconds, human_unit

GIB, MIB, KIB = 2**30, 2**20, 2**10


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (1, "1 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
    (475394048, "453.4 MiB"), (1.5 * GIB, "1.50 GiB"), (12 * GIB, "12.0 GiB"), (3 * 2**40, "3.00 TiB"),
    (1023.6, "1.00 KiB"), (MIB - 1, "1.00 MiB"), (10 * MIB - 1, "10.0 MiB"),  # rounding moves up a unit
    (-2048, "-2.00 KiB"), (None, "—"), (float("nan"), "nan"), (float("inf"), "inf"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("s, text", [
    (0, "0 s"), (5e-7, "0.5 µs"), (9.99e-6, "10 µs"), (3.7e-5, "37 µs"), (5e-4, "500 µs"), (0.0148, "14.8 ms"),
    (0.99949, "999 ms"), (0.9996, "1.00 s"), (1.25, "1.25 s"), (59, "59.0 s"), (99.96, "100 s"), (3600, "3600 s"),
    (-0.0123, "-12.3 ms"), (None, "—"), (float("nan"), "nan"), (-math.inf, "-inf"),
])
def test_format_seconds(s, text):
    assert format_seconds(s) == text


@pytest.mark.parametrize("column, declared, value, text", [
    ("peak_mem_bytes", None, 475394048, "453.4 MiB"),  # by name
    ("bytes", None, 65536, "64.0 KiB"),
    ("step_time_s", None, 0.0148, "14.8 ms"),
    ("compute_ms", None, 4.16, "4.16 ms"),
    ("alpha_us", None, 314.1, "314 µs"),
    ("blocked_per_call_s", None, 0.00323, "3.23 ms"),  # seconds per call, not a rate
    ("seconds", "s", 75.2, "75.2 s"),  # by the declared unit
    ("total", "GiB", 1.5, "1.50 GiB"),
    ("size each", "MB", 1.048576, "1.00 MiB"),  # decimal MB declared, shown binary
    ("bytes_per_rank", "B (S of one call)", 2048, "2.00 KiB"),
    ("bucket_mb", "MiB", 25, "25.0 MiB"),
])
def test_the_rule_gives_a_unit(column, declared, value, text):
    human = human_unit(column, declared)
    assert human is not None and human(value) == text and human(None) == "—"


@pytest.mark.parametrize("column, declared", [
    ("tokens_per_s", None), ("tokens_per_s", "tokens/s"), ("busbw_gbps", None), ("beta_gbps", "GB/s (1e9)"),
    ("step", None), ("calls", None), ("comm_share", None), ("mfu", None), ("size", None), ("busy_pct", "%"),
    ("step_time_s", "tokens/s"),  # a declared unit wins over the name
])
def test_the_rule_leaves_rates_counts_and_ratios(column, declared):
    assert human_unit(column, declared) is None


def test_with_plan_shares_a_unit():
    assert with_plan(1.75 * MIB, 1.75 * MIB, format_bytes) == "1.75 (1.75) MiB"
    assert with_plan(1023 * KIB, MIB, format_bytes) == "1023.0 KiB (1.00 MiB)"
    assert with_plan(0.5, None, format_seconds) == "500 ms (—)"


def _text(report: Report) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    render(report, console)
    return console.export_text()


def _report() -> tuple[Report, list[list[dict]]]:
    rank_health = Table("rank_health", ["rank", "compute_ms", "waiting_ms", "peak_mem_bytes", "current_mem_bytes"],
                        title="every rank", units={"compute_ms": "ms", "waiting_ms": "ms", "peak_mem_bytes": "B",
                                                   "current_mem_bytes": "B"})
    rank_health.add(rank=0, compute_ms=4.16, waiting_ms=0.746, peak_mem_bytes=571322368, current_mem_bytes=None)
    rank_health.add(rank=1, compute_ms=14.8, waiting_ms=0.0, peak_mem_bytes=397017088.0, current_mem_bytes=1023)
    # no declared units: the names decide; rates, counts, ratios and steps stay numbers
    ops = Table("ops", ["op", "step", "calls", "grad_bytes", "time_s", "tokens_per_s", "busbw_gbps", "comm_share"],
                title="ops", units={"busbw_gbps": "GB/s"})
    ops.add(op="all_reduce", step=7, calls=18, grad_bytes=1.5 * GIB, time_s=1.25, tokens_per_s=12036.0,
            busbw_gbps=2.58, comm_share=0.000475)
    step = Table("step", ["quantity", "value", "unit"], title="one optimizer step")  # plan's: a unit per row
    step.add(quantity="communication", value=0.828, unit="s")
    step.add(quantity="throughput", value=94.04, unit="tokens/s")
    report = Report("test", tables=[rank_health, ops, step])
    return report, [[dict(r) for r in t.rows] for t in report.tables]


def test_terminal_shows_human_units_and_the_json_keeps_numbers(tmp_path):
    report, rows = _report()
    text = _text(report)
    for cell in ("4.16 ms", "746 µs", "0 s", "14.8 ms", "544.9 MiB", "378.6 MiB", "1023 B", "—",
                 "1.50 GiB", "1.25 s", "828 ms", "12,036", "2.58", "0.000475", "94.04"):
        assert cell in text, cell
    assert "571322368" not in text and "397,017,088" not in text and "(B)" not in text and "(ms)" not in text
    assert "(GB/s)" in text and "tokens/s" in text  # a rate keeps its unit in the header or its row
    assert [t.rows for t in report.tables] == rows  # rendering changed nothing
    write_json(report, tmp_path / "r.json")
    tables = json.loads((tmp_path / "r.json").read_text())["tables"]
    health = tables["rank_health"]
    assert health["rows"][0]["peak_mem_bytes"] == 571322368 and health["rows"][1]["peak_mem_bytes"] == 397017088.0
    assert health["units"]["compute_ms"] == "ms" and health["rows"][0]["compute_ms"] == 4.16
    assert tables["ops"]["rows"][0]["grad_bytes"] == 1.5 * GIB and tables["ops"]["rows"][0]["time_s"] == 1.25
    assert tables["step"]["rows"][0] == {"quantity": "communication", "value": 0.828, "unit": "s"}


def test_compare_and_scale_views_show_human_units():
    strategies = {"strategy": "zero3", "bitwise_equal": False, "max_rel_param_diff": 2.9e-6, "final_loss": 5.448,
                  "step_time_p50_s": 0.0718, "predicted_step_time_s": 0.0654, "tokens_per_s": 3562.0,
                  "peak_mem_bytes": 288_456_704, "model_state_bytes": 920_064, "predicted_model_state_bytes": 920_064,
                  "comm_calls_per_step": 10, "comm_bytes_per_step": 1_380_096,
                  "expected_comm_bytes_per_step": 1_380_096, "comm_wire_bytes_per_step": 690_048,
                  "comm_hidden_frac": 0.0}
    scaling = {"world_size": 4, "nodes": 1, "oversubscribed": True, "tokens_per_s": 9743.0, "step_time_s": 0.841,
               "planned_step_time_s": 1.24, "efficiency": 0.91, "planned_efficiency": 0.95, "busbw_gbps": 1.06,
               "gap": None}
    report = Report("test", tables=[Table("strategies", list(strategies), [strategies], "strategies"),
                                    Table("scaling", list(scaling), [scaling], "scaling")])
    text = _text(report)
    for cell in ("71.8 ms", "65.4 ms", "275.1 MiB", "898.5 (898.5) KiB", "1.32 (1.32) MiB", "673.9 KiB", "3,562",
                 "841 ms", "1.24 s", "9,743", "4*"):
        assert cell in text, cell
    assert "MiB (plan)" not in text and "step ms" not in text
