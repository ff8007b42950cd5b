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
     - the bandwidth between pairs of nodes as a heat map (table `pairs`; row sends, column receives,
       coloured from the lowest to the highest GB/s, a colour bar giving both; the value in each
       cell up to 16 nodes, a tooltip always); with `pair_nodes`, each node's pair_share and
       compute_share on the right and a node below 0.7x in either outlined; one grid per node of
       its ranks for the `rank` level; over 256 nodes, a bar per node of its pair_share instead;
     - scaling against world size (table `scaling`): efficiency measured, planned (dashed) and
       ideal 1 (dotted), and tokens/s measured against the ideal N/N0 × tokens/s(N0); hollow
       points where ranks outnumber cores;
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
import statistics
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
    # Plain joins of escape()d parts, not Markup.format: a heat map of 256 nodes has 65,000 cells.
    attributes = "".join(f' {"class" if k == "class_" else k.replace("_", "-")}="'
                         f'{escape(f"{v:.1f}" if isinstance(v, float) else v)}"'
                         for k, v in attrs.items() if v is not None)
    if not children:
        return Markup(f"<{tag}{attributes}/>")
    return Markup(f"<{tag}{attributes}>{''.join(escape(c) for c in children)}</{tag}>")


def _svg(width: int, height: float, body: list[Markup], label: str, cls: str = "chart") -> Markup:
    return _el("svg", *body, class_=cls, role="img", aria_label=label, width=width, height=round(height),
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


# --- figure: scaling against world size --------------------------------------------------------

class _LinearAxes:
    """Maps data to pixels: linear x over the data's range (a little margin either side), linear y
    from 0 to `y_top`."""

    def __init__(self, x_lo: float, x_hi: float, y_top: float, box: tuple[int, int, int, int], pad: bool = True,
                 round_top: bool = False):
        if x_hi <= x_lo:
            x_lo, x_hi = x_lo - 1, x_hi + 1
        margin = (x_hi - x_lo) * 0.04 if pad else 0
        self.x_lo, self.x_hi = x_lo - margin, x_hi + margin
        y_top = y_top if y_top > 0 else 1.0
        self.y_step = _nice_step(y_top)
        self.y_top = self.y_step * math.ceil(y_top / self.y_step - 1e-9) if round_top else y_top
        self.left, self.top, self.width, self.height = box

    def px(self, x: float, y: float) -> tuple[float, float]:
        fx = (x - self.x_lo) / (self.x_hi - self.x_lo)
        return self.left + fx * self.width, self.top + self.height * (1 - y / self.y_top)


def _count_label(v: float) -> str:
    """A tick of a count: 500, 20k, 1.5M."""
    for unit, mult in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= mult:
            return f"{v / mult:.3g}{unit}"
    return f"{v:g}"


def _linear_axes_svg(ax: _LinearAxes, x_ticks: list[float], title: str, x_label: str, y_label: str,
                     y_fmt: Callable[[float], str]) -> list[Markup]:
    """Frame, grid, labels; an x label is left out where it would touch the one before (the last
    one is always labelled)."""
    left, top, width, height = ax.left, ax.top, ax.width, ax.height
    bottom = top + height
    out = [_el("text", title, class_="chart-title", x=left, y=top - 8),
           _el("rect", x=left, y=top, width=width, height=height, fill="#fff", stroke="#999")]
    xs = [ax.px(t, 0)[0] for t in x_ticks]
    labelled: list[int] = []
    for i in reversed(range(len(xs))):
        if not labelled or xs[labelled[-1]] - xs[i] >= 22:
            labelled.append(i)
    for i, (t, x) in enumerate(zip(x_ticks, xs)):
        out.append(_el("line", x1=x, y1=top, x2=x, y2=bottom, stroke="#eee"))
        if i in labelled:
            out.append(_el("text", f"{t:g}", x=x, y=bottom + 14, text_anchor="middle"))
    for i in range(math.floor(ax.y_top / ax.y_step + 1e-9) + 1):
        _, y = ax.px(ax.x_lo, i * ax.y_step)
        out.append(_el("line", x1=left, y1=y, x2=left + width, y2=y, stroke="#eee"))
        out.append(_el("text", y_fmt(i * ax.y_step), x=left - 6, y=y + 4, text_anchor="end"))
    if x_label:
        out.append(_el("text", x_label, x=left + width / 2, y=bottom + 32, text_anchor="middle"))
    out.append(_el("text", y_label, transform=f"translate({left - 46} {top + height / 2}) rotate(-90)",
                   text_anchor="middle"))
    return out


def _line(ax: _LinearAxes, points: list[tuple[float, float]], name: str, colour: str, dash: str | None = None,
          width: float = 2, tooltip: str = "") -> list[Markup]:
    """One series as a polyline, `data-series` naming it (nothing for no points)."""
    if not points:
        return []
    coords = " ".join("{:.1f},{:.1f}".format(*ax.px(x, y)) for x, y in points)
    children = [_el("title", tooltip)] if tooltip else []
    return [_el("polyline", *children, class_="series", data_series=name, points=coords, fill="none", stroke=colour,
                stroke_width=width, stroke_dasharray=dash)]


def _scaling_rows(rows: list[dict[str, Any]]) -> list[tuple[float, dict[str, Any]]]:
    """(world_size, row) for the rows with a positive world size, in order of world size."""
    out = [(w, r) for w, r in ((_num(r.get("world_size")), r) for r in rows) if w is not None and w > 0]
    return sorted(out, key=lambda wr: (wr[0], _num(wr[1].get("nodes")) or 0))


def _scaling_tooltip(world: float, r: dict[str, Any]) -> str:
    """The row's figures, those it has, in one line."""
    nodes, per_node = _num(r.get("nodes")), _num(r.get("ranks_per_node"))
    parts = [f"world {world:g}" + (f" ({nodes:g} nodes × {per_node:g} ranks)" if nodes and per_node else "")]
    for key, fmt in (("tokens_per_s", "{:,.0f} tokens/s"), ("efficiency", "efficiency {:.2f}"),
                     ("planned_efficiency", "planned {:.2f}"), ("busbw_gbps", "busbw {:.2f} GB/s")):
        value = _num(r.get(key))
        if value is not None:
            parts.append(fmt.format(value))
    if r.get("gap"):
        parts.append(f"gap: {r.get('gap')}")
    if r.get("oversubscribed") is True:
        parts.append("oversubscribed (ranks outnumber cores)")
    return ", ".join(parts)


def _scaling_points(ax: _LinearAxes, points: list[tuple[float, float, dict[str, Any]]], name: str,
                    colour: str, radius: float) -> list[Markup]:
    """A marker per row with the row's figures as its tooltip; hollow where the row is oversubscribed."""
    out = []
    for x, y, r in points:
        cx, cy = ax.px(x, y)
        hollow = r.get("oversubscribed") is True
        out.append(_el("circle", _el("title", _scaling_tooltip(x, r)), class_="point", data_series=name,
                       cx=cx, cy=cy, r=radius, fill="#fff" if hollow else colour, stroke=colour,
                       stroke_width=1.5))
    return out


_SCALING_LEGEND = (("measured", PALETTE[0], None), ("planned (the planner's evaluate)", PREDICTION_COLOUR, "6 4"),
                   ("ideal (efficiency 1; tokens/s N/N₀ × those at the smallest world N₀)", "#555", "2 3"))


def _scaling_svg(rows: list[tuple[float, dict[str, Any]]]) -> Markup:
    """Two panels side by side: efficiency (measured, planned, ideal 1.0) and tokens/s (measured, ideal)."""
    worlds = sorted({w for w, _ in rows})
    measured = [(w, v, r) for w, r in rows if (v := _num(r.get("efficiency"))) is not None]
    planned = [(w, v, r) for w, r in rows if (v := _num(r.get("planned_efficiency"))) is not None]
    tokens = [(w, v, r) for w, r in rows if (v := _num(r.get("tokens_per_s"))) is not None and v >= 0]
    y_top = max([1.1] + [v for _, v, _ in measured + planned])
    eff = _LinearAxes(worlds[0], worlds[-1], y_top, (70, 34, 400, 250))
    body = _linear_axes_svg(eff, worlds, "efficiency", "world size (ranks)", "efficiency", lambda v: f"{v:.1f}")
    body += _line(eff, [(eff.x_lo, 1.0), (eff.x_hi, 1.0)], "ideal", "#555", "2 3", 1, "ideal: efficiency 1")
    body += _line(eff, [(w, v) for w, v, _ in planned], "planned", PREDICTION_COLOUR, "6 4")
    body += _scaling_points(eff, planned, "planned", PREDICTION_COLOUR, 2.5)
    body += _line(eff, [(w, v) for w, v, _ in measured], "measured", PALETTE[0])
    body += _scaling_points(eff, measured, "measured", PALETTE[0], 4)
    if tokens:
        n0, tps0 = tokens[0][0], tokens[0][1]
        ideal = [(w, w / n0 * tps0) for w in worlds if w >= n0]
        tps_top = max(v for _, v in ideal + [(w, v) for w, v, _ in tokens])
        ax = _LinearAxes(worlds[0], worlds[-1], tps_top, (590, 34, 400, 250), round_top=True)
        body += _linear_axes_svg(ax, worlds, "tokens per second", "world size (ranks)", "tokens/s", _count_label)
        body += _line(ax, ideal, "ideal", "#555", "2 3", 1,
                      "ideal: " + ", ".join(f"{w:g} ranks {v:,.0f} tokens/s" for w, v in ideal))
        body += _line(ax, [(w, v) for w, v, _ in tokens], "measured", PALETTE[0])
        body += _scaling_points(ax, tokens, "measured", PALETTE[0], 4)
    for i, entry in enumerate(_SCALING_LEGEND):
        body += _legend([entry], 70 + (0, 190, 470)[i], 336)
    return _svg(1010, 348, body, "scaling efficiency and tokens per second against world size")


def _scaling_figure(tables: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    # `distval scale`'s table; the planner's own is also named `scaling` (weak scaling predicted, with comm_share)
    if "scaling" not in tables or "comm_share" in (tables["scaling"].get("columns") or []):
        return None
    rows = _scaling_rows(_rows(tables["scaling"]))
    drawn = [r for _, r in rows if any(_num(r.get(k)) is not None
                                        for k in ("efficiency", "planned_efficiency", "tokens_per_s"))]
    return _figure(
        "fig-scaling", "Scaling: efficiency and throughput against world size",
        "Left: efficiency, throughput(N) / (N × throughput at one rank; the global batch fixed with --strong), "
        "measured (solid) and the "
        "planner's prediction for the same point (dashed), against the ideal 1 (dotted). Right: tokens per second "
        "over all ranks, measured, against the ideal N/N₀ × the tokens per second at the smallest world N₀. "
        "Hollow points: ranks outnumber cores (oversubscribed), where a lower efficiency is expected. A point's "
        "tooltip gives its row (busbw, and the gap's category where measured and planned differ by over 20%).",
        [_scaling_svg(rows)] if drawn else [],
        "No scaling row has a world size with an efficiency or tokens per second.")


# --- figure: bandwidth between pairs of nodes, as a heat map ------------------------------------

HEAT_STOPS = ("#d73027", "#fc8d59", "#fee090", "#e0f3f8", "#91bfdb", "#4575b4")  # low (red) to high (blue)
WEAK_SHARE = 0.7  # a node below this share of the median node's link or compute is outlined
MAX_GRID_NODES = 256  # above: a bar per node of its pair_share instead of the grid
MAX_TEXT_NODES = 16  # up to this many rows, each cell shows its value
MAX_RANK_GRIDS = 32  # ranks-within-a-node grids drawn, in node order
GRID_PX, MAX_CELL_PX, MIN_CELL_PX = 640, 40, 3


def _heat_colour(value: float, lo: float, hi: float) -> str:
    """`value` on the palette from `lo` (first stop) to `hi` (last stop), linearly."""
    f = min(1.0, max(0.0, (value - lo) / (hi - lo))) if hi > lo else 0.5
    pos = f * (len(HEAT_STOPS) - 1)
    i = min(int(pos), len(HEAT_STOPS) - 2)
    a, b = (tuple(int(s[k:k + 2], 16) for k in (1, 3, 5)) for s in HEAT_STOPS[i:i + 2])
    return "#" + "".join(f"{round(x + (y - x) * (pos - i)):02x}" for x, y in zip(a, b))


def _ink(fill: str) -> str:
    """The class that makes text readable on `fill`: " on-dark" (white text) or none."""
    r, g, b = (int(fill[k:k + 2], 16) for k in (1, 3, 5))
    return " on-dark" if 0.299 * r + 0.587 * g + 0.114 * b < 128 else ""


def _short_gbps(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _share_text(share: float) -> str:
    """0.26, 1.00; 2 significant digits under 0.1 (a dead link reads 0.004, not 0.00)."""
    return f"{share:.2f}" if abs(share) >= 0.1 or share == 0 else f"{share:.2g}"


def _scale(values: list[float]) -> tuple[float, float]:
    """The colour scale: lowest to highest, widened down to half the highest where they are
    closer, so that a few percent's spread does not paint the slower links red."""
    hi = max(values)
    return min(min(values), hi / 2), hi


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Grid:
    """A square grid of directed bandwidths: `keys` in order (node indices or ranks), their
    tooltip names and axis labels, cell (a, b) = (GB/s from a to b or None, round)."""

    def __init__(self, title: str, keys: list[int], names: dict[int, str], prefix: str):
        self.title, self.keys, self.names, self.prefix = title, keys, names, prefix
        self.cells: dict[tuple[int, int], tuple[float | None, Any]] = {}
        self.weak: set[int] = set()
        self.side: dict[int, tuple[str, str, float | None]] = {}  # key -> (text, tooltip, pair_share)

    def add(self, rows: list[dict[str, Any]], a_key: str, b_key: str) -> None:
        for r in rows:
            a, b = _index(r.get(a_key)), _index(r.get(b_key))
            if a is not None and b is not None and a != b:
                self.cells[(a, b)] = (_num(r.get("a_to_b_gbps")), r.get("round"))
                self.cells[(b, a)] = (_num(r.get("b_to_a_gbps")), r.get("round"))

    def values(self) -> list[float]:
        return [v for v, _ in self.cells.values() if v is not None]


def _named(kind: str, index: int, host: Any) -> str:
    return f"{kind} {index} ({host})" if host else f"{kind} {index}"


def _node_grid(pairs: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> _Grid:
    """The node-level pairs as a grid over every node either table names; with `pair_nodes`, each
    node's shares on the side and the weak nodes."""
    hosts: dict[int, Any] = {}
    for r in pairs:
        for side in ("a", "b"):
            if (i := _index(r.get(f"node_{side}"))) is not None:
                hosts[i] = hosts.get(i) or r.get(f"host_{side}")
    for r in nodes:
        if (i := _index(r.get("node"))) is not None:
            hosts[i] = r.get("host") or hosts.get(i)
    keys = sorted(hosts)
    grid = _Grid("between nodes", keys, {i: _named("node", i, hosts[i]) for i in keys}, "n")
    grid.add(pairs, "node_a", "node_b")
    for r in nodes:
        if (i := _index(r.get("node"))) is None:
            continue
        pair_share, compute_share = _num(r.get("pair_share")), _num(r.get("compute_share"))
        if any(s is not None and s < WEAK_SHARE for s in (pair_share, compute_share)):
            grid.weak.add(i)
        text = " · ".join(f"{_share_text(s)}x {what}" if s is not None else f"— {what}"
                          for s, what in ((pair_share, "link"), (compute_share, "compute")))
        grid.side[i] = (text, _node_tooltip(grid.names[i], r), pair_share)
    return grid


def _node_tooltip(name: str, r: dict[str, Any]) -> str:
    parts = [name]
    for key, fmt in (("ranks", "{:g} ranks"), ("pair_gbps", "pairs {:.3g} GB/s"), ("pair_share", "{:.2f}x the median"),
                     ("allreduce_busbw_gbps", "all_reduce within {:.3g} GB/s"),
                     ("compute_gflops", "compute {:.4g} GFLOP/s"), ("compute_share", "{:.2f}x the median")):
        if (v := _num(r.get(key))) is not None:
            parts.append(fmt.format(v))
    return ", ".join(parts)


def _rank_grids(pairs: list[dict[str, Any]]) -> list[_Grid]:
    """One grid per node of the pairs between its own ranks."""
    by_node: dict[int, list[dict[str, Any]]] = {}
    for r in pairs:
        if (node := _index(r.get("node_a"))) is not None:
            by_node.setdefault(node, []).append(r)
    grids = []
    for node in sorted(by_node):
        host = next((r.get("host_a") for r in by_node[node] if r.get("host_a")), None)
        ranks = sorted({i for r in by_node[node] for i in (_index(r.get("rank_a")), _index(r.get("rank_b")))
                        if i is not None})
        grid = _Grid(f"{_named('node', node, host)}: between its ranks", ranks,
                     {i: f"rank {i}" for i in ranks}, "r")
        grid.add(by_node[node], "rank_a", "rank_b")
        grids.append(grid)
    return grids


def _grid_cells(grid: _Grid, lo: float, hi: float, x0: float, y0: float, cell: float) -> list[Markup]:
    """The cells, row = sender, column = receiver; the value as text when the grid is small."""
    out, text, gap = [], len(grid.keys) <= MAX_TEXT_NODES, 1 if cell >= 8 else None
    for i, a in enumerate(grid.keys):
        for j, b in enumerate(grid.keys):
            x, y = x0 + j * cell, y0 + i * cell
            if a == b:
                out.append(_el("rect", class_="diag", x=x, y=y, width=cell, height=cell, fill="#e6e6e6",
                               stroke="#fff" if gap else None, stroke_width=gap))
                continue
            value, rnd = grid.cells.get((a, b), (None, None))
            tip = f"{grid.names[a]} -> {grid.names[b]}: " + (
                f"{_fmt_float(value)} GB/s" if value is not None else "not measured") + (
                f", round {rnd}" if rnd is not None else "")
            fill = _heat_colour(value, lo, hi) if value is not None else "#fafafa"
            out.append(_el("rect", _el("title", tip), class_="cell" if value is not None else "cell-missing",
                           x=x, y=y, width=cell, height=cell, fill=fill, stroke="#fff" if gap else None,
                           stroke_width=gap))
            if text and value is not None:
                # a class, not a fill attribute: the page's CSS for svg text would win over the attribute
                out.append(_el("text", _short_gbps(value), class_="cell-value" + _ink(fill), x=x + cell / 2,
                               y=y + cell / 2 + 4, text_anchor="middle", pointer_events="none"))
    return out


def _colour_bar(lo: float, hi: float, x0: float, y0: float, width: float = 240) -> list[Markup]:
    """The colour scale as 24 steps, the GB/s at both ends."""
    steps = 24
    out = [_el("rect", class_="colour-bar", x=x0 + width * k / steps, y=y0, width=width / steps + 0.5, height=10,
               fill=_heat_colour(lo + (hi - lo) * (k + 0.5) / steps, lo, hi)) for k in range(steps)]
    out.append(_el("text", f"{_short_gbps(lo)} GB/s", class_="scale-lo", x=x0, y=y0 + 24))
    out.append(_el("text", f"{_short_gbps(hi)} GB/s", class_="scale-hi", x=x0 + width, y=y0 + 24, text_anchor="end"))
    return out


def _grid_svg(grid: _Grid, lo: float, hi: float, tile: bool = False) -> Markup:
    """The grid with its labels (every few when rows are thin), weak nodes outlined, each node's
    shares on the right when known, the colour bar below. A cell shrinks with the number of rows,
    down to a floor."""
    n = len(grid.keys)
    cell = float(max(MIN_CELL_PX, min(MAX_CELL_PX if not tile else 32, GRID_PX / n)))
    size, left, top = cell * n, 46, 58
    body = [_el("text", grid.title, class_="chart-title", x=4, y=14),
            _el("text", "row sends, column receives (GB/s)", x=4, y=30)]
    every = max(1, math.ceil(14 / cell))
    for i, k in enumerate(grid.keys):
        if i % every:
            continue
        cls, mid = ("weak" if k in grid.weak else None), i * cell + cell / 2
        body.append(_el("text", _el("title", grid.names[k]), f"{grid.prefix}{k}", class_=cls, x=left - 4,
                        y=top + mid + 4, text_anchor="end"))
        if cell >= 28:
            body.append(_el("text", _el("title", grid.names[k]), f"{grid.prefix}{k}", class_=cls, x=left + mid,
                            y=top - 6, text_anchor="middle"))
        else:
            body.append(_el("text", _el("title", grid.names[k]), f"{grid.prefix}{k}", class_=cls,
                            transform=f"translate({left + mid + 4:.1f} {top - 4}) rotate(-90)"))
    body += _grid_cells(grid, lo, hi, left, top, cell)
    for k in grid.weak & set(grid.keys):
        at = grid.keys.index(k) * cell
        body += [_el("rect", class_="outline", data_node=k, x=x, y=y, width=w, height=h, fill="none", stroke="#111",
                     stroke_width=2, pointer_events="none")
                 for x, y, w, h in ((left, top + at, size, cell), (left + at, top, cell, size))]
    width = left + size + 16
    if grid.side:
        body += _side_column(grid, left + size + 10, top, cell)
        width += 190 if cell >= 12 else 100
    body += _colour_bar(lo, hi, left, top + size + 14, min(240, max(120.0, size)))
    return _svg(round(max(width, left + 260)), top + size + 46, body, f"pair bandwidth {grid.title}",
                "chart tile" if tile else "chart")


def _side_column(grid: _Grid, x0: float, top: float, cell: float) -> list[Markup]:
    """Each node's pair_share and compute_share as text; as a bar of pair_share when rows are too
    thin for text (1x = 40 px)."""
    out = [_el("text", "link · compute (× the median)" if cell >= 12 else "link share", x=x0, y=top - 6)]
    for i, k in enumerate(grid.keys):
        if k not in grid.side:
            continue
        text, tip, share = grid.side[k]
        cls, y = ("weak" if k in grid.weak else None), top + i * cell
        if cell >= 12:
            out.append(_el("text", _el("title", tip), text, class_=cls, data_node=k, x=x0, y=y + cell / 2 + 4))
        elif share is not None:
            out.append(_el("rect", _el("title", tip), class_="share", x=x0, y=y, width=40 * min(max(share, 0), 2),
                           height=max(1.0, cell - 1), fill=TICK_COLOUR if k in grid.weak else PREDICTION_COLOUR))
    return out


def _node_shares(grid: _Grid, rows: list[dict[str, Any]]) -> dict[int, tuple[float | None, str]]:
    """node -> (pair_share, tooltip): `pair_nodes`' when there is one, else as its contract
    computes it from the pairs (median of the node's bandwidths, both directions, over the median
    of every node's)."""
    if grid.side:
        return {k: (share, tip) for k, (_, tip, share) in grid.side.items()}
    per_node: dict[int, list[float]] = {}
    for r in rows:
        for a, b in (("node_a", "node_b"), ("node_b", "node_a")):
            values = [v for v in (_num(r.get("a_to_b_gbps")), _num(r.get("b_to_a_gbps"))) if v is not None]
            if (i := _index(r.get(a))) is not None and _index(r.get(b)) is not None:
                per_node.setdefault(i, []).extend(values)
    medians = {i: statistics.median(v) for i, v in per_node.items() if v}
    overall = statistics.median(medians.values()) if medians else 0
    return {i: (m / overall if overall > 0 else None, f"{grid.names.get(i, i)}: pairs {m:.3g} GB/s")
            for i, m in medians.items()}


def _share_bars_svg(grid: _Grid, rows: list[dict[str, Any]]) -> Markup | None:
    """A bar per node of its pair_share, red below WEAK_SHARE (the dashed line), for clusters too
    large for the grid."""
    shares = sorted((k, s, tip) for k, (s, tip) in _node_shares(grid, rows).items() if s is not None)
    if not shares:
        return None
    bar_w = max(1.0, 900 / len(shares))
    ax = _LinearAxes(0, len(shares), max([1.5] + [s for _, s, _ in shares]), (56, 28, round(bar_w * len(shares)), 200),
                     pad=False)
    body = _linear_axes_svg(ax, [], "pair_share per node (× the median node)", "", "pair_share", lambda v: f"{v:g}")
    for i, (k, share, tip) in enumerate(shares):
        x, y = ax.px(i, share)
        weak = k in grid.weak or share < WEAK_SHARE
        body.append(_el("rect", _el("title", f"{tip} ({share:.2f}x the median)"), class_="share", x=x + 0.1 * bar_w,
                        y=y, width=0.8 * bar_w if bar_w >= 3 else bar_w, height=ax.top + ax.height - y,
                        fill=TICK_COLOUR if weak else PALETTE[0]))
    every = math.ceil(40 / bar_w)
    body += [_el("text", f"n{k}", x=ax.px(i + 0.5, 0)[0], y=ax.top + ax.height + 14, text_anchor="middle")
             for i, (k, _, _) in enumerate(shares) if i % every == 0]
    _, y = ax.px(0, WEAK_SHARE)
    body.append(_el("line", x1=ax.left, x2=ax.left + ax.width, y1=y, y2=y, stroke=TICK_COLOUR, stroke_dasharray="6 4"))
    return _svg(round(ax.left + ax.width + 20), ax.top + ax.height + 24, body, "pair_share per node")


def _pairs_figure(tables: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    if "pairs" not in tables:
        return None
    rows = _rows(tables["pairs"])
    node_rows = [r for r in rows if (r.get("level") or "node") == "node"]
    grid = _node_grid(node_rows, _rows(tables.get("pair_nodes")))
    charts, notes = [], []
    if len(grid.keys) > MAX_GRID_NODES:
        bars = _share_bars_svg(grid, node_rows)
        charts += [bars] if bars else []
        notes.append(f"{len(grid.keys)} nodes, more than {MAX_GRID_NODES}: instead of the grid, each node's "
                     f"pair_share as a bar, red below {WEAK_SHARE} (the dashed line); every pair is in the table.")
    elif grid.values():
        charts.append(_grid_svg(grid, *_scale(grid.values())))
    rank_grids = [g for g in _rank_grids([r for r in rows if r.get("level") == "rank"]) if g.values()]
    if rank_grids:
        scale = _scale([v for g in rank_grids for v in g.values()])
        charts += [_grid_svg(g, *scale, tile=True) for g in rank_grids[:MAX_RANK_GRIDS]]
        notes.append("Then one grid per node of its ranks, on a colour scale of their own."
                     + (f" The first {MAX_RANK_GRIDS} of {len(rank_grids)} nodes are drawn."
                        if len(rank_grids) > MAX_RANK_GRIDS else ""))
    return _figure(
        "fig-pairs", "Bandwidth between pairs of nodes",
        "Each direction's bandwidth between the first ranks of two nodes, measured pair by pair in round-robin "
        "rounds (row: the sender, column: the receiver; the tooltip gives the hosts and the round), coloured from "
        "the lowest (red) to the highest (blue) value (at least a factor 2 apart), the bar below giving both in "
        "GB/s; the diagonal is grey. "
        f"With pair_nodes: on the right each node's link (pair_share) and compute (compute_share) as multiples of "
        f"the median node, and a node below {WEAK_SHARE}x in either is outlined. " + " ".join(notes),
        charts, "No pair has a measured bandwidth.")


# --- figures, in page order --------------------------------------------------------------------

def _figure(fig_id: str, title: str, caption: str, charts: list[Markup], empty: str = "") -> dict[str, Any]:
    return {"id": fig_id, "title": title, "caption": caption, "charts": charts, "empty": empty}


def _figures(tables: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    builders = (_busbw_figure, _pairs_figure, _scaling_figure, _step_time_figure, _strategies_figure,
                _breakdown_figure, _late_arrivals_figure, _memory_figure, _loss_figure)
    return [f for f in (build(tables) for build in builders) if f]
