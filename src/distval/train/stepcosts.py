"""The step costs the planner takes from a measurement (docs/plan.md "Step costs"): measured on
`distval compare`'s reference rank (`measure`), a strategy's work at world N on a real local group
(worldcost.py), AdamW per parameter, the share of a core a rank gets, and their rows in the
calibration file. compare.py runs the comparison and its checks; this is what it measures for
the plan, and what `distval scale` reuses."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from typing import Any

import torch

from distval import device as devices
from distval import strategies
from distval.plan import presets
from distval.plan.calibration import StepCost, save_costs
from distval.results import Check, Status, Table
from distval.train.config import TrainConfig
from distval.train.loop import train_rank
from distval.train.worldcost import WorldCost, world_cost

PROBE_STEPS, PROBE_WARMUP = 10, 3  # the fewest steps of a probe on the reference's rank; warm-up of each run
# each probed model's measured steps last about this long, in up to PROBE_ROUNDS runs taken in turn with
# the others': a host's speed moves by more than the band from one 0.1 s window to the next (docs/plan.md)
PROBE_SECONDS, PROBE_ROUNDS = 1.0, 3
PLAIN = "simple_ddp_ga"  # the plain model: at world 1 its per-tensor all_reduces are waits, left out of its compute


def measure(ctx: Any, cfg: TrainConfig, result: dict[str, Any]) -> None:
    """Into `result` (the reference's): the plain model and each strategy on the reference's rank
    with a rank's micro-batch and threads (world 1: a strategy's hooks and bookkeeping run, its
    collectives move nothing), for about PROBE_SECONDS each, in rounds taking them in turn so that
    the host's drift lands on all alike; what a strategy that skips work at world 1 adds at the
    strategies' world size (worldcost.py); AdamW's cost per parameter."""
    assert cfg.probe is not None
    if cfg.probe.threads:
        torch.set_num_threads(cfg.probe.threads)

    def probe(name: str, steps: int) -> dict[str, Any]:
        return train_rank(ctx, dataclasses.replace(cfg, strategy=name, steps=PROBE_WARMUP + steps, return_params=False,
                                                   micro_batch=cfg.probe.micro_batch, probe=None))

    pilot = probe(PLAIN, PROBE_STEPS - PROBE_WARMUP)
    result["probe_peak_flops"] = pilot["peak_flops"]  # what the plain MFU is a share of: a rank's threads
    rounds, steps = probe_rounds(phase_medians(pilot["steps"][PROBE_WARMUP:])["step_s"])
    measured: dict[str, list[dict[str, Any]]] = {PLAIN: pilot["steps"][PROBE_WARMUP:]}
    for _ in range(rounds):
        for name in (PLAIN, *cfg.probe.strategies):
            if name == PLAIN and rounds == 1 and steps == PROBE_STEPS - PROBE_WARMUP:
                continue  # the pilot was this round's plain run
            measured.setdefault(name, []).extend(probe(name, steps)["steps"][PROBE_WARMUP:])
    result["probes"] = {name: phase_medians(steps) for name, steps in measured.items()}
    result["world_cost"] = {}  # the work a strategy leaves out at world 1 (CPU ranks: worldcost.py)
    for name in cfg.probe.strategies:
        if strategies.REGISTRY[name].skips_work_at_world_1 and cfg.probe.world > 1 and ctx.device.type == "cpu":
            ctx.status(f"timing {name} on a local group of {cfg.probe.world}", busy=True)  # seconds, N processes
            cost = world_cost(name, cfg.model, cfg.probe.micro_batch, cfg.probe.world, cfg.probe.threads,
                              cfg.strategy_cfg.mixed_precision)
            result["world_cost"][name] = as_one_rank(cost, cfg.probe.world)
    sizes = result["param_sizes"]
    result["optimizer_per_param_s"] = adamw_per_param([sum(sizes)], ctx.device)  # ZeRO's flat shards
    result["optimizer_per_param_tensors_s"] = adamw_per_param(sizes, ctx.device)  # the model's tensors or their shards


def as_one_rank(cost: WorldCost | None, world: int) -> dict[str, float] | None:
    """What a strategy adds at `world`, timed with `world` local ranks on the cores, as one rank
    alone pays it: where their threads outnumber the cores, scaled by the share each got, which
    the prediction applies again (`at_rank_speed`)."""
    if cost is None:
        return None
    share = core_share(world)
    return {key: seconds * share for key, seconds in dataclasses.asdict(cost).items()}


def probe_rounds(step_s: float) -> tuple[int, int]:
    """(rounds, measured steps per run) for a probe whose step takes `step_s`: about PROBE_SECONDS
    of steps over up to PROBE_ROUNDS rounds, never fewer than PROBE_STEPS - PROBE_WARMUP a run (a
    `small` step on this host, 0.7 s: one round of 7)."""
    least = PROBE_STEPS - PROBE_WARMUP
    rounds = max(1, min(PROBE_ROUNDS, int(PROBE_SECONDS / (least * max(step_s, 1e-6)))))
    return rounds, max(least, math.ceil(PROBE_SECONDS / rounds / max(step_s, 1e-6)))


def adamw_per_param(sizes: list[int], device: torch.device) -> float:
    """AdamW's update time per parameter over tensors of these sizes, the part of the optimizer
    phase that sharding divides: the step over them less a step over as many one-element tensors
    (what each tensor costs whatever its size), per parameter."""
    return max(0.0, (adamw_step_s(sizes, device) - adamw_step_s([1] * len(sizes), device)) / sum(sizes))


def adamw_step_s(sizes: list[int], device: torch.device, reps: int = 5) -> float:
    """One AdamW step over fresh tensors of these sizes, as train/loop.py's optimizer_impl builds it
    (fused on CUDA, single-tensor on CPU): the best of `reps` after one warm-up."""
    params = [torch.zeros(n, device=device, requires_grad=True) for n in sizes]
    for param in params:
        param.grad = torch.ones_like(param)
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1,
                                  **({"fused": True} if device.type == "cuda" else {"foreach": False}))
    best = float("inf")
    for _ in range(reps + 1):
        began = time.perf_counter()
        optimizer.step()
        devices.synchronize(device)
        best = min(best, time.perf_counter() - began)
    return best


def forward_backward_s(step: dict[str, Any]) -> float:
    """A step record's forward+backward: its time less the optimizer phase and the waits on
    collectives (the harness's split)."""
    return step["step_time_s"] - step["optimizer_s"] - step["comm_blocked_s"]


def phase_medians(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Median step, optimizer phase, forward+backward, and the MFU of forward+backward."""
    def median(f):
        return statistics.median(f(s) for s in steps)
    return {"step_s": median(lambda s: s["step_time_s"]), "optimizer_s": median(lambda s: s["optimizer_s"]),
            "fb_s": median(forward_backward_s),
            "mfu_fb": median(lambda s: s["mfu"] * s["step_time_s"] / max(1e-9, forward_backward_s(s)))}


def step_costs(cfg: TrainConfig, reference: dict[str, Any]) -> list[StepCost]:
    """Each probed strategy's own costs against the plain model on the same rank: its
    forward+backward per micro-batch less the plain one's (its world-1 collectives included) and its
    optimizer phase, each with what it leaves out at world 1 added (`world_cost`), and the plain
    model's MFU on forward+backward."""
    probes = dict(reference["probes"])
    plain, units = probes.pop(PLAIN, None), presets.model(cfg.model).num_layers + 1
    if plain is None:
        return []

    def per_param(name: str) -> float:  # the rate of what its optimizer updates: flat shards or tensors
        flat = strategies.REGISTRY[name].optimizer_over_flat_shards
        return reference["optimizer_per_param_s" if flat else "optimizer_per_param_tensors_s"]

    def cost(name: str, probe: dict[str, float]) -> StepCost:
        at_world = reference.get("world_cost", {}).get(name) or {"fb_s": 0.0, "optimizer_s": 0.0}
        own = (probe["step_s"] - probe["optimizer_s"] - plain["fb_s"]) / cfg.grad_accum  # per micro-batch
        return StepCost(name, strategies.REGISTRY[name].plan_model, cfg.model, units, reference["num_params"],
                        own + at_world["fb_s"], probe["optimizer_s"] + at_world["optimizer_s"], per_param(name),
                        min(plain["mfu_fb"], 1.0), reference["probe_peak_flops"])

    return [cost(name, probe) for name, probe in probes.items()]


def save_step_costs(calibration: str, table: Table, world: int,
                    at_world: dict[str, dict[str, float] | None] | None = None, micro_batch: int = 0) -> Check:
    """The step costs into the calibration file, said in one line (WARN when it cannot be written, or
    when the work a strategy skips on one rank could not be timed on a local group of `world` with a
    rank's `micro_batch`: `at_world`, the reference's `world_cost`)."""
    at_world = at_world or {}

    def row(r: dict[str, Any]) -> str:
        extra = at_world.get(r["strategy"])
        of_it = ("", "") if extra is None else (f" ({extra['fb_s'] * 1e3:+.1f} of it at world {world})",
                                                f" ({extra['optimizer_s'] * 1e3:+.1f} at world {world})")
        return f"{r['strategy']} {r['overhead_s'] * 1e3:+.1f} ms/micro-batch{of_it[0]}, optimizer " \
               f"{r['optimizer_s'] * 1e3:.1f} ms{of_it[1]}"

    rows = ", ".join(row(r) for r in table.rows)
    try:
        save_costs(calibration, table.to_dict())
    except OSError as e:
        return Check("compare step costs", Status.WARN, f"measured on one rank ({rows}); not saved: {e}",
                     hint=f"make {calibration} writable so `distval plan --calibration` can reuse them")
    summary = f"measured on one rank with a rank's micro-batch and threads of {world} ranks: {rows}; saved in " \
              f"{calibration} for `distval plan --calibration`"
    if missed := [name for name, extra in at_world.items() if extra is None]:
        return Check("compare step costs", Status.WARN, f"{summary}; not measured: the work {', '.join(missed)} "
                     f"skips on one rank (its local group of {world} did not run), left out of the prediction",
                     hint=f"`python -m distval.train.worldcost --strategy {missed[0]} --model {table.rows[0]['model']} "
                          f"--micro-batch {micro_batch} --world {world}` shows why", details={"path": calibration})
    return Check("compare step costs", Status.OK, summary, details={"path": calibration})


def at_rank_speed(cost: StepCost, world: int, device_type: str = "cpu") -> StepCost:
    """The one-rank step costs as a rank of `world` local CPU ranks pays them: where their threads
    outnumber the cores, its forward+backward, own cost and optimizer slowed by its share of them."""
    share = core_share(world) if device_type == "cpu" else 1.0
    if share >= 1:
        return cost
    return dataclasses.replace(cost, overhead_s=cost.overhead_s / share, optimizer_s=cost.optimizer_s / share,
                               optimizer_per_param_s=cost.optimizer_per_param_s / share,
                               peak_flops=cost.peak_flops * share)


def core_share(world: int) -> float:
    """The share of a core each rank's thread gets when `world` local ranks run at once (1 when
    the cores suffice)."""
    cores = len(os.sched_getaffinity(0))
    return min(1.0, cores / (world * (rank_threads(world) or cores)))


def rank_threads(world: int) -> int:
    """A rank's intra-op threads in a job of `world` ranks: OMP_NUM_THREADS, else one per worker as
    the launchers set it (0: a one-rank job keeps torch's default)."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 else (1 if world > 1 else 0)
