"""One self-contained HTML page for a distval report (the dict from `Report.to_dict()`), read top-down.

A person opens report.html to learn, in this order: did it pass, what must I do, what do the
measurements look like, what are the exact numbers, how was it run. The page keeps that order:
  1. `#verdict`: "distval <command>" with the overall verdict (ERROR > FAIL > WARN > OK), one
     badge per status with its count and, when the report has a `ladder` table (`distval run`:
     stage, status, seconds, headline, hint), one badge per stage in ladder order, coloured by its
     status, its seconds and headline under it, its hint as the tooltip;
  2. `#findings`: the checks a person must act on (FAIL, ERROR, WARN in that order, then any
     status we do not know, rather than hide it), each with its summary, hint, `where` and
     collapsible details; or one line saying nothing needs action;
  3. `#figures`: each chart only when its table exists, each a <figure> with a caption:
     - busbw (GB/s) against message size (table `bench`; log2 axis, one line per op and in-place
       form); with table `alpha_beta`, each op's fitted model t(S) = α + S/β dashed as the busbw
       it implies: busbw(S) = factor · S / t(S), factor being the op's busbw/algbw ratio read off
       the bench rows;
     - each strategy's measured step time (p50) next to the plan's prediction (table
       `strategies`, when it has a prediction);
     - the strategies' step time, peak memory and model state as bars, the prediction or the
       formula as a tick;
     - the step time of each rank split into the trace's categories, stacked to 100%
       (`trace_breakdown`), and who makes the others wait (`trace_late_arrivals`);
     - peak and current memory per rank (`rank_health`);
     - the loss against the step (`steps`; one line per run when rows carry a `run`);
  4. `#tables`: every table, `ladder` first, with its title and each column's units in the header;
  5. `#passed`: the OK and SKIP checks, collapsed and grouped by the first two words of the
     check name (e.g. "comm.check all_reduce/sum") and counted, since there can be hundreds;
  6. `#environment`: the meta (configuration, versions, hosts...), collapsed, as a key/value
     table; nested lists and dicts as lists and sub-tables.

Python turns the report into plain values (strings, numbers, lists of them) and the template
templates/report.html.j2 lays them out. The page is rendered with Jinja2 because it escapes by
default: the environment has autoescape on and the template marks nothing from the report safe,
so every string from outside (a check name, a hostname, a table cell) is escaped. The charts are
hand-written SVG built here with `_el`, which escapes every attribute value and text it is given;
a charting library would need JavaScript, or a bundle of megabytes copied into every report, and
this page must open offline from a results directory or a mail attachment.

Self-contained: inline CSS and SVG, no script, no external reference; a CSP meta tag forbids any
fetch. Tolerant of missing keys, None values and empty tables.
"""

from __future__ import annotations

import functools
import json
import math
import shlex
from typing import Any, Callable

import jinja2
from markupsafe import Markup, escape

STATUS_ORDER = ("OK", "WARN", "FAIL", "SKIP", "ERROR")
PROBLEM_ORDER = ("FAIL", "ERROR", "WARN")
COLLAPSED = ("OK", "SKIP")
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1",
           "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac")
PREDICTION_COLOUR = "#9aa5b1"
TICK_COLOUR = "#e15759"
MAX_DETAILS_CHARS = 20_000
LADDER_TABLE = "ladder"


def render_html(report: dict[str, Any]) -> str:
    """The whole page as one string; tolerant of missing keys, empty tables and None values."""
    checks = [c for c in report.get("checks") or [] if isinstance(c, dict)]
    tables = _tables_by_name(report.get("tables"))
    counts = _counts(report.get("summary"), checks)
    verdict = _verdict(counts)
    by_status: dict[str, list[dict[str, Any]]] = {}
    for c in checks:
        by_status.setdefault(_text(c.get("status")), []).append(c)
    # Unknown statuses are shown with the problems rather than hidden.
    problem_order = list(PROBLEM_ORDER) + [s for s in by_status if s not in PROBLEM_ORDER + COLLAPSED]
    meta = report.get("meta")
    return _template().render(
        command=_text(report.get("command")) or "distval",
        verdict=verdict,
        verdict_css=_css(verdict),
        counts=[{"status": s, "css": _css(s), "count": counts.get(s, 0)} for s in STATUS_ORDER],
        schema=_text(report.get("schema")),
        stages=_stage_views(tables.get(LADDER_TABLE)),
        num_checks=len(checks),
        findings=[_check_view(c) for s in problem_order for c in by_status.get(s, [])],
        figures=_figures(tables),
        tables=[_table_view(name, tables[name]) for name in sorted(tables, key=lambda n: n != LADDER_TABLE)],
        passed=[_passed_view(s, by_status[s]) for s in COLLAPSED if by_status.get(s)],
        meta=_kv_node(meta) if isinstance(meta, dict) and meta else None,
    )


@functools.lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    # autoescape=True, not select_autoescape(): the file is report.html.j2, and escaping must not
    # depend on a file name.
    env = jinja2.Environment(loader=jinja2.PackageLoader("distval.report", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template("report.html.j2")


# --- small helpers -----------------------------------------------------------------------------

def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _css(status: str) -> str:
    """The CSS class of a status: only our own names reach a class attribute."""
    return status if status in STATUS_ORDER else "other"


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


def _bytes_text(n: float) -> str:
    """Memory as a person reads it: 1.50 GiB, 12.3 MiB."""
    for unit, mult in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= mult:
            return f"{n / mult:.3g} {unit}"
    return f"{n:g} B"


def _seconds_text(s: float) -> str:
    return f"{s:.1f} s" if s < 100 else f"{s:.0f} s"


def _counts(summary: Any, checks: list[dict[str, Any]]) -> dict[str, int]:
    """The report's own summary when it has one, else counted from the checks."""
    if isinstance(summary, dict) and summary:
        return {str(k): int(v) for k, v in summary.items() if _num(v) is not None}
    out = {s: 0 for s in STATUS_ORDER}
    for c in checks:
        status = _text(c.get("status"))
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


def _rows(table: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [r for r in (table or {}).get("rows") or [] if isinstance(r, dict)]


# --- verdict, findings, passed checks ----------------------------------------------------------

def _stage_views(ladder: dict[str, Any] | None) -> list[dict[str, str]]:
    out = []
    for r in _rows(ladder):
        status, seconds = _text(r.get("status")), _num(r.get("seconds"))
        out.append({"name": _text(r.get("stage")) or "?", "status": status, "css": _css(status),
                    "seconds": _seconds_text(seconds) if seconds is not None else "",
                    "headline": _text(r.get("headline")), "hint": _text(r.get("hint"))})
    return out


def _where_text(where: Any) -> str:
    if not isinstance(where, dict) or not where:
        return ""
    parts = []
    for k, v in where.items():
        shown = _size_label(v) if (k == "bytes" or str(k).endswith("_bytes")) and _num(v) is not None else v
        parts.append(f"{k}={shown}")
    return ", ".join(parts)


def _details_text(details: Any) -> str:
    if not details:
        return ""
    text = json.dumps(details, indent=2, default=str, ensure_ascii=False)
    if len(text) > MAX_DETAILS_CHARS:
        text = text[:MAX_DETAILS_CHARS] + f"\n... ({len(text) - MAX_DETAILS_CHARS} more characters in the JSON report)"
    return text


def _check_view(check: dict[str, Any]) -> dict[str, str]:
    status = _text(check.get("status"))
    return {"status": status, "css": _css(status), "name": _text(check.get("name")),
            "summary": _text(check.get("summary")), "hint": _text(check.get("hint")),
            "where": _where_text(check.get("where")), "details": _details_text(check.get("details"))}


def _passed_view(status: str, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """One status, its checks in groups (the first two words of the name), counted."""
    groups: dict[str, list[dict[str, str]]] = {}
    for c in checks:
        words = _text(c.get("name")).split()
        groups.setdefault(" ".join(words[:2]) or "(unnamed)", []).append(_check_view(c))
    label = (f"{len(checks)} check{'s' if len(checks) != 1 else ''} "
             f"in {len(groups)} group{'s' if len(groups) != 1 else ''}")
    return {"status": status, "css": _css(status), "count": len(checks), "label": label,
            "groups": [{"family": family, "checks": members} for family, members in groups.items()]}


# --- meta: a tree of nodes the template's `value` macro walks -----------------------------------

def _node(value: Any, depth: int = 0) -> dict[str, Any]:
    """Scalars as text, lists of scalars comma-joined, other lists as bullets, dicts as sub-tables."""
    if value is None:
        return {"kind": "dash"}
    if isinstance(value, float):
        return {"kind": "text", "text": _fmt_float(value)}
    if depth > 4:
        return {"kind": "code", "text": json.dumps(value, default=str)}
    if isinstance(value, dict):
        return _kv_node(value, depth + 1) if value else {"kind": "text", "text": "{}"}
    if isinstance(value, (list, tuple)):
        if not value:
            return {"kind": "text", "text": "[]"}
        flat = all(not isinstance(v, (dict, list, tuple)) for v in value)
        return {"kind": "join" if flat else "list", "items": [_node(v, depth + 1) for v in value]}
    return {"kind": "text", "text": str(value)}


def _meta_node(key: str, value: Any, depth: int) -> dict[str, Any]:
    """A command line reads best as one; byte sizes as 1K, 64M."""
    if key == "argv" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {"kind": "code", "text": shlex.join(value)}
    numbers = value if isinstance(value, list) else [value]
    if key.endswith("_bytes") and numbers and all(_num(v) is not None for v in numbers):
        return {"kind": "text", "text": ", ".join(_size_label(v) for v in numbers)}
    return _node(value, depth)


def _kv_node(mapping: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    return {"kind": "kv", "items": [(str(k), _meta_node(str(k), v, depth)) for k, v in mapping.items()]}


# --- tables ------------------------------------------------------------------------------------

def _is_bytes_column(column: str, units: dict[str, Any]) -> bool:
    return column == "bytes" or column.endswith("_bytes") or units.get(column) == "B"


def _cell(text: str, cls: str = "", title: str = "", status: str = "") -> dict[str, str]:
    return {"text": text, "cls": cls, "title": title, "status": status}


def _cell_view(column: str, value: Any, is_bytes: bool) -> dict[str, str]:
    if value is None:
        return _cell("", "dash")
    if column == "status" and value in STATUS_ORDER:
        return _cell(value, status=value)
    if isinstance(value, bool):
        return _cell("yes" if value else "no")
    if isinstance(value, (int, float)):
        if is_bytes and math.isfinite(value):
            return _cell(_size_label(value), "num", title=str(value))
        return _cell(_fmt_float(value) if isinstance(value, float) else str(value), "num")
    if isinstance(value, (dict, list, tuple)):
        return _cell(json.dumps(value, default=str), "json")
    return _cell(str(value))


def _table_view(name: str, table: dict[str, Any]) -> dict[str, Any]:
    rows = _rows(table)
    columns = [str(c) for c in table.get("columns") or []]
    if not columns:  # derive them from the rows, in first-seen order
        columns = list(dict.fromkeys(k for r in rows for k in r))
    units = table.get("units") if isinstance(table.get("units"), dict) else {}
    flags = [_is_bytes_column(c, units) for c in columns]
    return {
        "name": name,
        "title": _text(table.get("title")) or name,
        "columns": [{"name": c, "unit": _text(units.get(c))} for c in columns],
        "rows": [{"bad": bool(_num(r.get("wrong"))),
                  "cells": [_cell_view(c, r.get(c), f) for c, f in zip(columns, flags)]} for r in rows],
    }


# --- SVG ---------------------------------------------------------------------------------------

def _el(tag: str, *children: Any, **attrs: Any) -> Markup:
    """One SVG element. Attribute values and text children are escaped, Markup children (other
    elements) kept; `class_` is `class`, other underscores become hyphens (`text_anchor`); None
    attributes are left out; floats get one decimal."""
    attributes = Markup("").join(
        Markup(' {}="{}"').format(Markup("class" if k == "class_" else k.replace("_", "-")),
                                  f"{v:.1f}" if isinstance(v, float) else v)
        for k, v in attrs.items() if v is not None)
    if not children:
        return Markup("<{}{}/>").format(Markup(tag), attributes)
    return Markup("<{0}{1}>{2}</{0}>").format(Markup(tag), attributes, Markup("").join(escape(c) for c in children))


def _svg(width: int, height: float, body: list[Markup], label: str) -> Markup:
    return _el("svg", *body, class_="chart", role="img", aria_label=label, width=width, height=round(height),
               viewBox=f"0 0 {width} {round(height)}")


def _legend(entries: list[tuple[str, str, str | None]], x0: float, y0: float) -> list[Markup]:
    """(label, colour, dash) as short lines, one under the other."""
    out = []
    for i, (label, colour, dash) in enumerate(entries):
        y = y0 + 18 * i
        out.append(_el("line", x1=x0, y1=y, x2=x0 + 24, y2=y, stroke=colour, stroke_width=2, stroke_dasharray=dash))
        out.append(_el("text", label, x=x0 + 30, y=y + 4))
    return out


def _swatches(entries: list[tuple[str, str]], x0: float, y0: float, per_row: int = 4,
              spacing: int = 150) -> list[Markup]:
    """(label, colour) as filled squares, the legend of bars: `per_row` to a row, `spacing` px apart."""
    out = []
    for k, (label, colour) in enumerate(entries):
        x, y = x0 + (k % per_row) * spacing, y0 + (k // per_row) * 16
        out.append(_el("rect", x=x, y=y, width=10, height=10, fill=colour))
        out.append(_el("text", label, x=x + 14, y=y + 9))
    return out


def _nice_step(span: float, target: int = 5) -> float:
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _ticks(lo: float, hi: float, integer: bool = False) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = _nice_step(hi - lo)
    if integer:
        step = max(1.0, round(step))
    first, last = math.floor(lo / step), math.ceil(hi / step)
    return [i * step for i in range(first, last + 1)]


# --- figure: busbw against size ----------------------------------------------------------------

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


def _log_axes_svg(ax: _Axes) -> list[Markup]:
    left, top, width, height = ax.left, ax.top, ax.width, ax.height
    bottom = top + height
    out = [_el("rect", x=left, y=top, width=width, height=height, fill="#fff", stroke="#999")]
    # at most ~12 labels, on exponents that are multiples of the stride so 1K, 1M, 1G stay labelled
    stride = next((s for s in (1, 2, 5, 10) if (ax.lx1 - ax.lx0) // s <= 12), math.ceil((ax.lx1 - ax.lx0) / 12))
    for e in range(-(-ax.lx0 // stride) * stride, ax.lx1 + 1, stride):
        x, _ = ax.px(2.0 ** e, 0)
        out.append(_el("line", x1=x, y1=top, x2=x, y2=bottom, stroke="#eee"))
        out.append(_el("text", _size_label(2 ** e), x=x, y=bottom + 14, text_anchor="middle"))
    for i in range(round(ax.y_top / ax.y_step) + 1):
        value = i * ax.y_step
        _, y = ax.px(2.0 ** ax.lx0, value)
        out.append(_el("line", x1=left, y1=y, x2=left + width, y2=y, stroke="#eee"))
        out.append(_el("text", f"{value:g}", x=left - 6, y=y + 4, text_anchor="end"))
    out.append(_el("text", "message size (bytes, log2)", x=left + width / 2, y=bottom + 34, text_anchor="middle"))
    out.append(_el("text", "busbw (GB/s)", transform=f"translate(16 {top + height / 2}) rotate(-90)",
                   text_anchor="middle"))
    return out


def _series_label(key: tuple[str, str, Any], show_dtype: bool) -> str:
    op, dtype, inplace = key
    form = {True: " in-place", False: " out-of-place"}.get(inplace, "") if isinstance(inplace, bool) else ""
    return f"{op}{' ' + dtype if show_dtype else ''}{form}"


def _series_svg(ax: _Axes, points: list[tuple[float, float]], colour: str, dash: str | None, hollow: bool,
                label: str) -> list[Markup]:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (ax.px(*p) for p in points))
    out = [_el("polyline", class_="series", points=coords, fill="none", stroke=colour, stroke_width=2,
               stroke_dasharray=dash)]
    for x, y in points:
        cx, cy = ax.px(x, y)
        out.append(_el("circle", _el("title", f"{label} {_size_label(x)}: {_fmt_float(y)} GB/s"),
                       cx=cx, cy=cy, r=3, fill="#fff" if hollow else colour, stroke=colour))
    return out


def _busbw_svg(series: dict[tuple[str, str, Any], list[tuple[float, float]]],
               curves: dict[str, list[tuple[float, float]]]) -> Markup:
    xs = [x for pts in series.values() for x, _ in pts]
    box = (64, 16, 560, 300)
    ax = _Axes(min(xs), max(xs), max(y for pts in series.values() for _, y in pts), box)
    colours = {op: PALETTE[i % len(PALETTE)] for i, op in enumerate(dict.fromkeys(k[0] for k in series))}
    show_dtype = len({k[1] for k in series}) > 1
    body, legend = _log_axes_svg(ax), []
    for key, points in series.items():
        dash = "2 3" if key[2] is True else None
        label = _series_label(key, show_dtype)
        body += _series_svg(ax, points, colours[key[0]], dash, key[2] is True, label)
        legend.append((label, colours[key[0]], dash))
    # Measured points lie inside the axes by construction; a model curve may overshoot the top.
    models = []
    for op, points in curves.items():
        d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in (ax.px(*p) for p in points))
        models.append(_el("path", class_="model", d=d, fill="none", stroke=colours.get(op, "#333"),
                          stroke_width=1.5, stroke_dasharray="8 4", opacity=".8"))
        legend.append((f"{op} α–β model", colours.get(op, "#333"), "8 4"))
    if models:
        body += [_el("clipPath", _el("rect", x=box[0], y=box[1], width=box[2], height=box[3]), id="distval-busbw-area"),
                 _el("g", *models, clip_path="url(#distval-busbw-area)")]
    body += _legend(legend, 640, 24)
    return _svg(900, max(360, 24 + 18 * len(legend)), body, "busbw against message size")


def _busbw_figure(tables: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    if "bench" not in tables:
        return None
    rows = _rows(tables["bench"])
    series = _series(rows)
    curves = _model_curves(_rows(tables.get("alpha_beta")), rows, series) if series else {}
    return _figure(
        "fig-busbw", "Bus bandwidth against message size",
        "busbw (nccl-tests convention) against message size, one line per op and form; dotted lines and hollow "
        "markers are in-place." + (" Dashed: the busbw implied by each op's fitted α–β model." if curves else ""),
        [_busbw_svg(series, curves)] if series else [],
        "No plottable bench rows (every size or busbw missing or non-positive).")


# --- figures: bars -----------------------------------------------------------------------------

def _bar_chart(title: str, bars: list[tuple[str, float | None, float | None]], fmt: Callable[[float], str],
               tick_label: str = "") -> Markup | None:
    """Horizontal bars (name, value, optional tick) under a title; None when nothing to draw."""
    bars = [(name, v, tick) for name, v, tick in bars if v is not None and v > 0]
    if not bars:
        return None
    top = max(max(v, tick or 0) for _, v, tick in bars)
    label_w, plot_w, bar_h, head = 170, 480, 22, 22
    body = [_el("text", title, class_="chart-title", x=label_w, y=14)]
    for i, (name, v, tick) in enumerate(bars):
        y = head + i * bar_h
        w = plot_w * v / top
        body.append(_el("text", name, x=label_w - 6, y=y + 15, text_anchor="end"))
        body.append(_el("rect", _el("title", f"{name}: {fmt(v)}"), class_="series", x=label_w, y=y + 3,
                        width=w, height=bar_h - 6, fill=PALETTE[0]))
        body.append(_el("text", fmt(v), x=label_w + w + 4, y=y + 15))
        if tick:
            x = label_w + plot_w * tick / top
            body.append(_el("line", _el("title", " ".join(filter(None, (f"{name}:", tick_label, fmt(tick))))),
                            class_="model", x1=x, x2=x, y1=y + 1, y2=y + bar_h - 1, stroke=TICK_COLOUR,
                            stroke_width=2))
    return _svg(label_w + plot_w + 110, head + bar_h * len(bars) + 6, body, title)


def _grouped_bars(groups: list[tuple[str, list[float | None], str]], series: list[tuple[str, str]],
                  fmt: Callable[[float], str], label: str) -> Markup | None:
    """Horizontal bars on one scale: per group (name, one value per series, a note after its first
    bar) a bar per series, missing values left out; a legend of the series below."""
    top = max((v for _, values, _ in groups for v in values if v is not None and v > 0), default=None)
    if top is None:
        return None
    label_w, plot_w, bar_h, gap = 170, 480, 16, 10
    group_h = bar_h * len(series) + gap
    body = []
    for i, (name, values, note) in enumerate(groups):
        y0 = 6 + i * group_h
        body.append(_el("text", name, x=label_w - 6, y=y0 + bar_h * len(series) / 2 + 4, text_anchor="end"))
        drawn = [(j, v) for j, v in enumerate(values) if v is not None and v > 0]
        for j, v in drawn:
            y, w = y0 + j * bar_h, plot_w * v / top
            body.append(_el("rect", _el("title", f"{name}, {series[j][0]}: {fmt(v)}"), class_="series",
                            x=label_w, y=y + 1, width=w, height=bar_h - 2, fill=series[j][1]))
            text = fmt(v) + (f", {note}" if note and (j, v) == drawn[0] else "")
            body.append(_el("text", text, x=label_w + w + 4, y=y + bar_h - 4))
    legend_y = 6 + len(groups) * group_h + 4
    body += _swatches(series, label_w, legend_y, per_row=2, spacing=220)
    return _svg(label_w + plot_w + 210, legend_y + 16, body, label)


def _step_time_figure(tables: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Measured step time (p50) next to the plan's prediction, per strategy, with their ratio."""
    groups = []
    for r in _rows(tables.get("strategies")):
        measured, predicted = _num(r.get("step_time_p50_s")), _num(r.get("predicted_step_time_s"))
        note = (f"{measured / predicted:.2f}× the prediction" if measured and predicted
                else "no prediction" if measured else "")
        miss = r.get("prediction_miss")  # compare's WARN: outside its band, and the category that misses
        if miss:
            note += f", off: {'step not split' if miss == 'unsplit' else miss}"
        groups.append((("⚠ " if miss else "") + _text(r.get("strategy")), [measured, predicted], note))
    if not any(values[1] for _, values, _ in groups):
        return None
    chart = _grouped_bars(groups, [("measured step time (p50)", PALETTE[0]), ("plan's prediction", PREDICTION_COLOUR)],
                          lambda s: f"{s * 1e3:.1f} ms", "measured against predicted step time")
    return _figure("fig-step-time", "Step time: measured against the plan's prediction",
                   "Per strategy, the measured step time (p50 over steps, slowest rank) and the plan's prediction "
                   "from the bench's α–β fits; the ratio is measured / predicted. ⚠ marks a strategy outside "
                   "0.67–1.5×, with the category that carries the error (compare's WARN says what to do).",
                   [chart] if chart else [])


def _strategies_figure(tables: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    rows = _rows(tables.get("strategies"))
    if not rows:
        return None
    names = [_text(r.get("strategy")) for r in rows]
    charts = [
        _bar_chart("step time p50", [(n, _num(r.get("step_time_p50_s")), None) for n, r in zip(names, rows)],
                   lambda s: f"{s * 1e3:.1f} ms"),
        _bar_chart("peak memory per rank",
                   [(n, _num(r.get("peak_mem_bytes")), _num(r.get("predicted_peak_mem_bytes")))
                    for n, r in zip(names, rows)], _bytes_text, "predicted"),
        _bar_chart("model state on the largest rank",
                   [(n, _num(r.get("model_state_bytes")), _num(r.get("expected_model_state_bytes")))
                    for n, r in zip(names, rows)], _bytes_text, "formula"),
    ]
    return _figure("fig-strategies", "Strategies: step time and memory",
                   "Step time (p50); peak memory per rank, the red tick the plan's prediction; parameters, gradients "
                   "and optimizer state on the largest rank, the red tick the strategy's formula.",
                   [c for c in charts if c], "No strategy has a step time or memory figure.")


_TRACE_CATEGORIES = ("compute", "optimizer", "comm_overlapped", "comm_exposed", "waiting_for_peers", "memcpy", "data",
                     "idle")
_TRACE_COLOURS = ("#4e79a7", "#76b7b2", "#59a14f", "#f28e2b", "#e15759", "#b07aa1", "#edc948", "#bab0ac")


def _breakdown_figure(tables: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """`trace analyze` (or a --trace run): one stacked bar per rank, its step time split into
    the breakdown's categories (their shares sum to 100%)."""
    rows = _rows(tables.get("trace_breakdown"))
    if not rows:
        return None
    label_w, plot_w, bar_h = 190, 600, 24
    legend_y = 10 + bar_h * len(rows)
    body = []
    for i, r in enumerate(rows):
        y = 5 + i * bar_h
        name = f"{r['run']} rank {r.get('rank')}" if r.get("run") else f"rank {r.get('rank')}"
        step = _num(r.get("step_ms"))
        body.append(_el("text", name + (f" ({step:.1f} ms)" if step is not None else ""), x=label_w - 6, y=y + 16,
                        text_anchor="end"))
        x = float(label_w)
        for cat, colour in zip(_TRACE_CATEGORIES, _TRACE_COLOURS):
            w = plot_w * (_num(r.get(cat)) or 0.0) / 100
            if w > 0:
                body.append(_el("rect", _el("title", f"{name}: {cat} {_num(r.get(cat)):.1f}%"), class_="series",
                                x=x, y=y + 3, width=w, height=bar_h - 6, fill=colour))
            x += w
    body += _swatches([(cat.replace("_", " "), colour) for cat, colour in zip(_TRACE_CATEGORIES, _TRACE_COLOURS)],
                      label_w, legend_y)
    return _figure("fig-breakdown", "Where each rank's step time goes",
                   "Per rank, its median step time split into the trace's categories (shares of the step, stacked "
                   "to 100%); the step time in brackets.",
                   [_svg(label_w + plot_w + 20, legend_y + 36, body, "step time breakdown per rank")])


def _late_arrivals_figure(tables: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    rows = _rows(tables.get("trace_late_arrivals"))
    chart = _bar_chart("others waited (ms)", [(f"rank {r.get('rank')}", _num(r.get("others_waited_ms")), None)
                                               for r in rows], lambda ms: f"{ms:.2f} ms")
    if not chart:
        return None
    return _figure("fig-late", "Who the others wait for",
                   "Time the other ranks spent waiting for this rank to arrive at a collective.", [chart])


def _memory_figure(tables: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    rows = _rows(tables.get("rank_health"))
    if not rows:
        return None
    groups = [(f"rank {r.get('rank')}", [_num(r.get("peak_mem_bytes")), _num(r.get("current_mem_bytes"))], "")
              for r in rows]
    chart = _grouped_bars(groups, [("peak", PALETTE[0]), ("current", PALETTE[5])], _bytes_text, "memory per rank")
    return _figure("fig-memory", "Memory per rank",
                   "Per rank, its peak memory over the run and its current memory at the last step the health "
                   "monitor saw.", [chart] if chart else [],
                   "No rank reported its memory.")


# --- figure: loss against step -----------------------------------------------------------------

def _loss_lines(rows: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """run -> sorted (step, loss); one line named "loss" when the rows carry no run."""
    key = "run" if any(r.get("run") is not None for r in rows) else None
    lines: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        step, loss = _num(r.get("step")), _num(r.get("loss"))
        if step is not None and loss is not None:
            lines.setdefault(_text(r.get(key)) if key else "loss", []).append((step, loss))
    return {name: sorted(points) for name, points in lines.items()}


def _line_chart(lines: dict[str, list[tuple[float, float]]], x_label: str, y_label: str) -> Markup:
    """Linear axes fitted to the data (y not from 0: a loss curve's shape is in its range)."""
    xs = [x for pts in lines.values() for x, _ in pts]
    ys = [y for pts in lines.values() for _, y in pts]
    x_ticks, y_ticks = _ticks(min(xs), max(xs), integer=True), _ticks(min(ys), max(ys))
    left, top, width, height = 64, 16, 560, 260
    bottom = top + height

    def px(x: float, y: float) -> tuple[float, float]:
        fx = (x - x_ticks[0]) / (x_ticks[-1] - x_ticks[0])
        fy = (y - y_ticks[0]) / (y_ticks[-1] - y_ticks[0])
        return left + fx * width, bottom - fy * height

    body = [_el("rect", x=left, y=top, width=width, height=height, fill="#fff", stroke="#999")]
    for t in x_ticks:
        x, _ = px(t, y_ticks[0])
        body += [_el("line", x1=x, y1=top, x2=x, y2=bottom, stroke="#eee"),
                 _el("text", f"{t:g}", x=x, y=bottom + 14, text_anchor="middle")]
    for t in y_ticks:
        _, y = px(x_ticks[0], t)
        body += [_el("line", x1=left, y1=y, x2=left + width, y2=y, stroke="#eee"),
                 _el("text", f"{t:.4g}", x=left - 6, y=y + 4, text_anchor="end")]
    body += [_el("text", x_label, x=left + width / 2, y=bottom + 34, text_anchor="middle"),
             _el("text", y_label, transform=f"translate(16 {top + height / 2}) rotate(-90)", text_anchor="middle")]
    for i, (name, points) in enumerate(lines.items()):
        colour = PALETTE[i % len(PALETTE)]
        body.append(_el("polyline", class_="series", points=" ".join("{:.1f},{:.1f}".format(*px(*p)) for p in points),
                        fill="none", stroke=colour, stroke_width=2))
        body += [_el("circle", _el("title", f"{name} {x_label} {x:g}: {y_label} {y:.4g}"), cx=px(x, y)[0],
                     cy=px(x, y)[1], r=2.5, fill=colour) for x, y in points]
    if len(lines) == 1:  # the caption names the only line
        return _svg(660, 320, body, f"{y_label} against {x_label}")
    body += _legend([(name, PALETTE[i % len(PALETTE)], None) for i, name in enumerate(lines)], 640, 24)
    return _svg(900, max(320, 24 + 18 * len(lines)), body, f"{y_label} against {x_label}")


def _loss_figure(tables: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    if "steps" not in tables:
        return None
    lines = _loss_lines(_rows(tables["steps"]))
    return _figure("fig-loss", "Loss", "The training loss (mean over ranks) at each step.",
                   [_line_chart(lines, "step", "loss")] if lines else [], "No step has a loss.")


# --- figures, in page order --------------------------------------------------------------------

def _figure(fig_id: str, title: str, caption: str, charts: list[Markup], empty: str = "") -> dict[str, Any]:
    return {"id": fig_id, "title": title, "caption": caption, "charts": charts, "empty": empty}


def _figures(tables: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    builders = (_busbw_figure, _step_time_figure, _strategies_figure, _breakdown_figure, _late_arrivals_figure,
                _memory_figure, _loss_figure)
    return [f for f in (build(tables) for build in builders) if f]
