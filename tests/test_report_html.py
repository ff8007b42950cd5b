"""The HTML report: well-formed, self-contained, escaped, problems first, one plotted line per series."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from distval.report.html import _fmt_float, _model_curves, _series, _size_label, render_html
from distval.results import Check, Report, Status, Table

XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
WORLD_SIZE = 4
# op -> (in-place forms, bus factor at WORLD_SIZE, alpha_us, beta_gbps): nccl-tests' factors
OPS = {
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
    for op, (forms, factor, alpha_us, beta_gbps) in OPS.items():
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
    assert len(re.findall(r'<path class="model"[^>]*stroke-dasharray', svg)) == len(OPS)
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
    assert set(curves) == set(OPS)
    for op, (_, factor, alpha_us, beta_gbps) in OPS.items():
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
    assert "&quot;wrong_rows&quot;" in doc  # details, as escaped JSON
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
    assert "<h3>collective bandwidth (nccl-tests conventions) <code>bench</code>" in doc
    assert '<th>busbw_gbps<br><span class="unit">GB/s (1e9)</span></th>' in doc
    assert '<td class="num" title="1048576">1M</td>' not in doc  # 1M is not a size in the sweep
    assert '<td class="num" title="2097152">2M</td>' in doc
    assert "<h3>alpha-beta model <code>alpha_beta</code>" in doc
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
