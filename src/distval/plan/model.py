"""The cost model of one optimizer step: resolved inputs, compute time, step times.

Compute (the MFU convention of docs/plan.md "Compute", PaLM appendix B): model FLOPs per token =
6·N + 12·L·H·Q·T, N the matmul parameters (`ModelSpec.flop_params`), L layers, H·Q = hidden, T = sequence length;
forward is one third, backward two thirds. Full activation checkpointing recomputes the forward
during backward, so the executed FLOPs are 4/3 of the model FLOPs. Time = executed FLOPs ÷
(peak × MFU), where `--mfu` is the achieved fraction of peak on the work actually executed; the
reported MFU is model FLOPs ÷ (step time × peak) and so includes communication stalls and
recomputation. With `--params` alone the attention term is left out (no L, H, T known).

A step is K micro-batches per rank (K = gradient-accumulation steps); tokens per step =
global batch × T. The collectives and their order per strategy are in `steps.py`; times come
from `network.py`; the two bounds and the overlapped estimate from `schedule.py`.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

from distval.plan import presets, schedule, steps
from distval.plan.calibration import Calibration, StepCost, load
from distval.plan.config import DEFAULT_MFU, DTYPE_BYTES, ModelInfo, PlanConfig
from distval.plan.network import Link, Network
from distval.plan.schedule import Phase


@dataclass(frozen=True)
class Inputs:
    """Everything the formulas need, resolved from a PlanConfig, with where each number came from."""

    cfg: PlanConfig
    model: ModelInfo
    micro_batch: int
    grad_accum: int
    param_bytes: int  # per element
    grad_bytes: int
    optim_bytes: int
    comm_grad_bytes: int  # gradient reductions (a bf16/fp16 hook halves fp32 grads)
    network: Network
    peak_flops: float
    peak_source: str
    memory_bytes: int
    memory_source: str
    calibration: Calibration | None
    cost: StepCost | None = None  # the strategy's own costs, measured (the calibration's step_costs)
    mfu: float = DEFAULT_MFU
    mfu_source: str = "assumed (default)"

    @property
    def world_size(self) -> int:
        return self.network.world_size

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size


def matmul_flops(matmul, a, b, n: int, reps: int = 3) -> float:
    """2·n³ FLOPs ÷ the best of `reps` timed `matmul(a, b)` of n×n operands (one untimed first)."""
    matmul(a, b)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


@functools.lru_cache(maxsize=1)
def measured_cpu_peak_flops(n: int = 1024, reps: int = 3) -> float:
    """This host's fp32 matmul rate through numpy's BLAS (planning must not wait for
    `import torch`; the training loop measures its MFU peak through torch with `matmul_flops`)."""
    import numpy as np  # only when the cpu device is planned

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    return matmul_flops(np.matmul, a, b, n, reps)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resolve(cfg: PlanConfig) -> Inputs:
    """The inputs of a plan. With step costs in --calibration and no --mfu of its own, the MFU is
    the one measured there (and on the cpu device its peak, the rank's matmul rate it is a share of)."""
    micro, accum = cfg.batch()
    spec = presets.device(cfg.device)
    calibration = load(cfg.calibration) if cfg.calibration else None
    cost = calibration.cost(cfg.strategy) if calibration else None
    mfu, mfu_source = cfg.mfu, "given" if cfg.mfu != DEFAULT_MFU else "assumed (default)"
    if cost is not None and cfg.mfu == DEFAULT_MFU:
        mfu, mfu_source = cost.mfu, f"measured (step costs: the plain {cost.model} on one rank)"
    if cfg.peak_tflops is not None:
        peak, peak_source = cfg.peak_tflops * 1e12, "given (--peak-tflops)"
    elif spec.peak_tflops is not None:
        peak, peak_source = spec.peak_tflops * 1e12, f"preset {spec.name} (datasheet dense bf16)"
    elif cost is not None and mfu == cost.mfu:
        peak, peak_source = cost.peak_flops, "measured: a rank's matmul rate (step costs)"
    else:
        peak, peak_source = measured_cpu_peak_flops(), "measured: fp32 matmul on this host"
    if cfg.device_memory_gb is not None:
        memory, memory_source = int(cfg.device_memory_gb * presets.GIB), "given (--device-memory)"
    elif spec.memory_bytes is not None:
        memory, memory_source = spec.memory_bytes, f"preset {spec.name}"
    else:
        memory, memory_source = host_memory_bytes(), "measured: this host's RAM"
    grad = DTYPE_BYTES[cfg.grad_dtype]
    return Inputs(cfg, cfg.model_info(), micro, accum, DTYPE_BYTES[cfg.param_dtype], grad,
                  DTYPE_BYTES[cfg.optim_dtype], min(grad, 2) if cfg.comm_hook in ("bf16", "fp16") else grad,
                  build_network(cfg, calibration), peak, peak_source, memory, memory_source, calibration, cost,
                  mfu, mfu_source)


def preset_link(name: str, efficiency: float, flag: str, peers: int | None = None) -> Link:
    """A link preset as the model's Link. `peers`: the other devices of the node a device sends
    to at once, which limits a mesh (xGMI) to the links that reach them."""
    spec = presets.link(name, flag)
    label = f"{spec.name} ({min(peers, spec.mesh_links)} of {spec.mesh_links} mesh links)" \
        if spec.mesh_links and peers is not None and peers < spec.mesh_links else spec.name
    return Link(label, spec.latency_us * 1e-6, spec.rate_gbps(peers) * 1e9 * efficiency, "preset")


def build_network(cfg: PlanConfig, calibration: Calibration | None) -> Network:
    nodes, per_node, two_level = cfg.topology()
    if not two_level and cfg.link is None and cfg.bandwidth_gbps is None and cfg.inter_link is None \
            and cfg.intra_link is not None:
        nodes, per_node = 1, nodes  # `--world N --intra-link X`: N devices in one box
    base = None
    if cfg.link is not None:  # flat: every rank reaches every other over it
        base = preset_link(cfg.link, cfg.efficiency, "--link", None if two_level else nodes * per_node - 1)
    elif cfg.bandwidth_gbps is not None:
        base = Link("custom", (cfg.latency_us or 0.0) * 1e-6, cfg.bandwidth_gbps * 1e9 * cfg.efficiency, "given")
    # inside a node: --intra-link, else --link, else the device's own fabric (xGMI for an MI300X)
    intra_name = cfg.intra_link or (cfg.link if two_level else None) or (
        presets.device(cfg.device).fabric if two_level and base is None else None)
    intra = preset_link(intra_name, cfg.efficiency, "--intra-link", per_node - 1) if intra_name else base
    inter = preset_link(cfg.inter_link, cfg.efficiency, "--inter-link") if cfg.inter_link else base
    nics = cfg.nics_per_node or per_node
    net = Network(nodes, per_node, nics, intra, inter)
    if calibration is not None:
        # a flat plan has one link and the bench measured it; a two-level plan takes the bench
        # for the scope it measured (one host: intra-node; several: the network)
        if two_level:
            scope = "intra" if calibration.scope == "intra" else "inter"
        else:
            scope = "intra" if nodes == 1 else "inter"
        net.calibrated = {(scope, op): link for op, link in calibration.links().items()}
    return net


# -- compute -------------------------------------------------------------------------------------


def flops_per_token(model: ModelInfo) -> float | None:
    """6·N + 12·L·H·Q·T (None without a sequence length)."""
    if model.seq_len is None:
        return None
    attention = model.spec.attention_flops_per_token(model.seq_len) if model.spec is not None else 0
    return 6 * model.flop_params + attention


def micro_batch_times(inp: Inputs) -> tuple[float | None, float | None]:
    """(forward, backward) seconds of one micro-batch on one rank; backward includes the
    recomputed forward under activation checkpointing."""
    per_token = flops_per_token(inp.model)
    if per_token is None:
        return None, None
    flops = per_token * inp.micro_batch * inp.model.seq_len
    rate = inp.peak_flops * inp.mfu
    forward = flops / 3 / rate
    backward = 2 * flops / 3 / rate + (forward if inp.cfg.activation_checkpointing else 0.0)
    return forward, backward


def overhead_time(inp: Inputs) -> float:
    """The strategy's own cost per micro-batch (hooks, flattening, DTensor): the measured cost per
    unit times this model's units; 0 without measured step costs."""
    if inp.cost is None or inp.world_size == 1:
        return 0.0
    return max(0.0, inp.cost.overhead_per_unit_s) * len(steps.units(inp))


def optimizer_time(inp: Inputs) -> float:
    """The optimizer phase of a step (gradient norm, clipping, update): the measured per-tensor part,
    plus the measured time per parameter times the parameters this rank updates (all of them under
    ddp, 1/N under ZeRO and FSDP); 0 without measured step costs."""
    if inp.cost is None:
        return 0.0
    return inp.cost.optimizer_time(inp.model.num_params / (inp.world_size if inp.cfg.strategy != "ddp" else 1))


# -- one step ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    inputs: Inputs
    phases: list[Phase]
    comm_time_s: float | None
    compute_time_s: float | None
    step_time_no_overlap_s: float | None
    step_time_overlap_s: float | None  # perfect overlap: max(comm, compute)
    step_time_s: float | None  # the estimate under --overlap / --no-overlap
    tokens_per_step: int | None
    model_flops_per_step: float | None
    overhead_time_s: float = 0.0  # of compute_time_s: the strategy's own cost, all micro-batches (measured)
    optimizer_time_s: float = 0.0  # of compute_time_s: the optimizer phase (measured)
    # beyond compute_time_s: what overlapped collectives slow the compute by (the measured interference)
    interference_time_s: float = 0.0

    @property
    def comm_compute_ratio(self) -> float | None:
        if self.comm_time_s is None or not self.compute_time_s:
            return None
        return self.comm_time_s / self.compute_time_s

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens_per_step / self.step_time_s if self.step_time_s and self.tokens_per_step else None

    @property
    def comm_share(self) -> float | None:
        """The share of the step spent waiting for communication (not hidden behind compute)."""
        if not self.step_time_s or self.compute_time_s is None:
            return None
        return max(0.0, self.step_time_s - self.compute_time_s - self.interference_time_s) / self.step_time_s

    @property
    def mfu(self) -> float | None:
        if not self.step_time_s or self.model_flops_per_step is None:
            return None
        return self.model_flops_per_step / self.step_time_s / (self.inputs.peak_flops * self.inputs.world_size)


def evaluate(cfg: PlanConfig, inputs: Inputs | None = None) -> StepResult:
    inp = inputs or resolve(cfg)
    fwd, bwd = micro_batch_times(inp)
    overhead, optimizer = overhead_time(inp), optimizer_time(inp)
    if fwd is not None and bwd is not None:  # the strategy's own cost runs in forward and backward alike
        fwd, bwd = fwd + overhead / 3, bwd + 2 * overhead / 3
    phases = steps.phases(inp, fwd, bwd, optimizer)
    comm, compute = schedule.total(phases, schedule.COMM), schedule.total(phases, schedule.COMPUTE)
    both = comm is not None and compute is not None
    per_token = flops_per_token(inp.model)
    tokens = inp.global_batch * inp.model.seq_len if inp.model.seq_len else None
    interference = inp.calibration.interference if inp.calibration is not None else 0.0
    timed = schedule.step_time(phases, inp.cfg.overlap, interference)
    step, busy = timed if timed is not None else (None, None)
    return StepResult(
        inp,
        phases,
        comm,
        compute,
        comm + compute if both else None,
        max(comm, compute) if both else None,
        step,
        tokens,
        per_token * tokens if per_token is not None else None,
        overhead * inp.grad_accum,
        optimizer,
        max(0.0, busy - compute) if interference and busy is not None and compute is not None else 0.0,
    )
