"""`trace analyze`'s tables in 80-odd columns of fixed-width text (the JSON and CSV keep every
column at full precision)."""

from __future__ import annotations

from typing import Any

from distval.results import Table
from distval.units import format_bytes

MAX_STEP_ROWS = 12


_SHORT = {"compute": "compute", "optimizer": "optim", "comm_overlapped": "overlap", "comm_exposed": "exposed",
          "waiting_for_peers": "waiting", "memcpy": "memcpy", "data": "data", "idle": "idle"}


def breakdown_text(table: Table, meta: dict[str, Any]) -> str:
    run = max((len(str(r.get("run", ""))) for r in table.rows), default=0)  # compare: the strategy first
    head = (f"{'run':<{run}} " if run else "") + f"{'rank':>4} {'steps':>5} {'step ms':>9} " + \
        " ".join(f"{v:>7}" for v in _SHORT.values()) + f" {'mfu':>6}"
    lines = [table.title, head]
    for r in table.rows:
        mfu = f"{r['mfu']:>6.1%}" if r.get("mfu") is not None else f"{'-':>6}"
        lines.append((f"{r['run']:<{run}} " if run else "") + f"{r['rank']:>4} {r['steps']:>5} {r['step_ms']:>9.2f} " +
                     " ".join(f"{r[c]:>6.1f}%" for c in _SHORT) + f" {mfu}")
    return "\n".join(lines)


def steps_text(table: Table, meta: dict[str, Any]) -> str:
    head = f"{'rank':>4} {'step':>6} {'step ms':>9} " + " ".join(f"{v:>7}" for v in _SHORT.values())
    lines = [table.title, head]
    for r in table.rows[:MAX_STEP_ROWS]:
        lines.append(f"{r['rank']:>4} {r['step']:>6} {r['step_ms']:>9.2f} " +
                     " ".join(f"{r[c]:>7.2f}" for c in _SHORT))
    if len(table.rows) > MAX_STEP_ROWS:
        lines.append(f"... {len(table.rows) - MAX_STEP_ROWS} more rows in the JSON/CSV")
    return "\n".join(lines)


def collectives_text(table: Table, meta: dict[str, Any]) -> str:
    lines = [table.title, f"{'op':<15} {'size':>10} {'calls':>7} {'time us':>10} {'transfer us':>12} {'wait':>6} "
                          f"{'algbw GB/s':>10} {'busbw GB/s':>10}"]
    for r in table.rows[:MAX_STEP_ROWS]:
        bw = [f"{r[c]:>10.3f}" if r[c] is not None else f"{'-':>10}" for c in ("algbw_GBps", "busbw_GBps")]
        size = format_bytes(r["bytes"]) if r["bytes"] else "-"  # a kernel without its message size (old NCCL, P2P)
        lines.append(f"{r['op']:<15} {size:>10} {r['calls']:>7g} {r['time_us']:>10.1f} "
                     f"{r['transfer_us']:>12.1f} {r['wait_share']:>6.0%} {bw[0]} {bw[1]}")
    if len(table.rows) > MAX_STEP_ROWS:
        lines.append(f"... {len(table.rows) - MAX_STEP_ROWS} more rows in the JSON/CSV")
    return "\n".join(lines)


def hta_text(table: Table, meta: dict[str, Any]) -> str:
    lines = [table.title, f"{'rank':>4} {'idle %':>8} {'compute %':>10} {'non-compute %':>14} {'kernel time us':>15}"]
    for r in table.rows:
        lines.append(f"{r['rank']:>4} {r['idle_time_pctg']:>8.2f} {r['compute_time_pctg']:>10.2f} "
                     f"{r['non_compute_time_pctg']:>14.2f} {r['kernel_time(us)']:>15,.0f}")
    return "\n".join(lines)


def overlap_text(table: Table, meta: dict[str, Any]) -> str:
    rows = [f"rank {r['rank']}: {r['comp_comm_overlap_pctg']}%" if r["comp_comm_overlap_pctg"] is not None
            else f"rank {r['rank']}: - (no communication kernel)" for r in table.rows]
    return f"{table.title}: " + ", ".join(rows)


def late_text(table: Table, meta: dict[str, Any]) -> str:
    lines = [table.title, f"{'rank':>4} {'arrived last':>12} {'share':>6} {'others waited ms':>17} {'of step':>8}"]
    for r in table.rows:
        of = f"{r['of_step_time']:>8.1%}" if r["of_step_time"] is not None else f"{'-':>8}"
        lines.append(f"{r['rank']:>4} {r['arrived_last']:>12} {r['share']:>6.0%} {r['others_waited_ms']:>17.2f} {of}")
    return "\n".join(lines)


def ops_text(table: Table, meta: dict[str, Any]) -> str:
    lines = [table.title + " (top 10)", f"{'ms/step':>9} {'calls/step':>10}  name"]
    for r in table.rows[:10]:
        lines.append(f"{r['ms_per_step']:>9.3f} {r['calls_per_step']:>10g}  {r['name'][:90]}")
    return "\n".join(lines)


def diff_text(table: Table, meta: dict[str, Any]) -> str:
    lines = [table.title, f"{'category':<18} {'A ms':>9} {'B ms':>9} {'B-A ms':>9} {'B/A':>6} {'p':>7}"]
    for r in table.rows:
        p = f"{r['p_value']:>7.3f}" if r["p_value"] is not None else f"{'-':>7}"
        ratio = f"{r['ratio']:>6.2f}" if r["ratio"] is not None else f"{'-':>6}"
        lines.append(f"{r['category']:<18} {r['a_ms']:>9.3f} {r['b_ms']:>9.3f} {r['delta_ms']:>+9.3f} {ratio} {p}"
                     + (" *" if r["significant"] else ""))
    return "\n".join(lines) + "\n(* p < 0.05)"


def diff_ops_text(table: Table, meta: dict[str, Any]) -> str:
    lines = [table.title + " (top 10)", f"{'A ms':>8} {'B ms':>8} {'B-A ms':>8}  name"]
    for r in table.rows[:10]:
        lines.append(f"{r['a_ms_per_step']:>8.3f} {r['b_ms_per_step']:>8.3f} {r['delta_ms']:>+8.3f}  {r['name'][:80]}")
    return "\n".join(lines)


VIEWS = {"trace_breakdown": breakdown_text, "trace_steps": steps_text, "trace_collectives": collectives_text,
         "hta_temporal": hta_text, "hta_overlap": overlap_text, "trace_late_arrivals": late_text,
         "trace_ops": ops_text, "diff_categories": diff_text, "diff_ops": diff_ops_text}
