"""The plan as a Report (schema distval.report/1, command "plan"): the tables of docs/plan.md "Report keys",
plus `rightsizing` and `assumptions` (which inputs were given, preset, measured or
calibrated), and one check per verdict. JSON keeps bytes and seconds; `readable()` makes the
terminal copy (chosen columns; traffic in GB/MB, memory in GiB/MiB as devices are sold).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from distval.plan import levers, memory
from distval.plan.config import PlanConfig
from distval.plan.model import StepResult, evaluate, resolve
from distval.plan.network import PLAN_OPS
from distval.plan.schedule import COMM
from distval.results import Check, Report, Status, Table

COLLECTIVE_COLUMNS = [
    "name",
    "op",
    "count",
    "bytes_per_rank",
    "sent_bytes_per_rank",
    "algorithm",
    "time_each_s",
    "time_s",
    "source",
]
STEP_COLUMNS = ["comm_time_s", "compute_time_s", "overhead_time_s", "optimizer_time_s", "interference_time_s",
                "step_time_no_overlap_s",
                "step_time_overlap_s", "comm_compute_ratio", "step_time_s", "comm_share", "tokens_per_step",
                "tokens_per_s", "mfu"]
MEMORY_COLUMNS = [
    "strategy",
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "model_state_bytes",
    "activations_bytes",
    "activations_no_ckpt_bytes",
    "activations_ckpt_bytes",
    "buffers_bytes",
    "total_bytes",
    "device_bytes",
    "fits",
    "chosen",
]
SCALING_COLUMNS = ["world_size", "num_nodes", "global_batch", "throughput", "efficiency", "comm_share", "step_time_s"]
LEVER_COLUMNS = ["rank", "lever", "setting", "step_time_s", "tokens_per_s", "comm_share", "speedup", "note"]
RIGHTSIZING_COLUMNS = ["strategy", "device", "total_bytes", "device_bytes", "step_time_s", "tokens_per_s"]
SWEEP_COLUMNS = ["comm_time_s", "compute_time_s", "step_time_s", "comm_compute_ratio", "comm_share", "tokens_per_s",
                 "total_bytes", "fits"]
_UNITS = {"throughput": "tokens/s", "tokens_per_s": "tokens/s", "bytes_per_rank": "B (S of one call)"}


def _table(name: str, columns: list[str], rows: list[dict], title: str) -> Table:
    units = {c: "s" for c in columns if c.endswith("_s")}
    units.update({c: "B" for c in columns if _is_bytes(c)})
    units.update({c: u for c, u in _UNITS.items() if c in columns})
    table = Table(name, columns, title=title, units=units)
    for row in rows:
        table.add(**{c: row.get(c) for c in columns})
    return table


def collectives_rows(result: StepResult) -> list[dict]:
    """The comm tasks of a step grouped by (name, op, size): count over all phases."""
    groups: dict[tuple, dict] = {}
    for phase in result.phases:
        for task in phase.tasks:
            if task.stream != COMM:
                continue
            row = groups.setdefault(
                (task.label, task.op, task.size_bytes),
                {
                    "name": task.label,
                    "op": task.op,
                    "count": 0,
                    "bytes_per_rank": task.size_bytes,
                    "sent_bytes_per_rank": 0.0,
                    "algorithm": task.algorithm,
                    "time_each_s": task.duration_s,
                    "time_s": 0.0,
                    "source": task.source,
                },
            )
            row["count"] += phase.repeat
            row["sent_bytes_per_rank"] += phase.repeat * task.sent_bytes
            row["time_s"] = None if task.duration_s is None else row["time_s"] + phase.repeat * task.duration_s
    for row in groups.values():
        row["bytes_per_rank"] = int(round(row["bytes_per_rank"]))
    return list(groups.values())


def step_row(result: StepResult) -> dict:
    return {"comm_time_s": result.comm_time_s, "compute_time_s": result.compute_time_s,
            "overhead_time_s": result.overhead_time_s, "optimizer_time_s": result.optimizer_time_s,
            "interference_time_s": result.interference_time_s, "step_time_no_overlap_s": result.step_time_no_overlap_s,
            "step_time_overlap_s": result.step_time_overlap_s,
            "comm_compute_ratio": result.comm_compute_ratio, "step_time_s": result.step_time_s,
            "comm_share": result.comm_share, "tokens_per_step": result.tokens_per_step,
            "tokens_per_s": result.tokens_per_s, "mfu": result.mfu}


def assumption_rows(result: StepResult) -> list[dict]:
    """Every input the figures rest on, with where it came from."""
    inp, cfg, m = result.inputs, result.inputs.cfg, result.inputs.model
    defaults = {f.name: f.default for f in dataclasses.fields(PlanConfig)}

    def given(name: str) -> str:
        return "given" if getattr(cfg, name) != defaults[name] else "assumed (default)"

    seq_source = "unknown" if m.seq_len is None else "given" if cfg.seq_len is not None or not cfg.model else "preset"
    rows = [
        ("model", m.name, "preset" if cfg.model else "given"),
        ("parameters", f"{m.num_params:,}", "given" if cfg.params is not None else "computed from the shape"),
        ("FLOP parameters N (6·N per token)", f"{m.flop_params:,}", "layers and head" if m.spec else "= parameters"),
        ("sequence length", m.seq_len, seq_source),
        (
            "batch",
            f"{inp.micro_batch} micro × {inp.world_size} ranks × {inp.grad_accum} accumulation = {inp.global_batch}",
            "given"
            if (cfg.micro_batch, cfg.global_batch, cfg.grad_accum) != (None, None, None)
            else "assumed (default micro-batch 1)",
        ),
        (
            "dtypes param/grad/optimizer",
            f"{cfg.param_dtype}/{cfg.grad_dtype}/{cfg.optim_dtype}; gradients reduced in {inp.comm_grad_bytes} B",
            "given",
        ),
        ("device peak", f"{inp.peak_flops / 1e12:.4g} TFLOP/s", inp.peak_source),
        ("MFU", inp.mfu, inp.mfu_source),
        ("device memory", f"{inp.memory_bytes / 2**30:.1f} GiB", inp.memory_source),
        ("link efficiency (presets, --bandwidth)", cfg.efficiency, given("efficiency")),
        (
            "strategy / overlap / activation checkpointing",
            f"{cfg.strategy} / {cfg.overlap} / {cfg.activation_checkpointing}",
            "given",
        ),
        ("attention kernel", cfg.attention, given("attention")),
    ]
    if inp.calibration is not None:
        rows.append(("calibration", inp.calibration.describe(), "measured (comm bench)"))
    cost = inp.cost
    measured = (f"{cost.overhead_per_unit_s * 1e3:.3g} ms per unit and micro-batch; optimizer "
                f"{cost.optimizer_s * 1e3:.3g} ms for {cost.num_params:,} parameters ({cost.strategy}, {cost.model})"
                if cost else None)
    rows.append(("strategy's own cost, optimizer step", measured or "not modelled (0)",
                 "measured (compare's step costs on one rank)" if cost else "no step costs in --calibration"))
    rows += _link_rows(inp)
    return [{"input": a, "value": b, "source": c} for a, b, c in rows]


_LINK_SOURCES = {"preset": "preset × efficiency (assumed)", "given": "given × efficiency",
                 "calibrated": "calibrated (comm bench fit)", "derived": "derived from another op's calibration"}


def _link_rows(inp) -> list[tuple]:
    net = inp.network
    if net.world_size == 1:
        return []
    if net.num_nodes == 1:
        scopes = [("intra", "intra-node link")]
    elif net.devices_per_node == 1:
        scopes = [("inter", "link")]
    else:
        scopes = [("intra", "intra-node link"), ("inter", "inter-node link (per rank)")]
    out = []
    for scope, label in scopes:
        for op in PLAN_OPS:
            link = net.link_for(scope, op)
            if link is None:
                out.append((f"{label}, {op}", "none given", "—"))
            else:
                out.append((f"{label}, {op}", f"{link.name}: α {link.alpha_s * 1e6:.3g} µs, "
                            f"B {link.bytes_per_s / 1e9:.4g} GB/s effective", _LINK_SOURCES[link.source]))
    return out


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def step_checks(result: StepResult, lever_rows: list[dict]) -> list[Check]:
    checks = []
    if result.comm_time_s is None:
        checks.append(Check("plan.comm", Status.SKIP, "no communication times: no link was given",
                            hint="give --link NAME, --bandwidth GB/s or --calibration bench.json"))
    if result.compute_time_s is None:
        checks.append(
            Check(
                "plan.compute",
                Status.SKIP,
                "no compute time: the sequence length is unknown",
                hint="give --seq (and --layers --hidden --heads --vocab for the attention term), or --model",
            )
        )
    ratio = result.comm_compute_ratio
    if ratio is None:
        return checks
    top = next((r for r in lever_rows if r["rank"] == 1), None)
    hint = f"best lever: {top['lever']} {top['setting']} (×{top['speedup']:.2f} tokens/s; {top['note']})" if top else ""
    text = (f"communication {result.comm_time_s:.3g} s vs compute {result.compute_time_s:.3g} s per step "
            f"(ratio {ratio:.3g}); step {result.step_time_s:.3g} s, between {result.step_time_overlap_s:.3g} s "
            f"(perfect overlap) and {result.step_time_no_overlap_s:.3g} s (none)")
    bound = ratio > 1
    checks.append(
        Check(
            "plan.step",
            Status.WARN if bound else Status.OK,
            ("communication-bound: " if bound else "compute-bound: ") + text,
            details={"comm_compute_ratio": ratio, "comm_share": result.comm_share},
            hint=hint if bound else "",
            where={"strategy": result.inputs.cfg.strategy, "world_size": result.inputs.world_size},
        )
    )
    return checks


def memory_check(result: StepResult, rows: list[dict], sizing: list[dict]) -> Check:
    cfg = result.inputs.cfg
    chosen = next(r for r in rows if r["chosen"])
    partial = "" if chosen["activations_bytes"] is not None else " (without activations: give the architecture)"
    text = (
        f"{cfg.strategy} needs {_gib(chosen['total_bytes'])} per rank{partial}; the device has "
        f"{_gib(chosen['device_bytes'])} ({result.inputs.memory_source}), {memory.USABLE_FRACTION:.0%} of it usable"
    )
    if chosen["fits"]:
        return Check(
            "plan.memory",
            Status.OK,
            text,
            details={"total_bytes": chosen["total_bytes"]},
            where={"strategy": cfg.strategy},
        )
    hints = []
    others = [r["strategy"] for r in rows if r["fits"]]
    if others:
        hints.append(f"on this device {', '.join(others)} fit")
    if not cfg.activation_checkpointing and chosen["activations_ckpt_bytes"] is not None:
        with_ckpt = chosen["total_bytes"] - chosen["activations_bytes"] + chosen["activations_ckpt_bytes"]
        hints.append(f"--activation-checkpointing brings {cfg.strategy} to {_gib(with_ckpt)}"
                     + ("" if memory.fits(with_ckpt, chosen["device_bytes"]) else " (still too much)"))
    best = levers.cheapest(sizing)
    hints.append(f"smallest device preset that fits: {best['device']} with {best['strategy']}" if best else
                 "no strategy fits any device preset: add ranks or lower the micro-batch")
    return Check("plan.memory", Status.WARN, "does not fit: " + text, details={"total_bytes": chosen["total_bytes"]},
                 hint="; ".join(hints), where={"strategy": cfg.strategy})


def sizing_check(sizing: list[dict]) -> Check:
    best = levers.cheapest(sizing)
    if best is None:
        return Check("plan.rightsize", Status.WARN, "no device preset holds one rank of this plan under any strategy",
                     hint="add ranks, use --activation-checkpointing or a smaller micro-batch")
    when = f", step {best['step_time_s']:.3g} s" if best["step_time_s"] is not None else ""
    return Check(
        "plan.rightsize",
        Status.OK,
        f"cheapest that fits: {best['device']} ({_gib(best['device_bytes'])}) with "
        f"{best['strategy']}{when} (least device memory as the price proxy)",
        details=dict(best),
    )


def build_report(cfg: PlanConfig) -> Report:
    """The whole plan: every table and verdict."""
    from distval import meta  # imports torch; the model itself does not need it

    result = evaluate(cfg, resolve(cfg))
    mem = memory.memory_rows(result.inputs)
    lever_rows = levers.lever_rows(cfg, result)
    sizing = levers.rightsizing_rows(cfg, mem)
    info = result.inputs.model
    report = Report("plan", meta=meta.collect(None, cfg, world_size=result.inputs.world_size,
                                              model={"name": info.name, "num_params": info.num_params,
                                                     "flop_params": info.flop_params, "seq_len": info.seq_len,
                                                     "spec": dataclasses.asdict(info.spec) if info.spec else None}))
    report.checks = step_checks(result, lever_rows) + [memory_check(result, mem, sizing), sizing_check(sizing)]
    if result.inputs.calibration is not None:
        report.checks.append(
            Check("plan.calibration", Status.OK, "link numbers measured: " + result.inputs.calibration.describe())
        )
    report.tables = [
        _table("collectives", COLLECTIVE_COLUMNS, collectives_rows(result), "collectives of one step (per rank)"),
        _table("step", STEP_COLUMNS, [step_row(result)], "one optimizer step"),
        _table("memory", MEMORY_COLUMNS, mem, "memory per rank by strategy"),
        _table("scaling", SCALING_COLUMNS, levers.scaling_rows(cfg), "weak scaling (per-rank batch fixed)"),
        _table("levers", LEVER_COLUMNS, lever_rows, f"levers, ranked (target comm share {cfg.comm_target:.0%})"),
        _table("rightsizing", RIGHTSIZING_COLUMNS, sizing, "smallest device preset that fits, per strategy"),
        _table("assumptions", ["input", "value", "source"], assumption_rows(result), "inputs and where they come from"),
    ]
    return report


def _is_bytes(column: str) -> bool:
    return "bytes" in column.split("_")


# The terminal view: per table, (column, header) pairs; byte columns get a unit (GB, MB, KB, B)
# chosen from the column's largest value.
_VIEWS = {
    "collectives": [
        ("name", "collective"),
        ("count", "count"),
        ("bytes_per_rank", "size each"),
        ("sent_bytes_per_rank", "sent, all"),
        ("time_s", "time, all"),
        ("algorithm", "algorithm"),
    ],
    "memory": [
        ("strategy", "strategy"),
        ("params_bytes", "params"),
        ("grads_bytes", "grads"),
        ("optimizer_bytes", "optimizer"),
        ("activations_no_ckpt_bytes", "activations"),
        ("activations_ckpt_bytes", "act. ckpt"),
        ("buffers_bytes", "buffers"),
        ("total_bytes", "total"),
        ("fits", "fits"),
    ],
    "scaling": [
        ("world_size", "ranks"),
        ("num_nodes", "nodes"),
        ("global_batch", "global batch"),
        ("throughput", "throughput"),
        ("efficiency", "efficiency"),
        ("comm_share", "comm share"),
        ("step_time_s", "step"),
    ],
    "levers": [
        ("rank", "#"),
        ("lever", "lever"),
        ("setting", "setting"),
        ("speedup", "speedup"),
        ("step_time_s", "step"),
        ("comm_share", "comm share"),
        ("note", "note"),
    ],
    "rightsizing": [
        ("strategy", "strategy"),
        ("device", "device"),
        ("total_bytes", "needs"),
        ("device_bytes", "has"),
        ("step_time_s", "step"),
        ("tokens_per_s", "throughput"),
    ],
}
_STEP_LABELS = {
    "comm_time_s": "communication",
    "compute_time_s": "compute",
    "overhead_time_s": "  of which the strategy's own cost",
    "optimizer_time_s": "  of which the optimizer step",
    "interference_time_s": "compute lost to overlapped communication",
    "step_time_no_overlap_s": "step, no overlap",
    "step_time_overlap_s": "step, perfect overlap",
    "step_time_s": "step, estimate",
    "comm_compute_ratio": "T_comm / T_compute",
    "comm_share": "comm share of the step",
    "tokens_per_step": "tokens per step",
    "tokens_per_s": "throughput",
    "mfu": "MFU",
}
_SWEEP_HEADERS = {"comm_time_s": "comm", "compute_time_s": "compute", "step_time_s": "step", "comm_share": "comm share",
                  "tokens_per_s": "throughput", "total_bytes": "memory", "fits": "fits"}
_SCALES = (("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("B", 1.0))
# memory in binary units, as devices are sold (an "80 GB" A100 has 80 GiB); traffic in decimal
_BINARY_SCALES = (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10), ("B", 1.0))
_BINARY_TABLES = ("memory", "rightsizing", "sweep")


def _unit(src: str, values: list, binary: bool = False) -> tuple[str, float]:
    if _is_bytes(src):
        top = max((abs(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)), default=0)
        scales = _BINARY_SCALES if binary else _SCALES
        return next(((u, d) for u, d in scales if top >= d), ("B", 1.0))
    if src in ("throughput", "tokens_per_s"):
        return "tokens/s", 1.0
    return ("s", 1.0) if src.endswith("_s") else ("", 1.0)


def _view(table: Table, columns: list[tuple[str, str]]) -> Table:
    units, divisors = {}, {}
    for src, dst in columns:
        units[dst], divisors[src] = _unit(src, [r.get(src) for r in table.rows], table.name in _BINARY_TABLES)
    rows = []
    for row in table.rows:
        out = {dst: (row.get(src) / divisors[src] if divisors[src] != 1 and row.get(src) is not None else row.get(src))
               for src, dst in columns}
        if table.name == "memory" and row.get("chosen"):
            out["strategy"] = f"{row['strategy']} *"
        rows.append(out)
    title = table.title + (" (* = --strategy)" if table.name == "memory" else "")
    return Table(table.name, [d for _, d in columns], rows, title, {k: v for k, v in units.items() if v})


def _step_view(table: Table) -> Table:
    row = table.rows[0]
    rows = [
        {"quantity": _STEP_LABELS[c], "value": row.get(c), "unit": _unit(c, [row.get(c)])[0]} for c in table.columns
    ]
    return Table(table.name, ["quantity", "value", "unit"], rows, table.title)


def readable(report: Report) -> Report:
    """The terminal copy: chosen columns, short headers, bytes in GB/MB/KB; JSON keeps them all."""
    tables = []
    for t in report.tables:
        if t.name == "step":
            tables.append(_step_view(t))
        elif t.name == "sweep":
            tables.append(_view(t, [(t.columns[0], t.columns[0])] + [(c, h) for c, h in _SWEEP_HEADERS.items()]))
        else:
            tables.append(_view(t, _VIEWS.get(t.name, [(c, c) for c in t.columns])))
    return Report(report.command, report.meta, report.checks, tables)


# -- --sweep NAME=v1,v2,... ----------------------------------------------------------------------

SWEEPABLE = {
    "model": "model",
    "params": "params",
    "layers": "num_layers",
    "hidden": "hidden_size",
    "heads": "num_heads",
    "kv-heads": "num_kv_heads",
    "seq": "seq_len",
    "vocab": "vocab_size",
    "micro-batch": "micro_batch",
    "global-batch": "global_batch",
    "grad-accum": "grad_accum",
    "param-dtype": "param_dtype",
    "grad-dtype": "grad_dtype",
    "optim-dtype": "optim_dtype",
    "world": "world_size",
    "nodes": "num_nodes",
    "devices-per-node": "devices_per_node",
    "nics-per-node": "nics_per_node",
    "link": "link",
    "intra-link": "intra_link",
    "inter-link": "inter_link",
    "bandwidth": "bandwidth_gbps",
    "latency": "latency_us",
    "efficiency": "efficiency",
    "device": "device",
    "peak-tflops": "peak_tflops",
    "device-memory": "device_memory_gb",
    "mfu": "mfu",
    "strategy": "strategy",
    "bucket-mb": "bucket_mb",
    "overlap": "overlap",
    "activation-checkpointing": "activation_checkpointing",
    "attention": "attention",
    "comm-hook": "comm_hook",
    "powersgd-rank": "powersgd_rank",
}
_BOOLS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


def parse_sweep(text: str) -> tuple[str, str, list[Any]]:
    """'world=2,4,8' -> ('world', 'world_size', [2, 4, 8]); ValueError naming what is wrong."""
    from distval.plan.config import parse_count

    name, sep, values = text.partition("=")
    name = name.strip().lstrip("-")
    if not sep or name not in SWEEPABLE:
        raise ValueError(f"--sweep {text!r}: use NAME=v1,v2,... with NAME one of {', '.join(SWEEPABLE)}")
    field = SWEEPABLE[name]
    kind = {f.name: str(f.type) for f in dataclasses.fields(PlanConfig)}[field]
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
        raise ValueError(f"--sweep {name}= has no values")
    out = []
    for item in items:
        try:
            if field == "params":
                out.append(parse_count(item, "--sweep params"))
            elif kind.startswith("bool"):
                out.append(_BOOLS[item.lower()])
            elif kind.startswith("int"):
                out.append(int(item))
            elif kind.startswith("float"):
                out.append(float(item))
            else:
                out.append(item)
        except (KeyError, ValueError):
            raise ValueError(f"--sweep {name}: {item!r} is not a valid {kind.split(' ')[0]} value") from None
    return name, field, out


def sweep_report(cfg: PlanConfig, text: str) -> Report:
    """One row per value of one input, everything else as given."""
    from distval import meta

    name, field, values = parse_sweep(text)
    configs = [dataclasses.replace(cfg, **{field: v}) for v in values]  # validates every value before any work
    table = Table("sweep", [name] + SWEEP_COLUMNS, title=f"plan per {name} ({cfg.strategy})",
                  units={c: ("s" if c.endswith("_s") else "B") for c in SWEEP_COLUMNS if c.endswith(("_s", "_bytes"))})
    table.units["tokens_per_s"] = "tokens/s"
    for value, changed in zip(values, configs):
        result = evaluate(changed)
        chosen = next(r for r in memory.memory_rows(result.inputs) if r["chosen"])
        table.add(**{name: value}, **{k: v for k, v in step_row(result).items() if k in SWEEP_COLUMNS},
                  total_bytes=chosen["total_bytes"], fits=chosen["fits"])
    return Report("plan", meta=meta.collect(None, cfg, world_size=cfg.world, sweep={"input": name, "values": values}),
                  tables=[table])
