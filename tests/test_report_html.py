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


STAGES = ["doctor", "check", "bench", "compare", "plan", "drills", "trace", "health"]
STAGE_STATUS = {"bench": "WARN", "compare": "FAIL"}
HEADLINES = {"doctor": "2 ranks on 1 host, rendezvous 0.3 s", "check": "212 checks exact",
             "bench": "all_reduce plateau 1.9 GB/s", "plan": "zero2 predicted 41.0 ms/step",
             "compare": "zero2 differs from the reference", "drills": "4 drills recovered bitwise",
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
