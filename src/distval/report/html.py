"""One self-contained HTML page for a distval report (the dict from `Report.to_dict()`).

The page, top to bottom:
  1. a heading with the command and the overall verdict, and one coloured badge per status with
     its count (OK, WARN, FAIL, SKIP, ERROR);
  2. the meta (versions, backend, world size, hosts...) as a compact key/value table, nested
     lists and dicts rendered as lists and sub-tables;
  3. the checks a person must act on (FAIL, ERROR, WARN, in that order), each with its summary,
     hint, `where` and collapsible details; then the OK and SKIP checks collapsed in `<details>`,
     grouped by the first two words of the check name (e.g. "comm.check all_reduce/sum") and
     counted, since there can be hundreds;
  4. if a `bench` table exists, an inline SVG plot of busbw (GB/s) against message size (log2
     axis, one line per op and in-place form); if an `alpha_beta` table exists too, each op's
     fitted model t(S) = α + S/β is drawn dashed as the busbw it implies:
     busbw(S) = factor · S / t(S), factor being the op's busbw/algbw ratio read off the bench rows;
  5. compare's strategies as bars; a trace analysis's breakdown per rank as stacked bars (one
     colour per category, summing to the step time) and who makes the others wait;
  6. every table, with its title and each column's units in the header.

Self-contained: inline CSS, hand-written SVG, no script, no external reference (a CSP meta tag
forbids any fetch). Everything taken from the report is HTML-escaped.
"""

from __future__ import annotations

import html
import json
import math
import shlex
from typing import Any

STATUS_ORDER = ("OK", "WARN", "FAIL", "SKIP", "ERROR")
PROBLEM_ORDER = ("FAIL", "ERROR", "WARN")
COLLAPSED = ("OK", "SKIP")
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1",
           "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac")
MAX_DETAILS_CHARS = 20_000

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;\
padding:0 16px;color:#222}
h1{font-size:22px;margin:0 0 8px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:400px}
.badge{display:inline-block;padding:2px 8px;border-radius:10px;color:#fff;font-weight:600;font-size:12px;\
margin-right:4px}
.zero{opacity:.35}.OK{background:#2e7d32}.WARN{background:#ef8f00}.FAIL{background:#c62828}
.SKIP{background:#757575}.ERROR{background:#6a1b9a}.other{background:#37474f}
table{border-collapse:collapse;margin:4px 0 12px}th,td{border:1px solid #ddd;padding:2px 6px;vertical-align:top}
th{background:#f3f3f3;text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}
th .unit{font-weight:400;color:#666;font-size:11px}tr.bad td{background:#fdecea}
table.kv th{width:1%;white-space:nowrap}table.kv table.kv{margin:0}ul.val{margin:0;padding-left:18px}
.check{border-left:4px solid #999;padding:4px 10px;margin:8px 0;background:#fafafa}
.check.FAIL{border-color:#c62828}.check.ERROR{border-color:#6a1b9a}.check.WARN{border-color:#ef8f00}
.check p{margin:2px 0}.hint{color:#444}.where{color:#555;font-size:12px}.dash{color:#999}
details>summary{cursor:pointer;margin:4px 0}svg text{font:11px system-ui,sans-serif;fill:#333}
"""


def render_html(report: dict[str, Any]) -> str:
    """The whole page as one string; tolerant of missing keys, empty tables and None values."""
    command = str(report.get("command") or "distval")
    checks = [c for c in report.get("checks") or [] if isinstance(c, dict)]
    counts = _counts(report.get("summary"), checks)
    tables = _tables_by_name(report.get("tables"))
    verdict = _verdict(counts)
    body = [
        f"<h1>distval {_e(command)} &mdash; {_badge(verdict)}</h1>",
        f"<p>{' '.join(_badge(s, counts.get(s, 0)) for s in STATUS_ORDER)}"
        f" <span class=\"where\">schema {_e(report.get('schema', ''))}</span></p>",
        _meta_section(report.get("meta")),
        _checks_section(checks),
        _plot_section(tables),
        _strategies_section(tables),
        _trace_section(tables),
        _tables_section(tables),
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>distval {_e(command)} &mdash; {_e(verdict)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(part for part in body if part)
        + "\n</body>\n</html>\n"
    )


# --- small helpers -----------------------------------------------------------------------------

def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> float | None:
    """A finite float, or None for anything else (None, bools, strings, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _fmt_float(x: float) -> str:
    """2 decimals in the everyday range, 3 significant digits for the very small and very large."""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    if 1 <= abs(x) < 1e6:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _size_label(n: float) -> str:
    """Bytes as nccl-tests prints them (binary): 8, 1K, 1M, 64M, 1.5K."""
    for unit, mult in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if abs(n) >= mult:
            value = n / mult
            return f"{int(value)}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{int(n)}" if n == int(n) else f"{n:.3g}"


def _badge(status: str, count: int | None = None) -> str:
    css = status if status in STATUS_ORDER else "other"
    if count is None:
        return f'<span class="badge {css}">{_e(status)}</span>'
    dim = " zero" if not count else ""
    return f'<span class="badge {css}{dim}">{_e(status)} {int(count)}</span>'


def _counts(summary: Any, checks: list[dict[str, Any]]) -> dict[str, int]:
    """The report's own summary when it has one, else counted from the checks."""
    if isinstance(summary, dict) and summary:
        return {str(k): int(v) for k, v in summary.items() if _num(v) is not None}
    out = {s: 0 for s in STATUS_ORDER}
    for c in checks:
        status = str(c.get("status", ""))
        out[status] = out.get(status, 0) + 1
    return out


def _verdict(counts: dict[str, int]) -> str:
    for status in ("ERROR", "FAIL", "WARN", "OK", "SKIP"):
        if counts.get(status):
            return status
    return "NO CHECKS"


def _tables_by_name(tables: Any) -> dict[str, dict[str, Any]]:
    """`tables` is a dict name -> table in the schema; a list of tables is accepted too."""
    if isinstance(tables, dict):
        items = [t if isinstance(t, dict) else {} for t in tables.values()]
        names = list(tables)
    elif isinstance(tables, list):
        items = [t for t in tables if isinstance(t, dict)]
        names = [str(t.get("name", f"table{i}")) for i, t in enumerate(items)]
    else:
        return {}
    return {str(name): t for name, t in zip(names, items)}


# --- meta --------------------------------------------------------------------------------------

def _value_html(value: Any, depth: int = 0) -> str:
    """Scalars as text, lists of scalars comma-joined, other lists as bullets, dicts as sub-tables."""
    if value is None:
        return '<span class="dash">&mdash;</span>'
    if isinstance(value, float):
        return _e(_fmt_float(value))
    if depth > 4:
        return f"<code>{_e(json.dumps(value, default=str))}</code>"
    if isinstance(value, dict):
        return _kv_table(value, depth + 1) if value else "{}"
    if isinstance(value, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in value):
            return ", ".join(_value_html(v, depth + 1) for v in value) or "[]"
        items = "".join(f"<li>{_value_html(v, depth + 1)}</li>" for v in value)
        return f'<ul class="val">{items}</ul>'
    return _e(value)


def _meta_value_html(key: str, value: Any, depth: int) -> str:
    """A command line reads best as one; byte sizes as 1K, 64M."""
    if key == "argv" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return f"<code>{_e(shlex.join(value))}</code>"
    numbers = value if isinstance(value, list) else [value]
    if key.endswith("_bytes") and numbers and all(_num(v) is not None for v in numbers):
        return _e(", ".join(_size_label(v) for v in numbers))
    return _value_html(value, depth)


def _kv_table(mapping: dict[str, Any], depth: int = 0) -> str:
    rows = "".join(
        f"<tr><th>{_e(k)}</th><td>{_meta_value_html(str(k), v, depth)}</td></tr>" for k, v in mapping.items()
    )
    return f'<table class="kv">{rows}</table>'


def _meta_section(meta: Any) -> str:
    if not isinstance(meta, dict) or not meta:
        return ""
    return f"<h2>Run</h2>\n{_kv_table(meta)}"


# --- checks ------------------------------------------------------------------------------------

def _where_text(where: Any) -> str:
    if not isinstance(where, dict) or not where:
        return ""
    parts = []
    for k, v in where.items():
        shown = _size_label(v) if (k == "bytes" or str(k).endswith("_bytes")) and _num(v) is not None else v
        parts.append(f"{k}={shown}")
    return ", ".join(parts)


def _details_json(details: Any) -> str:
    text = json.dumps(details, indent=2, default=str, ensure_ascii=False)
    if len(text) > MAX_DETAILS_CHARS:
        text = text[:MAX_DETAILS_CHARS] + f"\n... ({len(text) - MAX_DETAILS_CHARS} more characters in the JSON report)"
    return f"<details><summary>details</summary><pre>{_e(text)}</pre></details>"


def _problem_html(check: dict[str, Any]) -> str:
    status = str(check.get("status", ""))
    parts = [f'<div class="check {_e(status)}">',
             f"<p>{_badge(status)} <code>{_e(check.get('name', ''))}</code></p>",
             f'<p class="summary">{_e(check.get("summary", ""))}</p>']
    if check.get("hint"):
        parts.append(f'<p class="hint"><b>Hint:</b> {_e(check["hint"])}</p>')
    where = _where_text(check.get("where"))
    if where:
        parts.append(f'<p class="where"><b>Where:</b> {_e(where)}</p>')
    if check.get("details"):
        parts.append(_details_json(check["details"]))
    parts.append("</div>")
    return "\n".join(parts)


def _collapsed_html(status: str, checks: list[dict[str, Any]]) -> str:
    """One <details> per status, inside it one per group (the first two words of the name), counted."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in checks:
        words = str(c.get("name") or "").split()
        groups.setdefault(" ".join(words[:2]) or "(unnamed)", []).append(c)
    inner = []
    for family, members in groups.items():
        rows = "".join(
            f"<tr><td><code>{_e(c.get('name', ''))}</code></td><td>{_e(c.get('summary', ''))}</td>"
            f"<td>{_e(_where_text(c.get('where')))}</td></tr>" for c in members)
        inner.append(f"<details><summary><code>{_e(family)}</code> ({len(members)})</summary>"
                     f"<table><tr><th>check</th><th>summary</th><th>where</th></tr>{rows}</table></details>")
    label = (
        f"{len(checks)} check{'s' if len(checks) != 1 else ''} in {len(groups)} group{'s' if len(groups) != 1 else ''}"
    )
    return f"<details><summary>{_badge(status, len(checks))} {label}</summary>\n" + "\n".join(inner) + "\n</details>"


def _checks_section(checks: list[dict[str, Any]]) -> str:
    out = ["<h2>Checks</h2>"]
    if not checks:
        return out[0] + "\n<p>No checks in this report.</p>"
    by_status: dict[str, list[dict[str, Any]]] = {}
    for c in checks:
        by_status.setdefault(str(c.get("status", "")), []).append(c)
    # Unknown statuses are shown with the problems rather than hidden.
    problem_order = list(PROBLEM_ORDER) + [s for s in by_status if s not in PROBLEM_ORDER + COLLAPSED]
    problems = [c for s in problem_order for c in by_status.get(s, [])]
    out += [_problem_html(c) for c in problems] or ["<p>No FAIL, ERROR or WARN checks.</p>"]
    out += [_collapsed_html(s, by_status[s]) for s in COLLAPSED if by_status.get(s)]
    return "\n".join(out)


# --- tables ------------------------------------------------------------------------------------

def _is_bytes_column(column: str, units: dict[str, Any]) -> bool:
    return column == "bytes" or column.endswith("_bytes") or units.get(column) == "B"


def _cell_html(value: Any, is_bytes: bool) -> str:
    if value is None:
        return '<td class="dash">&mdash;</td>'
    if isinstance(value, bool):
        return f"<td>{'yes' if value else 'no'}</td>"
    if isinstance(value, (int, float)):
        if is_bytes and math.isfinite(value):
            return f'<td class="num" title="{_e(value)}">{_e(_size_label(value))}</td>'
        return f'<td class="num">{_e(_fmt_float(value) if isinstance(value, float) else value)}</td>'
    if isinstance(value, (dict, list, tuple)):
        return f"<td><code>{_e(json.dumps(value, default=str))}</code></td>"
    return f"<td>{_e(value)}</td>"


def _table_html(name: str, table: dict[str, Any]) -> str:
    rows = [r for r in table.get("rows") or [] if isinstance(r, dict)]
    columns = [str(c) for c in table.get("columns") or []]
    if not columns:  # derive them from the rows, in first-seen order
        columns = list(dict.fromkeys(k for r in rows for k in r))
    units = table.get("units") if isinstance(table.get("units"), dict) else {}
    title = table.get("title") or name
    head = f"<h3>{_e(title)} <code>{_e(name)}</code> <span class=\"where\">({len(rows)} rows)</span></h3>"
    if not rows:
        return head + "\n<p>No rows.</p>"
    header = "".join(
        f"<th>{_e(c)}" + (f'<br><span class="unit">{_e(units[c])}</span>' if units.get(c) else "") + "</th>"
        for c in columns)
    flags = [_is_bytes_column(c, units) for c in columns]
    body = []
    for r in rows:
        bad = ' class="bad"' if _num(r.get("wrong")) else ""
        body.append(f"<tr{bad}>" + "".join(_cell_html(r.get(c), f) for c, f in zip(columns, flags)) + "</tr>")
    return f"{head}\n<table>\n<tr>{header}</tr>\n" + "\n".join(body) + "\n</table>"


def _tables_section(tables: dict[str, dict[str, Any]]) -> str:
    if not tables:
        return ""
    return "<h2>Tables</h2>\n" + "\n".join(_table_html(name, t) for name, t in tables.items())


# --- the bench plot ----------------------------------------------------------------------------

def _series(rows: list[dict[str, Any]]) -> dict[tuple[str, str, Any], list[tuple[float, float]]]:
    """(op, dtype, inplace) -> sorted (bytes, busbw) points; non-positive sizes (log axis) and
    missing or negative bandwidths are skipped."""
    out: dict[tuple[str, str, Any], list[tuple[float, float]]] = {}
    for r in rows:
        x, y = _num(r.get("bytes")), _num(r.get("busbw_gbps"))
        key = (str(r.get("op", "")), str(r.get("dtype", "")), r.get("inplace"))
        if x is None or y is None or x <= 0 or y < 0:
            continue
        out.setdefault(key, []).append((x, y))
    return {k: sorted(v) for k, v in out.items()}


def _bus_factor(rows: list[dict[str, Any]], op: str) -> float | None:
    """busbw / algbw for this op: nccl-tests' bus factor at this world size, read off the rows."""
    ratios = []
    for r in rows:
        algbw, busbw = _num(r.get("algbw_gbps")), _num(r.get("busbw_gbps"))
        if r.get("op") == op and algbw and algbw > 0 and busbw is not None:
            ratios.append(busbw / algbw)
    return sorted(ratios)[len(ratios) // 2] if ratios else None


def _model_curves(
    fits: list[dict[str, Any]],
    bench_rows: list[dict[str, Any]],
    series: dict[tuple[str, str, Any], list[tuple[float, float]]],
) -> dict[str, list[tuple[float, float]]]:
    """op -> busbw implied by the fitted α–β model over the op's measured size range."""
    curves = {}
    for f in fits:
        op = str(f.get("op", ""))
        alpha_us, beta_gbps = _num(f.get("alpha_us")), _num(f.get("beta_gbps"))
        factor = _bus_factor(bench_rows, op)
        xs = [x for (o, _, _), pts in series.items() if o == op for x, _ in pts]
        if alpha_us is None or alpha_us < 0 or not beta_gbps or beta_gbps <= 0 or not factor or not xs:
            continue
        lo, hi = math.log2(min(xs)), math.log2(max(xs))
        sizes = [2 ** (lo + (hi - lo) * i / 47) for i in range(48)] if hi > lo else [min(xs)]
        curves[op] = [(s, factor * s / (alpha_us * 1e-6 + s / (beta_gbps * 1e9)) / 1e9) for s in sizes]
    return curves


def _nice_step(span: float, target: int = 5) -> float:
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


class _Axes:
    """Maps data to pixels: log2 x, linear y from 0."""

    def __init__(self, x_min: float, x_max: float, y_max: float, box: tuple[int, int, int, int]):
        self.lx0, self.lx1 = math.floor(math.log2(x_min)), math.ceil(math.log2(x_max))
        if self.lx1 == self.lx0:
            self.lx0, self.lx1 = self.lx0 - 1, self.lx1 + 1
        self.y_step = _nice_step(y_max if y_max > 0 else 1.0)
        self.y_top = self.y_step * math.ceil((y_max if y_max > 0 else 1.0) / self.y_step)
        self.left, self.top, self.width, self.height = box

    def px(self, x: float, y: float) -> tuple[float, float]:
        fx = (math.log2(x) - self.lx0) / (self.lx1 - self.lx0)
        return self.left + fx * self.width, self.top + self.height * (1 - y / self.y_top)


def _axes_svg(ax: _Axes) -> list[str]:
    left, top, width, height = ax.left, ax.top, ax.width, ax.height
    bottom = top + height
    out = [f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="#fff" stroke="#999"/>']
    # at most ~12 labels, on exponents that are multiples of the stride so 1K, 1M, 1G stay labelled
    stride = next((s for s in (1, 2, 5, 10) if (ax.lx1 - ax.lx0) // s <= 12), math.ceil((ax.lx1 - ax.lx0) / 12))
    for e in range(-(-ax.lx0 // stride) * stride, ax.lx1 + 1, stride):
        x, _ = ax.px(2.0 ** e, 0)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{_e(_size_label(2 ** e))}</text>')
    for i in range(round(ax.y_top / ax.y_step) + 1):
        value = i * ax.y_step
        _, y = ax.px(2.0 ** ax.lx0, value)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + width}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(f"{value:g}")}</text>')
    out.append(
        f'<text x="{left + width / 2}" y="{bottom + 34}" text-anchor="middle">message size (bytes, log2)</text>'
        f'<text transform="translate(16 {top + height / 2}) rotate(-90)" text-anchor="middle">busbw (GB/s)</text>'
    )
    return out


def _series_label(key: tuple[str, str, Any], show_dtype: bool) -> str:
    op, dtype, inplace = key
    form = {True: " in-place", False: " out-of-place"}.get(inplace, "") if isinstance(inplace, bool) else ""
    return f"{op}{' ' + dtype if show_dtype else ''}{form}"


def _series_svg(ax: _Axes, points: list[tuple[float, float]], colour: str, dash: str, hollow: bool, label: str) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (ax.px(*p) for p in points))
    line = f'<polyline class="series" points="{coords}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
    fill = "#fff" if hollow else colour
    dots = "".join(
        f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{fill}" stroke="{colour}">'
        f"<title>{_e(label)} {_e(_size_label(x))}: {_e(_fmt_float(y))} GB/s</title></circle>"
        for (x, y), (cx, cy) in ((p, ax.px(*p)) for p in points))
    return line + dots


def _legend_svg(entries: list[tuple[str, str, str]], x0: float, y0: float) -> list[str]:
    out = []
    for i, (label, colour, dash) in enumerate(entries):
        y = y0 + 18 * i
        out.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + 24}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/>'
                   f'<text x="{x0 + 30}" y="{y + 4}">{_e(label)}</text>')
    return out


def _plot_svg(series: dict[tuple[str, str, Any], list[tuple[float, float]]],
              curves: dict[str, list[tuple[float, float]]]) -> str:
    xs = [x for pts in series.values() for x, _ in pts]
    ax = _Axes(min(xs), max(xs), max(y for pts in series.values() for _, y in pts), (64, 16, 560, 300))
    colours = {op: PALETTE[i % len(PALETTE)] for i, op in enumerate(dict.fromkeys(k[0] for k in series))}
    show_dtype = len({k[1] for k in series}) > 1
    body, legend = _axes_svg(ax), []
    for key, points in series.items():
        dash = ' stroke-dasharray="2 3"' if key[2] is True else ""
        label = _series_label(key, show_dtype)
        body.append(_series_svg(ax, points, colours[key[0]], dash, key[2] is True, label))
        legend.append((label, colours[key[0]], dash))
    # Measured points lie inside the axes by construction; a model curve may overshoot the top.
    body.append('<clipPath id="distval-plot-area"><rect x="64" y="16" width="560" height="300"/></clipPath>'
                '<g clip-path="url(#distval-plot-area)">')
    for op, points in curves.items():
        d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in (ax.px(*p) for p in points))
        dash = ' stroke-dasharray="8 4"'
        body.append(
            f'<path class="model" d="{d}" fill="none" stroke="{colours.get(op, "#333")}" '
            f'stroke-width="1.5"{dash} opacity=".8"/>'
        )
        legend.append((f"{op} α–β model", colours.get(op, "#333"), dash))
    body.append("</g>")
    body += _legend_svg(legend, 640, 24)
    height = max(360, 24 + 18 * len(legend))
    return (f'<svg class="plot" role="img" aria-label="busbw against message size" width="900" height="{height}" '
            f'viewBox="0 0 900 {height}">\n' + "\n".join(body) + "\n</svg>")


def _plot_section(tables: dict[str, dict[str, Any]]) -> str:
    bench = tables.get("bench")
    if not bench:
        return ""
    rows = [r for r in bench.get("rows") or [] if isinstance(r, dict)]
    series = _series(rows)
    if not series:
        return "<h2>Bus bandwidth</h2>\n<p>No plottable bench rows (every size or busbw missing or non-positive).</p>"
    fits = [r for r in (tables.get("alpha_beta") or {}).get("rows") or [] if isinstance(r, dict)]
    curves = _model_curves(fits, rows, series)
    note = " Dashed: the busbw implied by each op's fitted α–β model." if curves else ""
    return (f"<h2>Bus bandwidth</h2>\n<p>busbw (nccl-tests convention) against message size; dotted lines and hollow "
            f"markers are in-place.{note}</p>\n{_plot_svg(series, curves)}")


# --- the compare plot --------------------------------------------------------------------------

def _strategies_section(tables: dict[str, dict[str, Any]]) -> str:
    """Per strategy, horizontal bars of the step time (p50) with the planner's prediction as a
    tick, and of the model state the largest rank holds with the strategy's formula as a tick."""
    rows = [r for r in (tables.get("strategies") or {}).get("rows") or [] if isinstance(r, dict)]
    time_bars = [
        (str(r.get("strategy")), _num(r.get("step_time_p50_s")), _num(r.get("predicted_step_time_s"))) for r in rows
    ]
    state_bars = [(str(r.get("strategy")), _num(r.get("model_state_bytes")), _num(r.get("expected_model_state_bytes")))
                  for r in rows]
    return (_bar_chart("Step time by strategy", time_bars, lambda t: f"{t * 1e3:.1f} ms",
                       "step time p50 (ms); red tick: the planner's prediction")
            + _bar_chart("Model state per rank by strategy", state_bars, lambda b: f"{b / 2**20:.2f} MiB",
                         "parameters + gradients + optimizer state on the largest rank; red tick: the formula"))


_TRACE_CATEGORIES = ("compute", "optimizer", "comm_overlapped", "comm_exposed", "waiting_for_peers", "memcpy", "data",
                     "idle")
_TRACE_COLOURS = ("#4e79a7", "#76b7b2", "#59a14f", "#f28e2b", "#e15759", "#b07aa1", "#edc948", "#bab0ac")


def _trace_section(tables: dict[str, dict[str, Any]]) -> str:
    """`trace analyze` (or a --trace run): one stacked bar per rank, its step time split into
    the breakdown's categories (their shares sum to 100%), and the late-arrival bars."""
    rows = [r for r in (tables.get("trace_breakdown") or {}).get("rows") or [] if isinstance(r, dict)]
    if not rows:
        return ""
    label_w, plot_w, bar_h = 190, 600, 24
    height = bar_h * len(rows) + 60
    parts = [f'<svg width="{label_w + plot_w + 20}" height="{height}" role="img" class="breakdown">']
    for i, r in enumerate(rows):
        y = 5 + i * bar_h
        name = f"{r['run']} rank {r.get('rank')}" if r.get("run") else f"rank {r.get('rank')}"
        step = _num(r.get("step_ms"))
        parts.append(f'<text x="{label_w - 6}" y="{y + 16}" text-anchor="end" font-size="12">{_e(name)}'
                     f'{_e(f" ({step:.1f} ms)") if step is not None else ""}</text>')
        x = float(label_w)
        for cat, colour in zip(_TRACE_CATEGORIES, _TRACE_COLOURS):
            share = _num(r.get(cat)) or 0.0
            w = plot_w * share / 100
            if w > 0:
                parts.append(f'<rect class="series" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{bar_h - 6}" '
                             f'fill="{colour}"><title>{_e(name)}: {_e(cat)} {share:.1f}%</title></rect>')
            x += w
    for k, (cat, colour) in enumerate(zip(_TRACE_CATEGORIES, _TRACE_COLOURS)):
        lx, ly = label_w + (k % 4) * 150, height - 38 + (k // 4) * 16
        parts.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{colour}"></rect>'
                     f'<text x="{lx + 14}" y="{ly + 9}">{_e(cat.replace("_", " "))}</text>')
    parts.append("</svg>")
    late = [r for r in (tables.get("trace_late_arrivals") or {}).get("rows") or [] if isinstance(r, dict)]
    waits = [(f"rank {r.get('rank')}", _num(r.get("others_waited_ms")), None) for r in late]
    return ("<h2>Where each rank's step time goes</h2>\n" + "".join(parts)
            + _bar_chart("Who the others wait for", waits, lambda ms: f"{ms:.2f} ms",
                         "time the other ranks spent waiting for this rank to arrive at a collective (ms)"))


def _bar_chart(title: str, bars: list[tuple[str, float | None, float | None]], fmt: Any, caption: str) -> str:
    """Horizontal bars (name, value, optional tick) as inline SVG; empty when nothing to draw."""
    bars = [(name, v, tick) for name, v, tick in bars if v is not None and v > 0]
    if not bars:
        return ""
    top = max(max(v, tick or 0) for _, v, tick in bars)
    label_w, plot_w, bar_h = 150, 480, 22
    height = bar_h * len(bars) + 30
    parts = [f'<svg width="{label_w + plot_w + 90}" height="{height}" role="img">']
    for i, (name, v, tick) in enumerate(bars):
        y = 5 + i * bar_h
        w = plot_w * v / top
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="12">{_e(name)}</text>')
        parts.append(
            f'<rect class="series" x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{bar_h - 6}" fill="#4e79a7">'
            f"<title>{_e(name)}: {_e(fmt(v))}</title></rect>"
        )
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 15}" font-size="11">{_e(fmt(v))}</text>')
        if tick:
            x = label_w + plot_w * tick / top
            parts.append(
                f'<line class="model" x1="{x:.1f}" x2="{x:.1f}" y1="{y + 1}" y2="{y + bar_h - 1}" stroke="#e15759" '
                f'stroke-width="2"><title>{_e(fmt(tick))}</title></line>'
            )
    parts.append(f'<text x="{label_w}" y="{height - 4}" font-size="11">{_e(caption)}</text>')
    parts.append("</svg>")
    return f"<h2>{_e(title)}</h2>\n" + "".join(parts)
