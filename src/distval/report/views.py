"""Terminal views of tables, by table name: the same table reads the same in every command and in
the ladder. A view takes the table and the report's meta and returns something rich can print;
a table without a view is printed as a plain grid (grid.render_table). The JSON and HTML
reports always keep every row and column; views only choose what the terminal shows."""

from __future__ import annotations

from typing import Any, Callable

from rich.table import Table as RichTable
from rich.text import Text

from distval.meta import stack_text
from distval.report.grid import render_table
from distval.results import Table
from distval.trace.views import VIEWS as TRACE_VIEWS
from distval.units import format_bytes, format_seconds

MAX_STEP_ROWS = 30  # a longer training run shows its steps in the JSON report, not the terminal


def nccl_text(bench: Table, meta: dict[str, Any]) -> str:
    """The sweep as nccl-tests (and rccl-tests) print it: out-of-place then in-place columns, one
    row per size. Everything comes from the table (its title says how it was timed) and the
    report's meta (world_size, copy_ceiling_gbps; on the nccl backend the library and runtime:
    "NCCL 2.21.5, CUDA 12.4" or "RCCL 2.20.5, ROCm 6.2")."""
    versions = meta.get("versions") or {}
    library = f", {stack_text(versions)}" if meta.get("backend") == "nccl" and versions.get("nccl") else ""
    lines = [f"# distval comm bench: {meta.get('world_size', '?')} ranks{library}, {bench.title}"]
    if meta.get("copy_ceiling_gbps"):
        lines.append(f"# host memory-copy ceiling (concurrent on every rank): {meta['copy_ceiling_gbps']:.2f} GB/s")
    head = f"#{'size':>11} {'count':>12} {'type':>9} {'redop':>6} {'root':>5}   " + "  ".join(
        [f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"] * 2)
    units = f"#{'(B)':>11} {'(elements)':>12} {'':>9} {'':>6} {'':>5}   " + "  ".join(
        [f"{'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"] * 2)
    for op in dict.fromkeys(r["op"] for r in bench.rows):
        rows = [r for r in bench.rows if r["op"] == op]
        redop = rows[0]["redop"]
        lines += ["#", f"# {op}{' ' + redop if redop not in (None, 'sum') else ''}",
                  "#" + " " * 50 + f"{'out-of-place':^32}  {'in-place':^32}", head, units]
        by_size: dict[int, dict[bool, dict]] = {}
        for r in rows:
            by_size.setdefault(r["bytes"], {})[r["inplace"]] = r
        for size, forms in sorted(by_size.items()):
            first = next(iter(forms.values()))
            cells = []
            for inplace in (False, True):
                r = forms.get(inplace)
                cells.append(f"{r['time_us_p50']:>9.1f} {r['algbw_gbps']:>7.2f} {r['busbw_gbps']:>7.2f} {r['wrong']:>6}"
                             if r else f"{'n/a':>9} {'n/a':>7} {'n/a':>7} {'n/a':>6}")
            root = first["root"] if first["root"] is not None else -1
            lines.append(f"{size:>12} {first['count']:>12} {first['dtype']:>9} {first['redop'] or 'none':>6} "
                         f"{root:>5}   " + "  ".join(cells))
    total_wrong = sum(r["wrong"] for r in bench.rows)
    lines.append(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
    return "\n".join(lines)


def strategies_view(table: Table, meta: dict[str, Any]) -> RichTable:
    """compare's strategies in 130-odd columns (the JSON keeps every column), times and bytes in
    human units; a measured figure is followed by the plan's in parentheses."""
    t = RichTable(title=table.title, header_style="bold")
    predicted = any(r["predicted_step_time_s"] is not None for r in table.rows)
    for col in ("strategy", "parity", "loss", "step", *(["plan"] if predicted else []), "tokens/s", "peak mem",
                "state (plan)", "calls", "comm/step (exp.)", "wire/step", "hidden"):
        t.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=col == "strategy")
    for r in table.rows:
        t.add_row(
            r["strategy"],
            "bitwise" if r["bitwise_equal"] else f"{r['max_rel_param_diff']:.1e}",
            f"{r['final_loss']:.3f}",
            format_seconds(r["step_time_p50_s"]),
            *([format_seconds(r["predicted_step_time_s"])] if predicted else []),
            _num(r["tokens_per_s"], ",.0f"),
            format_bytes(r["peak_mem_bytes"]),
            with_plan(r["model_state_bytes"], r["predicted_model_state_bytes"], format_bytes),
            _num(r["comm_calls_per_step"], "g"),
            with_plan(r["comm_bytes_per_step"], r["expected_comm_bytes_per_step"], format_bytes),
            format_bytes(r["comm_wire_bytes_per_step"]),
            _num(r["comm_hidden_frac"], ".0%"),
        )
    return t


def with_plan(measured: float | None, planned: float | None, human: Callable[[float | None], str]) -> str:
    """'1.75 (1.75) MiB' when both read in one unit, else '1023 KiB (1.00 MiB)'."""
    a, b = human(measured), human(planned)
    (num_a, _, unit_a), (num_b, _, unit_b) = a.rpartition(" "), b.rpartition(" ")
    return f"{num_a} ({num_b}) {unit_a}" if num_a and unit_a == unit_b else f"{a} ({b})"


def _num(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def steps_view(table: Table, meta: dict[str, Any]) -> Any:
    """A short run's steps in full; a long run's first and last step, the rest in the JSON."""
    if len(table.rows) <= MAX_STEP_ROWS:
        return render_table(table)
    first, last = table.rows[0], table.rows[-1]
    return Text(f"{table.name}: {len(table.rows)} steps, loss {first['loss']:.4g} (step {first['step']}) -> "
                f"{last['loss']:.4g} (step {last['step']}); every step is in the JSON report (--json)")


def scaling_view(table: Table, meta: dict[str, Any]) -> Any:
    """scale's table in 100-odd columns: * marks a point whose ranks outnumber its cores (the
    planner's own table of that name, without a planned efficiency, prints as it is)."""
    if "planned_efficiency" not in table.columns:
        return render_table(table)
    t = RichTable(title=table.title, header_style="bold")
    for col in ("ranks", "nodes", "tokens/s", "step", "plan", "efficiency", "planned", "busbw GB/s", "gap"):
        t.add_column(col, justify="left" if col == "gap" else "right")
    for r in table.rows:
        t.add_row(f"{r['world_size']}{'*' if r['oversubscribed'] else ''}", str(r["nodes"]),
                  _num(r["tokens_per_s"], ",.0f"), format_seconds(r["step_time_s"]),
                  format_seconds(r["planned_step_time_s"]), _num(r["efficiency"], ".2f"),
                  _num(r["planned_efficiency"], ".2f"), _num(r["busbw_gbps"], ".3g"), r["gap"] or "")
    if any(r["oversubscribed"] for r in table.rows):
        t.caption = "* ranks outnumber the cores of their machine"
    return t


def in_json_view(table: Table, meta: dict[str, Any]) -> Text:
    """A table the terminal names and the JSON report holds (inputs of other figures)."""
    return Text(f"{table.name}: {len(table.rows)} rows ({table.title}) in the JSON report (--json)")


VIEWS: dict[str, Callable[[Table, dict[str, Any]], Any]] = {
    "bench": nccl_text,
    "strategies": strategies_view,
    "steps": steps_view,
    "scaling": scaling_view,
    "scale_points": in_json_view,
    **TRACE_VIEWS,
}
