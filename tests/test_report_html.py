"""The HTML report: well-formed, self-contained, escaped, read top-down (verdict, findings, figures,
tables, passed checks, environment), one plotted mark per measured row."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from distval.report import html as report_html
from distval.report.html import _fmt_float, _model_curves, _series, _size_label, render_html
from distval.results import Check, Report, Status, Table

XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
WORLD_SIZE = 4
# the fake bench run drawn here: op -> (in-place forms, bus factor at WORLD_SIZE, alpha_us, beta_gbps)
FAKE_BENCH_OPS = {
    "all_reduce": ((True,), 2 * (WORLD_SIZE - 1) / WORLD_SIZE, 30.0, 4.0),
    "all_gather": ((False, True), (WORLD_SIZE - 1) / WORLD_SIZE, 20.0, 6.0),
}
SIZES = [2**k for k in range(3, 25, 3)]  # 8 B .. 16M


def bench_tables() -> tuple[Table, Table]:
    bench = Table(
        "bench",
        ["op", "dtype", "bytes", "count", "inplace", "time_us_p50", "algbw_gbps", "busbw_gbps", "wrong"],
        title="collective bandwidth (nccl-tests conventions)",
        units={"bytes": "B", "time_us_p50": "us", "algbw_gbps": "GB/s (1e9)", "busbw_gbps": "GB/s (1e9)"},
    )
    fits = Table("alpha_beta", ["op", "dtype", "alpha_us", "beta_gbps", "r2", "n_half_bytes", "num_points"],
                 title="alpha-beta model", units={"alpha_us": "us", "beta_gbps": "GB/s (1e9)", "n_half_bytes": "B"})
    for op, (forms, factor, alpha_us, beta_gbps) in FAKE_BENCH_OPS.items():
        for inplace in forms:
            for size in SIZES:
                t_us = alpha_us + size / (beta_gbps * 1e3) * (1.1 if inplace else 1.0)
                algbw = size / (t_us * 1e-6) / 1e9
                bench.add(op=op, dtype="float32", bytes=size, count=size // 4, inplace=inplace, time_us_p50=t_us,
                          algbw_gbps=algbw, busbw_gbps=algbw * factor, wrong=0)
        fits.add(op=op, dtype="float32", alpha_us=alpha_us, beta_gbps=beta_gbps, r2=0.998,
                 n_half_bytes=alpha_us * beta_gbps * 1e3, num_points=len(SIZES))
    return bench, fits


def realistic_report(num_ok: int = 40) -> Report:
    meta = {"torch": "2.13.0", "backend": "gloo", "world_size": WORLD_SIZE, "hosts": ["node-a", "node-b"],
            "ranks": [{"rank": 0, "host": "node-a"}, {"rank": 1, "host": "node-b"}],
            "config": {"dtype": "float32", "iters": 20, "timeout_s": 30.5}, "note": XSS, "copy_gbps": None,
            "argv": ["distval", "comm", "bench", "-b", "8", "-e", "16M"], "sizes_bytes": SIZES}
    report = Report("comm bench", meta=meta)
    for i in range(num_ok):
        op = ("all_reduce/sum", "broadcast")[i % 2]
        report.add(Check(f"comm.check {op} float32 size{i}", Status.OK, f"{op} size {i}: exact on every rank",
                         where={"op": op, "bytes": 2 ** (i % 30)}))
    report.add(
        Check(
            "comm.bench all_gather float32",
            Status.FAIL,
            "all_gather: 3 wrong element(s) after timing, first at 1M",
            details={"wrong_rows": [{"bytes": 2**20, "wrong": 3}]},
            hint="run `distval comm check` with -c 20",
            where={"op": "all_gather", "bytes": 2**20, "inplace": False},
        )
    )
    report.add(Check("comm.bench all_reduce float32", Status.WARN, f"busbw low {XSS}", hint="check the NIC"))
    report.add(Check("env.nccl", Status.SKIP, "no CUDA device"))
    report.tables.extend(bench_tables())
    return report


STAGES = ["doctor", "check", "bench", "compare", "plan", "scale", "drills", "trace", "health"]
STAGE_STATUS = {"bench": "WARN", "compare": "FAIL"}
HEADLINES = {"doctor": "2 ranks on 1 host, rendezvous 0.3 s", "check": "212 checks exact",
             "bench": "all_reduce plateau 1.9 GB/s", "plan": "zero2 predicted 41.0 ms/step",
             "compare": "zero2 differs from the reference",
             "scale": "pytorch_ddp 1 -> 2 ranks: 1,840 tokens/s, efficiency 0.92 (planned 0.95)",
             "drills": "4 drills recovered bitwise",
             "trace": "compute 61%, exposed comm 12%", "health": "no straggler, numerics finite"}
STRATEGIES = {  # name -> (step_time_p50_s, predicted_step_time_s, peak_mem_bytes)
    "pytorch_ddp": (0.0412, 0.0380, 310 * 2**20),
    "bucket_ddp_async": (0.0395, 0.0371, 305 * 2**20),
    "zero2": (0.0520, 0.0410, 240 * 2**20),
    "fsdp2": (0.0610, None, 180 * 2**20),
}
NUM_STEPS = 20


def loss_at(step: int) -> float:
    return 1.0 + 4.2 * 0.9**step


def run_report(xss: str = XSS, num_ok: int = 30) -> Report:
    """A `distval run` report as the ladder writes it (with --keep-going): every stage's table, one
    WARN and one FAIL stage, the FAIL check's summary carrying `xss`."""
    meta = {"argv": ["distval", "run", "--keep-going"], "world_size": 2, "backend": "gloo",
            "versions": {"distval": "0.9.0", "torch": "2.13.0", "python": "3.11.2"}, "hosts": {"node-a": [0, 1]},
            "config": {"out_dir": "distval-report", "bench": {"min_bytes": 1024, "max_bytes": 16 * 2**20}}}
    report = Report("run", meta=meta)
    ladder = Table("ladder", ["stage", "status", "seconds", "headline", "hint"], title="the acceptance ladder",
                   units={"seconds": "s"})
    for i, stage in enumerate(STAGES):
        status = STAGE_STATUS.get(stage, "OK")
        hint = {"bench": "busbw under half the copy ceiling: check OMP_NUM_THREADS",
                "compare": "run `distval compare --strategies zero2` and read its parity check"}.get(stage, "")
        ladder.add(stage=stage, status=status, seconds=0.4 + 3.1 * i, headline=HEADLINES[stage], hint=hint)
    report.tables.append(ladder)
    for i in range(num_ok):
        op = ("all_reduce/sum", "broadcast")[i % 2]
        report.add(Check(f"comm.check {op} float32 size{i}", Status.OK, f"{op} size {i}: exact on every rank",
                         where={"op": op, "bytes": 2 ** (i % 20)}))
    report.add(Check("comm.bench all_reduce float32", Status.WARN, "busbw 1.9 GB/s, 41% of the copy ceiling",
                     hint="check OMP_NUM_THREADS"))
    report.add(Check("compare zero2 parity", Status.FAIL, f"zero2 parameters differ from the reference {xss}",
                     details={"max_rel_param_diff": 3.1e-4}, hint="rerun with --strategies zero2",
                     where={"strategy": "zero2", "step": 8}))
    report.add(Check("drills slow_rank", Status.SKIP, "one rank only"))
    report.tables.extend(bench_tables())
    strategies = Table("strategies", ["strategy", "bitwise_equal", "step_time_p50_s", "predicted_step_time_s",
                                      "peak_mem_bytes", "predicted_peak_mem_bytes", "model_state_bytes",
                                      "expected_model_state_bytes"],
                       title="strategies on 2 ranks", units={"step_time_p50_s": "s", "peak_mem_bytes": "B"})
    for name, (measured, predicted, peak) in STRATEGIES.items():
        strategies.add(strategy=name, bitwise_equal=name != "zero2", step_time_p50_s=measured,
                       predicted_step_time_s=predicted, peak_mem_bytes=peak, predicted_peak_mem_bytes=peak * 0.9,
                       model_state_bytes=peak // 3, expected_model_state_bytes=peak // 3)
    breakdown = Table("trace_breakdown", ["run", "rank", "steps", "step_ms", "compute", "optimizer", "comm_overlapped",
                                          "comm_exposed", "waiting_for_peers", "memcpy", "data", "idle", "mfu"],
                      title="where each rank's step time goes", units={"step_ms": "ms"})
    for rank, shares in enumerate(((61.0, 6.0, 9.0, 12.0, 4.0, 2.0, 3.0, 3.0), (55.0, 6.0, 8.0, 11.0, 12.0, 2.0, 3.0,
                                                                                  3.0))):
        breakdown.add(run="pytorch_ddp", rank=rank, steps=10, step_ms=40.0 + rank, mfu=0.012,
                      **dict(zip(report_html._TRACE_CATEGORIES, shares)))
    health = Table("rank_health", ["rank", "compute_ms", "waiting_ms", "peak_mem_bytes", "current_mem_bytes"],
                   title="health per rank", units={"peak_mem_bytes": "B", "current_mem_bytes": "B"})
    for rank in range(2):
        health.add(rank=rank, compute_ms=30.0 + rank, waiting_ms=2.0 + rank, peak_mem_bytes=(300 + 20 * rank) * 2**20,
                   current_mem_bytes=(120 + 10 * rank) * 2**20)
    steps = Table("steps", ["step", "loss", "step_time_s"], title="training steps", units={"step_time_s": "s"})
    for step in range(NUM_STEPS):
        steps.add(step=step, loss=loss_at(step), step_time_s=0.04)
    drills = Table("drills", ["drill", "status", "detected", "recovery_s"], title="fault drills",
                   units={"recovery_s": "s"})
    for drill in ("kill9_rank", "hang_rank", "slow_rank", "corrupt_file"):
        drills.add(drill=drill, status="OK", detected=True, recovery_s=4.5)
    report.tables += [strategies, breakdown, health, steps, drills]
    return report


class TagBalance(HTMLParser):
    """Fails on any end tag that does not close the innermost open element."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[str] = []
        self.texts: list[tuple[str, tuple[str, ...]]] = []  # text and the elements it sits in

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        if data.strip():
            self.texts.append((data, tuple(self.stack)))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def parse(doc: str) -> TagBalance:
    parser = TagBalance()
    parser.feed(doc)
    parser.close()
    assert parser.errors == []
    assert parser.stack == []
    return parser


@pytest.fixture(scope="module")
def doc() -> str:
    return render_html(realistic_report().to_dict())


def test_well_formed_document(doc):
    parser = parse(doc)
    assert doc.startswith("<!DOCTYPE html>")
    assert parser.tags.count("html") == parser.tags.count("body") == 1
    assert "<title>distval comm bench &mdash; FAIL</title>" in doc


def test_verdict_badges_count_every_status(doc):
    for text in ("OK 40", "WARN 1", "FAIL 1", "SKIP 1", "ERROR 0"):
        assert re.search(rf'<span class="badge [A-Z]+( zero)?">{text}</span>', doc), text


def test_one_line_per_series_and_one_dashed_model_per_op(doc):
    assert doc.count("<svg") == 1
    svg = doc[doc.index("<svg"):doc.index("</svg>")]
    # all_reduce in-place, all_gather out-of-place and in-place
    polylines = re.findall(r'<polyline class="series" points="([^"]+)"', svg)
    assert len(polylines) == 3
    for points in polylines:
        xs = [float(p.split(",")[0]) for p in points.split()]
        assert len(xs) == len(SIZES) and xs == sorted(xs) and len(set(xs)) == len(xs)
    assert len(re.findall(r'<path class="model"[^>]*stroke-dasharray', svg)) == len(FAKE_BENCH_OPS)
    for label in ("all_reduce in-place", "all_gather out-of-place", "all_gather in-place", "all_gather α–β model"):
        assert f">{label}</text>" in svg
    for tick in (">16</text>", ">1K</text>", ">1M</text>", ">16M</text>"):
        assert tick in svg
    assert "message size (bytes, log2)" in svg and "busbw (GB/s)" in svg


def test_plotted_busbw_matches_rows(doc):
    bench = realistic_report().table("bench")
    row = next(r for r in bench.rows if r["op"] == "all_gather" and r["bytes"] == 2**21 and not r["inplace"])
    assert f"all_gather out-of-place 2M: {row['busbw_gbps']:.2f} GB/s</title>" in doc


def test_model_curve_is_factor_times_alpha_beta_bandwidth():
    bench, fits = bench_tables()
    series = _series(bench.rows)
    curves = _model_curves(fits.rows, bench.rows, series)
    assert set(curves) == set(FAKE_BENCH_OPS)
    for op, (_, factor, alpha_us, beta_gbps) in FAKE_BENCH_OPS.items():
        for size, busbw in curves[op]:
            expected = factor * size / (alpha_us * 1e-6 + size / (beta_gbps * 1e9)) / 1e9
            assert busbw == pytest.approx(expected, rel=1e-9)
        assert curves[op][0][0] == pytest.approx(min(SIZES)) and curves[op][-1][0] == pytest.approx(max(SIZES))


def test_problems_before_collapsed_ok_checks(doc):
    fail = doc.index("all_gather: 3 wrong element(s) after timing, first at 1M")
    warn = doc.index("busbw low")
    first_ok = doc.index("comm.check all_reduce/sum float32 size")
    assert fail < warn < first_ok
    assert "run `distval comm check` with -c 20" in doc
    assert "op=all_gather, bytes=1M, inplace=False" in doc
    assert "&#34;wrong_rows&#34;" in doc  # details, as escaped JSON
    # OK and SKIP are collapsed, grouped and counted
    texts = parse(doc).texts
    ok_texts = [stack for text, stack in texts if "exact on every rank" in text]
    assert len(ok_texts) == 40 and all("details" in stack for stack in ok_texts)
    assert all("details" not in stack for text, stack in texts if "3 wrong element(s)" in text)
    ok_block = doc[doc.index('<span class="badge OK">OK 40</span> 40 checks'):]
    assert re.search(r'<details><summary><span class="badge OK">OK 40</span> 40 checks in 2 groups</summary>', doc)
    assert "<code>comm.check all_reduce/sum</code> (20)" in ok_block
    assert "<code>comm.check broadcast</code> (20)" in ok_block
    assert re.search(r'<span class="badge SKIP">SKIP 1</span> 1 check in 1 group', doc)


def test_user_text_is_escaped(doc):
    assert "<script" not in doc
    assert doc.count(XSS_ESCAPED) >= 2  # the WARN summary and meta["note"]


def test_escaping_everywhere_user_text_can_go():
    report = Report(f"comm {XSS}", meta={XSS: [XSS, {"k": XSS}]})
    report.add(Check(XSS, Status.FAIL, XSS, details={"x": XSS}, hint=XSS, where={XSS: XSS}))
    report.add(Check(XSS, Status.OK, XSS, where={"op": XSS}))
    table = Table(XSS, ["op", "bytes"], title=XSS, units={"op": XSS})
    table.add(op=XSS, bytes=8)
    report.tables.append(table)
    doc = render_html(report.to_dict())
    parse(doc)
    assert "<script" not in doc and "alert(1)</" not in doc


def test_self_contained(doc):
    assert "http://" not in doc and "https://" not in doc
    assert not re.search(r"<(script|link|img|iframe)\b", doc)
    assert "src=" not in doc and "@import" not in doc


def test_meta_nested_values_are_readable(doc):
    assert "<th>hosts</th><td>node-a, node-b</td>" in doc
    assert '<ul class="val"><li><table class="kv"><tr><th>rank</th><td>0</td></tr>' in doc
    assert "<th>timeout_s</th><td>30.50</td>" in doc
    assert "<th>argv</th><td><code>distval comm bench -b 8 -e 16M</code></td>" in doc
    assert "<th>sizes_bytes</th><td>8, 64, 512, 4K, 32K, 256K, 2M, 16M</td>" in doc
    assert "<th>copy_gbps</th><td><span class=\"dash\">&mdash;</span></td>" in doc


def test_tables_have_title_units_and_formatted_cells(doc):
    assert '<h3 id="table-bench">collective bandwidth (nccl-tests conventions) <code>bench</code>' in doc
    assert '<th>busbw_gbps<br><span class="unit">GB/s (1e9)</span></th>' in doc
    assert '<td class="num" title="1048576">1M</td>' not in doc  # 1M is not a size in the sweep
    assert '<td class="num" title="2097152">2M</td>' in doc
    assert '<h3 id="table-alpha_beta">alpha-beta model <code>alpha_beta</code>' in doc
    assert '<td class="num">0.998</td>' in doc  # r2: 3 significant digits below 1
    assert '<td class="num">20.00</td>' in doc  # alpha_us: 2 decimals
    assert '<td class="num" title="120000.0">117K</td>' in doc  # n_half_bytes as a binary size


def test_number_formatting():
    assert _fmt_float(3.14159) == "3.14"
    assert _fmt_float(0.000123456) == "0.000123"
    assert _fmt_float(2.5e9) == "2.5e+09"
    assert _fmt_float(0.0) == "0"
    assert [_size_label(n) for n in (8, 1024, 1536, 2**20, 64 * 2**20, 2**30)] == ["8", "1K", "1.5K", "1M", "64M", "1G"]


@pytest.mark.parametrize("report", [
    Report("comm check"),
    Report("comm check", meta={"empty_list": [], "empty_dict": {}}),
    Report("comm check", checks=[Check("only", Status.ERROR, "rank 1 died", hint="see the log")]),
], ids=["empty", "empty-meta-values", "only-checks"])
def test_minimal_reports_render(report):
    doc = render_html(report.to_dict())
    parse(doc)
    assert "<svg" not in doc


def test_only_checks_report_shows_error_verdict():
    doc = render_html(Report("comm check", checks=[Check("only", Status.ERROR, "rank 1 died")]).to_dict())
    assert "<title>distval comm check &mdash; ERROR</title>" in doc and "rank 1 died" in doc
    assert "No checks in this report." in render_html(Report("x").to_dict())


def test_missing_keys_and_odd_shapes_render():
    doc = render_html({})
    parse(doc)
    assert "<title>distval distval" in doc and "<svg" not in doc
    doc = render_html({"command": "x", "tables": None, "checks": None, "meta": None, "summary": None})
    parse(doc)
    assert "<h1>distval x" in doc
    doc = render_html({"tables": [{"name": "listed", "rows": [{"a": 1, "b": None}]}]})  # list, no columns
    parse(doc)
    assert "listed" in doc


def test_empty_and_bad_values_in_bench():
    bench = Table("bench", ["op", "dtype", "bytes", "inplace", "algbw_gbps", "busbw_gbps", "time_us_p50"])
    empty = Report("comm bench", tables=[bench, Table("alpha_beta", ["op", "alpha_us", "beta_gbps"])])
    doc = render_html(empty.to_dict())
    parse(doc)
    assert "<svg" not in doc and "No rows." in doc

    for size, busbw in ((0, 1.0), (-8, 1.0), (None, 1.0), (64, None), (128, -1.0), (float("nan"), 2.0)):
        bench.add(op="all_reduce", dtype="float32", bytes=size, inplace=True, algbw_gbps=None, busbw_gbps=busbw)
    doc = render_html(empty.to_dict())
    parse(doc)
    assert "No plottable bench rows" in doc and "<svg" not in doc
    assert '<td class="dash">&mdash;</td>' in doc

    bench.add(op="all_reduce", dtype="float32", bytes=1024, inplace=True, algbw_gbps=0.0, busbw_gbps=0.0)
    fits = empty.table("alpha_beta")
    fits.add(op="all_reduce", alpha_us=-3.0, beta_gbps=0.0)
    doc = render_html(empty.to_dict())
    parse(doc)
    assert doc.count('<polyline class="series"') == 1  # one valid point, one series
    assert '<path class="model"' not in doc  # negative alpha, zero beta: no model drawn


# --- the page read top-down: a `distval run` report ---------------------------------------------

SECTIONS = ["verdict", "findings", "figures", "tables", "passed", "environment"]


@pytest.fixture(scope="module")
def run_doc() -> str:
    return render_html(run_report().to_dict())


def figure(doc: str, fig_id: str) -> str:
    start = doc.index(f'<figure id="{fig_id}">')
    return doc[start:doc.index("</figure>", start)]


def section(doc: str, name: str) -> str:
    start = doc.index(f'<section id="{name}">')
    return doc[start:doc.index("</section>", start)]


def test_sections_in_reading_order(run_doc):
    parse(run_doc)
    assert re.findall(r'<section id="([a-z]+)">', run_doc) == SECTIONS
    # the verdict opens the body: nothing but its section comes before it
    assert run_doc.index("<body>\n<section id=\"verdict\">") > 0
    assert '<h1>distval run <span class="badge FAIL">FAIL</span></h1>' in section(run_doc, "verdict")


def test_every_minimal_report_has_every_section():
    for report in ({}, Report("x").to_dict(), realistic_report().to_dict()):
        assert re.findall(r'<section id="([a-z]+)">', render_html(report)) == SECTIONS


def test_ladder_badges_in_stage_order(run_doc):
    badges = re.findall(r'<li class="stage"[^>]*><div class="stage-head (\w+)"><span class="stage-name">([^<]*)</span>'
                        r'<span class="stage-status">([^<]*)</span>', section(run_doc, "verdict"))
    expected = [(STAGE_STATUS.get(s, "OK"), s, STAGE_STATUS.get(s, "OK")) for s in STAGES]
    assert badges == expected
    assert '<span class="stage-secs">3.5 s</span><span class="stage-headline">212 checks exact</span>' in run_doc
    assert 'title="busbw under half the copy ceiling: check OMP_NUM_THREADS"' in run_doc
    assert "<ol class=\"stages\"" not in render_html(realistic_report().to_dict())  # no ladder, no stages


def test_ladder_table_comes_first_among_tables():
    report = run_report().to_dict()
    report["tables"] = {name: t for name, t in reversed(list(report["tables"].items()))}  # ladder last
    names = re.findall(r'<h3 id="table-([a-z_]+)">', section(render_html(report), "tables"))
    assert names[0] == "ladder" and len(names) == len(report["tables"])


def test_findings_need_action_in_order_and_passed_are_apart(run_doc):
    findings = section(run_doc, "findings")
    assert findings.index("zero2 parameters differ") < findings.index("busbw 1.9 GB/s")  # FAIL before WARN
    assert "exact on every rank" not in findings and "one rank only" not in findings
    passed = section(run_doc, "passed")
    assert "30 checks in 2 groups" in passed and "one rank only" in passed
    clean = Report("comm check", checks=[Check("comm.check broadcast", Status.OK, "exact")])
    assert "Nothing needs action: no FAIL, ERROR or WARN checks." in render_html(clean.to_dict())


def test_environment_is_last_and_collapsed(run_doc):
    env = section(run_doc, "environment")
    assert env.index("<details>") < env.index("<th>versions</th>")
    assert "<th>argv</th><td><code>distval run --keep-going</code></td>" in env
    assert "<th>node-a</th><td>0, 1</td>" in env
    assert "<th>argv</th>" not in run_doc[:run_doc.index('<section id="environment">')]


def test_figures_each_in_a_figure_with_a_caption(run_doc):
    figures = section(run_doc, "figures")
    ids = re.findall(r'<figure id="([a-z-]+)">', figures)
    assert ids == ["fig-busbw", "fig-step-time", "fig-strategies", "fig-breakdown", "fig-memory", "fig-loss"]
    for fig_id in ids:
        assert "<svg" in figure(run_doc, fig_id) and "<figcaption>" in figure(run_doc, fig_id)
    assert "<figure" not in render_html(Report("comm check").to_dict())


def test_loss_chart_has_one_point_per_step_row(run_doc):
    loss = figure(run_doc, "fig-loss")
    points = re.findall(r"<title>loss step (\d+): loss ([0-9.]+)</title>", loss)
    assert [int(step) for step, _ in points] == list(range(NUM_STEPS))
    for step, value in points:
        assert float(value) == pytest.approx(loss_at(int(step)), rel=1e-3)
    polyline = re.search(r'<polyline class="series" points="([^"]+)"', loss).group(1).split()
    assert len(polyline) == NUM_STEPS
    # the loss falls, so on screen (y grows downwards) each point sits lower than the one before
    ys = [float(p.split(",")[1]) for p in polyline]
    assert ys == sorted(ys) and ys[0] < ys[-1]


def test_loss_chart_one_line_per_run_and_tolerates_missing_losses():
    steps = Table("steps", ["run", "step", "loss"])
    for run in ("ddp", "zero2"):
        for step in range(5):
            steps.add(run=run, step=step, loss=None if step == 2 else 3.0 - 0.1 * step)
    doc = render_html(Report("compare", tables=[steps]).to_dict())
    parse(doc)
    assert figure(doc, "fig-loss").count('<polyline class="series"') == 2
    assert figure(doc, "fig-loss").count("<circle") == 8
    flat = Table("steps", ["step", "loss"], rows=[{"step": 0, "loss": 2.0}])  # one point: a range around it
    assert figure(render_html(Report("train", tables=[flat]).to_dict()), "fig-loss").count("<circle") == 1
    lossless = Table("steps", ["step", "loss"], rows=[{"step": 0, "loss": None}])
    assert "No step has a loss." in render_html(Report("train", tables=[lossless]).to_dict())


def test_predicted_against_measured_step_time(run_doc):
    fig = figure(run_doc, "fig-step-time")
    for name, (measured, predicted, _) in STRATEGIES.items():
        assert f"<title>{name}, measured step time (p50): {measured * 1e3:.1f} ms</title>" in fig
        if predicted is None:
            assert f"<title>{name}, plan&#39;s prediction" not in fig
        else:
            assert f"<title>{name}, plan&#39;s prediction: {predicted * 1e3:.1f} ms</title>" in fig
            assert f"{measured * 1e3:.1f} ms, {measured / predicted:.2f}× the prediction</text>" in fig
    # bars on one scale: width proportional to the value
    widths = {title: float(w) for w, title in re.findall(r'width="([0-9.]+)" height="[0-9.]+" fill="[^"]+">'
                                                         r"<title>([^<]+)</title>", fig)}
    zero2 = widths["zero2, measured step time (p50): 52.0 ms"] / widths["zero2, plan&#39;s prediction: 41.0 ms"]
    assert zero2 == pytest.approx(0.0520 / 0.0410, rel=1e-2)


def test_no_prediction_no_predicted_figure():
    report = run_report().to_dict()
    for row in report["tables"]["strategies"]["rows"]:
        row["predicted_step_time_s"] = None
    doc = render_html(report)
    assert 'id="fig-step-time"' not in doc and 'id="fig-strategies"' in doc


def test_breakdown_bars_add_up_to_each_ranks_shares(run_doc):
    fig = figure(run_doc, "fig-breakdown")
    for rank, row in enumerate(run_report().table("trace_breakdown").rows):
        widths = [float(w) for w in re.findall(rf'width="([0-9.]+)" height="18" fill="#[0-9a-f]+">'
                                               rf"<title>pytorch_ddp rank {rank}: ", fig)]
        shares = [row[c] for c in report_html._TRACE_CATEGORIES]
        assert len(widths) == len(shares) and sum(widths) == pytest.approx(600 * sum(shares) / 100, abs=0.5)


def test_memory_per_rank_bars(run_doc):
    fig = figure(run_doc, "fig-memory")
    for row in run_report().table("rank_health").rows:
        peak, current = row["peak_mem_bytes"] / 2**20, row["current_mem_bytes"] / 2**20
        assert f"<title>rank {row['rank']}, peak: {peak:.3g} MiB</title>" in fig
        assert f"<title>rank {row['rank']}, current: {current:.3g} MiB</title>" in fig


def test_xss_everywhere_in_a_run_report_is_escaped():
    report = run_report(xss=XSS).to_dict()
    report["meta"][XSS] = {XSS: [XSS, XSS]}
    tables = report["tables"]
    for row in tables["ladder"]["rows"]:
        row.update(headline=XSS, hint=XSS)
    tables["ladder"]["rows"][0]["stage"] = XSS
    tables["ladder"]["rows"][1]["status"] = XSS
    tables["strategies"]["rows"][0]["strategy"] = XSS
    tables["trace_breakdown"]["rows"][0]["run"] = XSS
    tables["rank_health"]["rows"][0]["rank"] = XSS
    tables["bench"]["rows"][0]["op"] = XSS
    tables["alpha_beta"]["rows"][0]["op"] = XSS
    tables["drills"]["rows"][0]["drill"] = XSS
    tables["drills"]["title"] = XSS
    tables["steps"]["rows"] = [{"run": XSS, "step": i, "loss": 1.0} for i in range(3)]
    report["checks"][0]["name"] = XSS
    report["checks"][-2]["name"] = XSS
    doc = render_html(report)
    parse(doc)
    assert "<script" not in doc and "alert(1)</" not in doc
    for where in ("verdict", "findings", "figures", "tables", "passed", "environment"):
        assert XSS_ESCAPED in section(doc, where), where
    for fig_id in ("fig-busbw", "fig-step-time", "fig-strategies", "fig-breakdown", "fig-memory", "fig-loss"):
        assert XSS_ESCAPED in figure(doc, fig_id), fig_id  # as SVG text or a tooltip


def test_template_escapes_by_default_and_marks_nothing_safe():
    template = report_html._template()
    assert template.environment.autoescape is True
    source = Path(report_html.__file__).with_name("templates").joinpath("report.html.j2").read_text()
    assert not re.search(r"\|\s*safe\b", source) and "Markup" not in source
    assert "<script" not in source


def test_figure_tables_with_missing_values_render():
    empty_rows = {"ladder": [{"stage": None, "status": None, "seconds": None, "headline": None, "hint": None}],
                  "strategies": [{"strategy": None, "step_time_p50_s": None, "predicted_step_time_s": 0.01}],
                  "trace_breakdown": [{"rank": 0, "step_ms": None, "compute": None}],
                  "trace_late_arrivals": [{"rank": 1, "others_waited_ms": None}],
                  "rank_health": [{"rank": 0, "peak_mem_bytes": None, "current_mem_bytes": float("nan")}],
                  "steps": []}
    doc = render_html({"command": "run", "tables": {name: {"rows": rows} for name, rows in empty_rows.items()}})
    parse(doc)
    assert re.findall(r'<section id="([a-z]+)">', doc) == SECTIONS
    assert '<span class="stage-name">?</span>' in doc
    assert "No rank reported its memory." in doc and "No step has a loss." in doc
    assert 'id="fig-late"' not in doc  # nothing to draw, no figure


# --- the cluster's figures: scaling against world size, bandwidth between pairs of nodes -------

# world_size -> (nodes, ranks_per_node, tokens_per_s, planned_efficiency, busbw_gbps, oversubscribed, gap)
SCALING = {
    1: (1, 1, 1000.0, 1.0, None, False, ""),
    2: (1, 2, 1900.0, 0.97, 3.1, False, ""),
    4: (2, 2, 3500.0, 0.92, 1.4, False, ""),
    8: (4, 2, 5200.0, 0.9, 0.8, True, "comm_exposed"),
}
HOSTS = ["node-a", "node-b", "node-c", "node-d"]
SLOW_NODE = 2
ROUNDS = [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]]  # round-robin over 4 nodes


def scaling_table(gap: str = "") -> Table:
    table = Table("scaling", ["world_size", "nodes", "ranks_per_node", "tokens_per_s", "step_time_s", "efficiency",
                              "planned_efficiency", "planned_step_time_s", "busbw_gbps", "grad_bytes",
                              "oversubscribed", "gap"], title="scaling", units={"tokens_per_s": "tokens/s"})
    tps1 = SCALING[1][2]
    for world, (nodes, per_node, tps, planned, busbw, over, row_gap) in SCALING.items():
        table.add(world_size=world, nodes=nodes, ranks_per_node=per_node, tokens_per_s=tps, step_time_s=0.1,
                  efficiency=tps / (world * tps1), planned_efficiency=planned, planned_step_time_s=0.1,
                  busbw_gbps=busbw, grad_bytes=2**24, oversubscribed=over, gap=gap or row_gap)
    return table


def pair_gbps(a: int, b: int) -> float:
    """a -> b: 10-ish GB/s, the slow node's link 0.03-0.04 either way."""
    if SLOW_NODE in (a, b):
        return 0.03 if a == SLOW_NODE else 0.04
    return 10.0 + a + 0.1 * b


def pairs_tables(hosts: list[str] = HOSTS, shares: bool = True) -> list[Table]:
    """`distval comm pairs` on 4 nodes of 2 ranks, node 2's NIC slow: its pairs, within-node pairs,
    and (with `shares`) pair_nodes."""
    pairs = Table("pairs", ["level", "node_a", "node_b", "host_a", "host_b", "rank_a", "rank_b", "round", "bytes",
                            "a_to_b_gbps", "b_to_a_gbps"], title="pair bandwidth")
    for rnd, round_pairs in enumerate(ROUNDS):
        for a, b in round_pairs:
            pairs.add(level="node", node_a=a, node_b=b, host_a=hosts[a], host_b=hosts[b], rank_a=2 * a,
                      rank_b=2 * b, round=rnd, bytes=2**24, a_to_b_gbps=pair_gbps(a, b), b_to_a_gbps=pair_gbps(b, a))
    for node, host in enumerate(hosts):
        pairs.add(level="rank", node_a=node, node_b=node, host_a=host, host_b=host, rank_a=2 * node,
                  rank_b=2 * node + 1, round=0, bytes=2**24, a_to_b_gbps=40.0 + node, b_to_a_gbps=41.0 + node)
    if not shares:
        return [pairs]
    nodes = Table("pair_nodes", ["node", "host", "ranks", "pair_gbps", "pair_share", "allreduce_busbw_gbps",
                                 "compute_gflops", "compute_share"], title="per node")
    for node, host in enumerate(hosts):
        share = 0.004 if node == SLOW_NODE else 1.0
        nodes.add(node=node, host=host, ranks=2, pair_gbps=10.5 * share, pair_share=share, allreduce_busbw_gbps=20.0,
                  compute_gflops=50.0, compute_share=1.0)
    return [pairs, nodes]


def cluster_report(xss: str = "") -> Report:
    """A report with the scaling ladder and the pairs of 4 nodes (hosts carrying `xss` when given)."""
    report = Report("scale", meta={"world_size": 8})
    report.add(Check("scale efficiency", Status.WARN, "efficiency 0.65 at 8 ranks", hint="see the gap column"))
    report.tables.append(scaling_table(xss))
    report.tables += pairs_tables([h + xss for h in HOSTS])
    return report


@pytest.fixture(scope="module")
def cluster_doc() -> str:
    return render_html(cluster_report().to_dict())


def test_scaling_chart_draws_measured_planned_and_ideal(cluster_doc):
    parse(cluster_doc)
    fig = figure(cluster_doc, "fig-scaling")
    lines = re.findall(r'<polyline[^>]*class="series" data-series="(\w+)" points="([^"]+)"[^>]*stroke="([^"]+)"'
                       r'(?: stroke-width="[0-9.]+")?(?: stroke-dasharray="([^"]+)")?', fig)
    by_name = {}
    for name, points, colour, dash in lines:
        by_name.setdefault(name, []).append((points.split(), colour, dash))
    # efficiency panel: ideal, planned, measured; tokens panel: ideal, measured
    assert sorted(by_name) == ["ideal", "measured", "planned"]
    assert len(by_name["measured"]) == 2 and len(by_name["ideal"]) == 2 and len(by_name["planned"]) == 1
    points, colour, dash = by_name["planned"][0]
    assert len(points) == len(SCALING) and colour == report_html.PREDICTION_COLOUR and dash
    assert all(not dash for _, _, dash in by_name["measured"])
    flat = by_name["ideal"][0][0]  # efficiency 1: one height across the panel
    assert len({p.split(",")[1] for p in flat}) == 1
    for world, (_, _, tps, planned, _, _, _) in SCALING.items():
        efficiency = tps / (world * SCALING[1][2])
        assert f"<title>world {world}" in fig
        assert f"efficiency {efficiency:.2f}, planned {planned:.2f}" in fig
    assert "world 8 (4 nodes × 2 ranks), 5,200 tokens/s" in fig and "busbw 0.80 GB/s, gap: comm_exposed" in fig
    assert "hollow" in fig.lower() and "ranks outnumber cores" in fig


def test_scaling_points_are_hollow_where_oversubscribed(cluster_doc):
    fig = figure(cluster_doc, "fig-scaling")
    points = re.findall(r'<circle class="point" data-series="measured"[^>]*fill="([^"]+)"[^>]*>'
                        r"<title>world (\d+)", fig)
    assert len(points) == 2 * len(SCALING)  # efficiency and tokens/s
    for fill, world in points:
        assert (fill == "#fff") == SCALING[int(world)][5], world


def test_scaling_ideal_throughput_is_linear_from_the_smallest_world(cluster_doc):
    fig = figure(cluster_doc, "fig-scaling")
    assert "<title>ideal: 1 ranks 1,000 tokens/s, 2 ranks 2,000 tokens/s, 4 ranks 4,000 tokens/s, " \
           "8 ranks 8,000 tokens/s</title>" in fig
    ideal = re.findall(r'data-series="ideal" points="([^"]+)"', fig)[1].split()
    measured = re.findall(r'data-series="measured" points="([^"]+)"', fig)[1].split()
    y0, y1 = float(ideal[0].split(",")[1]), float(ideal[-1].split(",")[1])
    assert ideal[0] == measured[0]  # both start at the smallest world's tokens/s
    bottom = y0 + (y0 - y1) / (8 - 1)  # the pixel height of 0 tokens/s, on the ideal's line
    heights = [bottom - float(p.split(",")[1]) for p in measured]
    for height, (world, row) in zip(heights, SCALING.items()):
        assert height / heights[0] == pytest.approx(row[2] / SCALING[1][2], rel=1e-2), world


def test_no_scaling_table_no_scaling_figure(doc):
    assert 'id="fig-scaling"' not in doc and 'id="fig-pairs"' not in doc
    doc = render_html(Report("scale", tables=[Table("scaling", ["world_size", "efficiency"])]).to_dict())
    parse(doc)
    assert "No scaling row has a world size" in figure(doc, "fig-scaling")


def test_scaling_tolerates_missing_values():
    rows = [{"world_size": 1, "tokens_per_s": None, "efficiency": 1.0},
            {"world_size": None, "efficiency": 0.5}, {"world_size": 2, "efficiency": None, "planned_efficiency": 0.9},
            {"world_size": 4, "efficiency": float("nan"), "tokens_per_s": 300.0, "oversubscribed": None},
            {"world_size": "8", "efficiency": 0.1}, {}]
    doc = render_html({"command": "scale", "tables": {"scaling": {"rows": rows}}})
    parse(doc)
    fig = figure(doc, "fig-scaling")
    assert fig.count('data-series="measured"') == 1 + 1 + 2  # eff: line + 1 point; tokens: line + 1 point
    assert "<title>world 2, planned 0.90</title>" in fig
    one = render_html({"tables": {"scaling": {"rows": [{"world_size": 4, "efficiency": 0.8}]}}})
    assert figure(one, "fig-scaling").count("<circle") == 1


def heat_cells(fig: str) -> list[tuple[str, str]]:
    """(fill, tooltip) of each measured cell."""
    return re.findall(r'<rect class="cell"[^>]*fill="(#[0-9a-f]{6})"[^>]*><title>([^<]+)</title>', fig)


def test_pair_heat_map_one_cell_per_direction(cluster_doc):
    fig = figure(cluster_doc, "fig-pairs")
    node_grid = fig[:fig.index("</svg>")]
    cells = heat_cells(node_grid)
    assert len(cells) == 4 * 3 and node_grid.count('class="diag"') == 4
    titles = {title for _, title in cells}
    for rnd, round_pairs in enumerate(ROUNDS):
        for a, b in round_pairs:
            for src, dst in ((a, b), (b, a)):
                gbps = report_html._fmt_float(pair_gbps(src, dst))
                assert f"node {src} ({HOSTS[src]}) -&gt; node {dst} ({HOSTS[dst]}): {gbps} GB/s, round {rnd}" \
                    in titles
    assert "node 2 (node-c) -&gt; node 0 (node-a): 0.03 GB/s, round 1" in titles
    # the colour scale runs from the lowest value (first stop) to the highest (last stop)
    fills = {title.split(": ")[1].split(" GB/s")[0]: fill for fill, title in cells}
    assert fills["0.03"] == report_html.HEAT_STOPS[0] and fills[_fmt_float(pair_gbps(3, 1))] == \
        report_html.HEAT_STOPS[-1]
    assert ">0.03 GB/s</text>" in node_grid and f">{pair_gbps(3, 1):.3g} GB/s</text>" in node_grid  # colour bar
    assert '<text class="cell-value' in node_grid and ">0.04</text>" in node_grid  # values in small grids


def test_pair_heat_map_outlines_the_slow_node_and_shows_shares(cluster_doc):
    fig = figure(cluster_doc, "fig-pairs")
    outlines = re.findall(r'<rect class="outline" data-node="(\d+)" x="([0-9.]+)" y="([0-9.]+)" '
                          r'width="([0-9.]+)" height="([0-9.]+)"', fig)
    assert {node for node, *_ in outlines} == {str(SLOW_NODE)} and len(outlines) == 2  # its row and column
    row = next(o for o in outlines if float(o[3]) > float(o[4]))
    cells = re.findall(r'<rect class="(?:cell|diag)" x="([0-9.]+)" y="([0-9.]+)"', fig[:fig.index("</svg>")])
    ys = sorted({float(y) for _, y in cells})
    assert float(row[2]) == ys[SLOW_NODE]  # the outline sits on the slow node's row
    assert re.search(rf'<text class="weak" data-node="{SLOW_NODE}"[^>]*><title>node 2 \(node-c\), 2 ranks, '
                     r"pairs 0.042 GB/s, 0.00x the median", fig)
    assert "0.004x link · 1.00x compute</text>" in fig and "1.00x link · 1.00x compute</text>" in fig


def test_pair_heat_map_compute_share_outlines_too():
    pairs, nodes = pairs_tables()
    nodes.rows[1]["compute_share"] = 0.5
    doc = render_html(Report("comm pairs", tables=[pairs, nodes]).to_dict())
    assert set(re.findall(r'class="outline" data-node="(\d+)"', figure(doc, "fig-pairs"))) == {"1", str(SLOW_NODE)}


def test_pair_heat_map_one_rank_grid_per_node(cluster_doc):
    fig = figure(cluster_doc, "fig-pairs")
    charts = fig.split("</svg>")[1:-1]
    assert len(charts) == len(HOSTS)
    for node, (host, chart) in enumerate(zip(HOSTS, charts)):
        assert f"node {node} ({host}): between its ranks" in chart
        assert [t for _, t in heat_cells(chart)] == [f"rank {2 * node} -&gt; rank {2 * node + 1}: {40.0 + node:.2f} "
                                                     f"GB/s, round 0", f"rank {2 * node + 1} -&gt; rank {2 * node}: "
                                                     f"{41.0 + node:.2f} GB/s, round 0"]


def test_pair_heat_map_without_pair_nodes_and_with_none_values():
    (pairs,) = pairs_tables(shares=False)
    pairs.rows[0]["b_to_a_gbps"] = None
    pairs.rows[1].update(round=None, host_a=None)
    pairs.rows.append({"level": "node", "node_a": None, "node_b": 1})
    pairs.rows.append({"level": None})
    doc = render_html(Report("comm pairs", tables=[pairs]).to_dict())
    parse(doc)
    fig = figure(doc, "fig-pairs")
    node_grid = fig[:fig.index("</svg>")]
    assert len(heat_cells(node_grid)) == 11 and node_grid.count('class="cell-missing"') == 1
    assert "node 1 (node-b) -&gt; node 0 (node-a): not measured, round 0" in node_grid
    # no round; the host from the other rows that name node 2
    assert "<title>node 2 (node-c) -&gt; node 3 (node-d): 0.03 GB/s</title>" in node_grid
    assert 'class="outline"' not in fig and "link · compute" not in fig
    empty = render_html(Report("comm pairs", tables=[Table("pairs", ["level", "node_a"])]).to_dict())
    assert "No pair has a measured bandwidth." in figure(empty, "fig-pairs")


def test_pair_heat_map_large_clusters(monkeypatch):
    def ring(num_nodes: int) -> dict:
        rows = [{"level": "node", "node_a": i, "node_b": (i + 1) % num_nodes, "round": 0, "host_a": f"h{i}",
                 "a_to_b_gbps": 0.5 if i == 7 else 10.0, "b_to_a_gbps": 10.0} for i in range(num_nodes)]
        return {"command": "comm pairs", "tables": {"pairs": {"rows": rows}}}

    fig = figure(render_html(ring(100)), "fig-pairs")
    assert len(heat_cells(fig)) == 2 * 100 and fig.count('class="cell-missing"') == 100 * 99 - 200
    assert "cell-value" not in fig  # no text in cells past 16 nodes
    widths = set(re.findall(r'<rect class="cell" x="[0-9.]+" y="[0-9.]+" width="([0-9.]+)"', fig))
    assert widths == {"6.4"}  # 640 px / 100
    assert ">n0</text>" in fig and ">n1</text>" not in fig and ">n3</text>" in fig  # a label every 14 px or more
    assert "<title>node 7 (h7) -&gt; node 8 (h8): 0.5 GB/s, round 0</title>" in fig
    monkeypatch.setattr(report_html, "GRID_PX", 60)  # 1.5 px a cell: the floor, without 200+ nodes' render time
    small = figure(render_html(ring(40)), "fig-pairs")
    assert set(re.findall(r'<rect class="cell" x="[0-9.]+" y="[0-9.]+" width="([0-9.]+)"', small)) == {"3.0"}
    monkeypatch.undo()

    fig = figure(render_html(ring(300)), "fig-pairs")
    assert "<rect class=\"cell" not in fig and "300 nodes, more than 256" in fig
    bars = re.findall(r'<rect class="share"><title>([^<]+)</title>|<rect class="share"[^>]*fill="([^"]+)"', fig)
    assert fig.count('class="share"') == 300 and len(bars) == 300
    # node 7's median is (0.5, 10, 10, 10) -> 10; shares computed from the pairs, all 1.00 here
    assert "node 7 (h7): pairs 10 GB/s (1.00x the median)" in fig


def test_cluster_strings_are_escaped():
    doc = render_html(cluster_report(xss=XSS).to_dict())
    parse(doc)
    assert "<script" not in doc and "alert(1)</" not in doc
    for fig_id in ("fig-scaling", "fig-pairs"):
        assert XSS_ESCAPED in figure(doc, fig_id), fig_id
