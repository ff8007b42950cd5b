"""What-ifs on top of one plan: the scaling table, the levers ranked by effect, right-sizing.

Every figure here is the same cost model evaluated on a changed config (`dataclasses.replace`), so
a lever's step time is exactly what `distval plan` prints for that setting.

Scaling is weak scaling: the per-rank micro-batch and accumulation stay, the global batch grows
with the world. throughput = tokens per step ÷ step time; efficiency = throughput(W) ÷
(W · throughput(1)); comm share = the part of the step not hidden behind compute. A two-level
plan keeps its devices per node (fewer ranks than that: one partly filled node).

Levers (speedup = tokens/s with the lever ÷ tokens/s without):
  accumulation  per step, communication is A + K·B (A once per step: DDP, ZeRO-1, ZeRO-2's
                all-gather; B every micro-batch: ZeRO-2's reduce-scatter, ZeRO-3's everything)
                and compute K·P. Without overlap the comm share (A + K·B)/(A + K·(B + P)) falls
                under the target t for K ≥ A(1−t) / (t(B + P) − B), reachable only when
                t(B + P) > B. A and B come from evaluating K = 1 and K = 2. The global batch grows.
  bf16 compression  gradients reduced in 16 bits (DDP bf16_compress_hook; ZeRO/FSDP reduce dtype).
  PowerSGD      DDP hook at rank r (steps.powersgd_ratio); its compute and accuracy cost are not
                modelled.
  faster link   the bottleneck link (between nodes, or the one link) replaced by faster presets:
                the slowest that meets the target, and the next step up from today's.
  overlap       when planned without.
"""

from __future__ import annotations

import dataclasses
import math

from distval.plan import presets
from distval.plan.config import PlanConfig
from distval.plan.memory import fits
from distval.plan.model import StepResult, evaluate
from distval.plan.steps import powersgd_ratio

SCALING_WORLDS = tuple(2**i for i in range(11))  # 1 … 1024


def at_world(cfg: PlanConfig, world: int) -> PlanConfig | None:
    """The config at another world size with the per-rank batch kept; None if it cannot be
    laid out (a world not a multiple of the devices per node)."""
    micro, accum = cfg.batch()
    keep = {"micro_batch": micro, "grad_accum": accum, "global_batch": None}
    nodes, per_node, two_level = cfg.topology()
    if not two_level:
        return dataclasses.replace(cfg, world_size=world, **keep)
    if world <= per_node:
        return dataclasses.replace(cfg, world_size=None, num_nodes=1, devices_per_node=world, **keep)
    if world % per_node:
        return None
    return dataclasses.replace(cfg, world_size=None, num_nodes=world // per_node, **keep)


def scaling_rows(cfg: PlanConfig) -> list[dict]:
    base = evaluate(at_world(cfg, 1))
    if base.tokens_per_s is None:
        return []
    rows = []
    for world in sorted(set(SCALING_WORLDS) | {cfg.world}):
        changed = at_world(cfg, world)
        if changed is None:
            continue
        r = evaluate(changed)
        if r.tokens_per_s is None:
            return []
        nodes, _, _ = changed.topology()
        rows.append({"world_size": world, "num_nodes": nodes, "throughput": r.tokens_per_s,
                     "efficiency": r.tokens_per_s / (world * base.tokens_per_s), "comm_share": r.comm_share,
                     "step_time_s": r.step_time_s, "global_batch": r.inputs.global_batch})
    return rows


def _row(lever: str, setting: str, base: StepResult, result: StepResult | None, note: str) -> dict:
    if result is None or result.tokens_per_s is None:
        return {"lever": lever, "setting": setting, "step_time_s": None, "tokens_per_s": None, "comm_share": None,
                "speedup": None, "note": note}
    return {"lever": lever, "setting": setting, "step_time_s": result.step_time_s, "tokens_per_s": result.tokens_per_s,
            "comm_share": result.comm_share, "speedup": result.tokens_per_s / base.tokens_per_s, "note": note}


def accumulation_lever(cfg: PlanConfig, base: StepResult) -> dict:
    micro, accum = cfg.batch()
    one, two = (evaluate(dataclasses.replace(cfg, micro_batch=micro, grad_accum=k, global_batch=None)) for k in (1, 2))
    per_micro = two.comm_time_s - one.comm_time_s
    once, compute, t = one.comm_time_s - per_micro, one.compute_time_s, cfg.comm_target
    denom = t * (per_micro + compute) - per_micro
    if denom <= 0:
        return _row("accumulation", "—", base, None, f"cannot reach a {t:.0%} comm share: every micro-batch "
                    f"communicates {per_micro:.3g} s against {compute:.3g} s of compute ({cfg.strategy})")
    k = max(accum, math.ceil(once * (1 - t) / denom - 1e-9))
    if k == accum or (base.comm_share is not None and base.comm_share <= t):
        return _row("accumulation", f"K={accum}", base, base, f"K={accum} already keeps communication under {t:.0%}")
    result = evaluate(dataclasses.replace(cfg, micro_batch=micro, grad_accum=k, global_batch=None))
    note = (f"sync every {k} micro-batches: comm ≤ {t:.0%} of the step even without overlap; "
            f"global batch {base.inputs.global_batch} → {result.inputs.global_batch}")
    if k > 64:
        note += " (a batch that large changes the optimisation: check the critical batch size)"
    return _row("accumulation", f"K={k}", base, result, note)


def compression_lever(cfg: PlanConfig, base: StepResult) -> dict:
    if base.inputs.comm_grad_bytes == 2:
        return _row("bf16 compression", "bf16 grads", base, None, "gradients already travel in 16 bits")
    hook = "bf16_compress_hook (or fp16_)" if cfg.strategy == "ddp" else "reduce dtype bf16 (or fp16)"
    return _row("bf16 compression", "bf16 grads", base, evaluate(dataclasses.replace(cfg, comm_hook="bf16")),
                f"{hook}: half the gradient bytes")


def powersgd_lever(cfg: PlanConfig, base: StepResult) -> dict:
    setting = f"rank {cfg.powersgd_rank}"
    if cfg.strategy != "ddp" or base.inputs.model.spec is None or cfg.comm_hook == "powersgd":
        why = ("already on" if cfg.comm_hook == "powersgd" else "a DDP hook" if cfg.strategy != "ddp"
               else "needs the architecture (matrix shapes)")
        return _row("PowerSGD", setting, base, None, why)
    result = evaluate(dataclasses.replace(cfg, comm_hook="powersgd"))
    ratio = powersgd_ratio(result.inputs)
    return _row("PowerSGD", setting, base, result,
                f"sends {ratio:.1%} of the gradient elements; orthogonalisation compute and accuracy cost not modelled")


def overlap_lever(cfg: PlanConfig, base: StepResult) -> dict:
    if cfg.overlap:
        return _row("overlap", "on", base, None, "already planned with overlap")
    return _row("overlap", "on", base, evaluate(dataclasses.replace(cfg, overlap=True)),
                "launch each bucket's collective as soon as backward has produced it")


_NETWORK_KINDS = ("ethernet", "roce", "infiniband")
_INTRA_KINDS = ("pcie", "nvlink", "xgmi")


def _link_field(cfg: PlanConfig, base: StepResult) -> tuple[str, str]:
    """(config field holding the bottleneck link, its network scope)."""
    net = base.inputs.network
    _, _, two_level = cfg.topology()
    if two_level:
        return ("inter_link", "inter") if net.num_nodes > 1 else ("intra_link", "intra")
    if net.num_nodes == 1:
        return "intra_link", "intra"  # `--world N --intra-link X`: one box
    return "link", "inter"


def link_levers(cfg: PlanConfig, base: StepResult) -> list[dict]:
    field, scope = _link_field(cfg, base)
    current = base.inputs.network.link_for(scope, "all_reduce")
    if current is None or base.inputs.world_size == 1:
        return [_row("faster link", "—", base, None, "no link to replace")]
    kinds = _INTRA_KINDS if scope == "intra" else _NETWORK_KINDS
    preset = presets.LINKS.get(current.name.split(" (")[0])  # "xGMI (3 of 7 mesh links)" is the xGMI preset
    if preset is not None:  # a preset: stay within its family (NICs for NICs, fabrics for fabrics)
        kinds = _INTRA_KINDS if preset.kind in _INTRA_KINDS else _NETWORK_KINDS
    fabric = presets.device(cfg.device).fabric
    if scope == "intra" and fabric and presets.LINKS[fabric].kind in ("nvlink", "xgmi"):
        kinds = (presets.LINKS[fabric].kind,)  # an MI300X node gets no NVLink, an H100 node no xGMI
    peers = base.inputs.network.devices_per_node - 1 if scope == "intra" else None
    faster = sorted(
        (
            s
            for s in presets.LINKS.values()
            if s.kind in kinds and s.rate_gbps(peers) * 1e9 * cfg.efficiency > current.bytes_per_s * 1.001
        ),
        key=lambda s: s.rate_gbps(peers),
    )
    if not faster:
        return [_row("faster link", "—", base, None, f"{current.name} is already as fast as the fastest preset")]
    change = {field: None, "calibration": None}
    if field == "link":
        change.update(bandwidth_gbps=None, latency_us=None, intra_link=None, inter_link=None)
    results = [(s, evaluate(dataclasses.replace(cfg, **{**change, field: s.name}))) for s in faster]
    chosen = [results[0]]
    meets = next(((s, r) for s, r in results if r.comm_share is not None and r.comm_share <= cfg.comm_target), None)
    if meets is not None and meets[0] is not results[0][0]:
        chosen.append(meets)
    was = "the measured link" if cfg.calibration else current.name
    return [
        _row(
            "faster link",
            s.name,
            base,
            r,
            f"{s.rate_gbps(peers):g} GB/s line rate instead of {was}"
            + (f"; comm under {cfg.comm_target:.0%}" if meets and s is meets[0] else ""),
        )
        for s, r in chosen
    ]


def lever_rows(cfg: PlanConfig, base: StepResult) -> list[dict]:
    """Every lever, applicable ones ranked by speedup, then the ones that do not apply."""
    if base.tokens_per_s is None or base.inputs.world_size == 1:
        return []
    rows = [accumulation_lever(cfg, base), compression_lever(cfg, base), powersgd_lever(cfg, base),
            overlap_lever(cfg, base)] + link_levers(cfg, base)
    ranked = sorted((r for r in rows if r["speedup"] is not None), key=lambda r: -r["speedup"])
    rest = [r for r in rows if r["speedup"] is None]
    return [{"rank": i + 1, **r} for i, r in enumerate(ranked)] + [{"rank": None, **r} for r in rest]


def rightsizing_rows(cfg: PlanConfig, memory: list[dict]) -> list[dict]:
    """Per strategy, the device preset with the least memory that holds it (a proxy for the
    cheapest: prices vary, memory classes do not), and the step time there."""
    gpus = sorted(
        (d for d in presets.DEVICES.values() if d.memory_bytes), key=lambda d: (d.memory_bytes, d.peak_tflops)
    )
    rows = []
    for mem in memory:
        device = next((d for d in gpus if fits(mem["total_bytes"], d.memory_bytes)), None)
        result = None
        if device is not None:
            hook = cfg.comm_hook if cfg.comm_hook != "powersgd" or mem["strategy"] == "ddp" else "none"
            result = evaluate(dataclasses.replace(cfg, strategy=mem["strategy"], device=device.name, peak_tflops=None,
                                                  device_memory_gb=None, comm_hook=hook))
        rows.append({"strategy": mem["strategy"], "device": device.name if device else None,
                     "total_bytes": mem["total_bytes"], "device_bytes": device.memory_bytes if device else None,
                     "step_time_s": result.step_time_s if result else None,
                     "tokens_per_s": result.tokens_per_s if result else None})
    return rows


def cheapest(rows: list[dict]) -> dict | None:
    fitting = [r for r in rows if r["device"] is not None]
    return min(
        fitting,
        key=lambda r: (r["device_bytes"], r["step_time_s"] if r["step_time_s"] is not None else math.inf),
        default=None,
    )
