"""The collectives of one optimizer step per strategy, in issue order, as schedule tasks.

Ψ parameters; p, g bytes per parameter and per gradient element (c for gradients on the wire:
g, or 2 under a bf16/fp16 hook); N ranks; K micro-batches per rank per step. Traffic counts
the bytes a rank sends, bus factor × S (ring all_reduce 2(N−1)/N, all_gather/reduce_scatter
(N−1)/N):

  ddp    once per step, during the last micro-batch's backward: all_reduce of the gradients in
         buckets (PyTorch DDP: the first bucket capped at 1 MiB, then `--bucket-mb` MiB), each
         launched when backward has produced it.                       traffic 2(N−1)/N·Ψc
         PowerSGD rank r: two all_reduces per bucket (P, then Q) of together ratio × bucket,
         ratio = Σ r·(rows+cols) over compressed matrices + uncompressed vectors, ÷ Ψ.
  zero1  once per step: reduce_scatter of the gradient buckets during the last backward, the
         optimizer updates the local 1/N shard, all_gather of the updated parameter buckets
         (nothing left to overlap with).           traffic (N−1)/N·Ψ(c + p) = DDP's when c = p
  zero2  as zero1, but gradients are only kept as shards, so the reduce_scatter runs in every
         micro-batch's backward (K times per step); all_gather once.
  zero3  every micro-batch: all_gather of each unit's parameters before its forward (the next
         unit prefetched while this one computes), again before its backward, and a
         reduce_scatter of its gradients after it.                  traffic 3·(N−1)/N·Ψ (p = c)
  fsdp   zero3 with FSDP2's default for the root unit (embeddings, final norm, head): kept
         unsharded from forward to backward, so it is not gathered again.

Units of ZeRO-3/FSDP are the transformer blocks plus the root; with only a parameter count, the
model is cut into `--bucket-mb` units. Compute is split over buckets by bytes (backward produces
gradients at a steady rate) and over units by their FLOPs.

The optimizer phase (measured step costs only; 0 otherwise) is a compute task once per step: after
the last backward under ddp and zero3/fsdp, before the parameters' all_gather under zero1/zero2;
where gradients are sharded it waits for a 4-byte all_reduce of the global gradient norm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distval.comm.config import NORM, NORM_BYTES
from distval.plan.network import bus_factor
from distval.plan.schedule import COMM, COMPUTE, Phase, Task

if TYPE_CHECKING:
    from distval.plan.model import Inputs

MIB = 2**20
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES


def buckets(total_bytes: float, bucket_bytes: float, first_bytes: float | None = None) -> list[float]:
    """Sizes of consecutive buckets covering `total_bytes`: the first capped at `first_bytes`,
    the rest at `bucket_bytes`, the last one whatever remains (a float's rounding left over from
    a total that is a whole number of buckets is none: simple_ddp's 20 tensors were 21 calls)."""
    out, left = [], float(total_bytes)
    cap = first_bytes if first_bytes is not None else bucket_bytes
    while left > 1e-9 * bucket_bytes:
        take = min(cap, left)
        out.append(take)
        left -= take
        cap = bucket_bytes
    return out


def comm_task(inp: "Inputs", label: str, op: str, size_bytes: float, deps: tuple[int, ...] = (),
              after: float | None = 0.0, probe: str | None = None) -> Task:
    """One collective with the calibration's measured per-call cost on top of α–β; `after`: the
    seconds of compute it is issued right after (None: back to back after another collective);
    `probe`: the bench's row that timed this very call, where it has one."""
    seconds, algorithm, source = inp.network.time(op, size_bytes)
    extra = inp.calibration.call_cost(after, op, probe) if seconds and inp.calibration is not None else 0.0
    if extra:  # negative where the probe found the op faster than its fit (never below nothing)
        seconds, source = max(0.0, seconds + extra), f"{source} + per-call cost"
    sent = bus_factor(op, inp.world_size) * size_bytes if inp.world_size > 1 else 0.0
    return Task(label, COMM, seconds, deps, op, size_bytes, sent, algorithm, source)


def _took(tasks: list[Task], indices: list[int]) -> float:
    """Seconds of the compute task a collective is issued after (0: none, or unknown)."""
    return (tasks[indices[0]].duration_s or 0.0) if indices else 0.0


def _times(value: float | None, share: float) -> float | None:
    return None if value is None else value * share


def _backward_with(
    inp: "Inputs", tasks: list[Task], bwd: float | None, sizes: list[float], label: str, op: str
) -> None:
    """Backward in chunks, one per bucket, each followed by its collective."""
    whole = sum(sizes)
    for i, size in enumerate(sizes):  # without overlap the collectives run back to back after backward
        tasks.append(Task("backward", COMPUTE, _times(bwd, size / whole)))
        chunk = tasks[-1].duration_s or 0.0
        tasks.append(comm_task(inp, label, op, size, (len(tasks) - 1,),
                               chunk if inp.cfg.overlap else (bwd or 0.0) if i == 0 else None))


def _accumulate(inp: "Inputs", fwd: float | None, bwd: float | None, repeat: int) -> list[Phase]:
    if repeat < 1:
        return []
    both = None if fwd is None or bwd is None else fwd + bwd
    return [Phase(repeat, (Task("forward+backward (no sync)", COMPUTE, both),))]


def ddp(inp: "Inputs", fwd: float | None, bwd: float | None, optimizer: float) -> list[Phase]:
    grads = inp.model.num_params * inp.comm_grad_bytes
    sizes = buckets(grads, inp.cfg.bucket_mb * MIB, min(DDP_FIRST_BUCKET_BYTES, inp.cfg.bucket_mb * MIB))
    tasks = [Task("forward", COMPUTE, fwd)]
    if inp.cfg.comm_hook != "powersgd":
        _backward_with(inp, tasks, bwd, sizes, "grads all_reduce", "all_reduce")
    else:
        ratio = powersgd_ratio(inp)
        for size in sizes:
            tasks.append(Task("backward", COMPUTE, _times(bwd, size / grads)))
            tasks.append(comm_task(inp, "PowerSGD P all_reduce", "all_reduce", size * ratio / 2, (len(tasks) - 1,),
                                   tasks[-1].duration_s or 0.0))
            tasks.append(comm_task(inp, "PowerSGD Q all_reduce", "all_reduce", size * ratio / 2, (len(tasks) - 1,),
                                   None))
    _optimizer(inp, tasks, optimizer)  # after the last bucket's all_reduce (the comm stream runs in order)
    return _accumulate(inp, fwd, bwd, inp.grad_accum - 1) + [Phase(1, tuple(tasks))]


NORM_LABEL = "grad norm all_reduce"


def _optimizer(inp: "Inputs", tasks: list[Task], seconds: float) -> None:
    """The optimizer step; where gradients are sharded (every strategy but ddp) the global gradient
    norm (clipping, the health checks) first needs one 4-byte all_reduce of the shards' sums."""
    if inp.cfg.strategy != "ddp":
        # right after the backward's last collective: the bench's norm row where it has one, else the
        # per-call cost back to back
        deps = (len(tasks) - 1,) if tasks else ()
        tasks.append(comm_task(inp, NORM_LABEL, "all_reduce", NORM_BYTES, deps, probe=NORM))
    tasks.append(Task("optimizer step", COMPUTE, seconds, (len(tasks) - 1,) if tasks else ()))


def _gather_params(inp: "Inputs", tasks: list[Task], optimizer: float) -> None:
    _optimizer(inp, tasks, optimizer)
    deps = (len(tasks) - 1,)
    for i, size in enumerate(buckets(inp.model.num_params * inp.param_bytes, inp.cfg.bucket_mb * MIB)):
        after = optimizer if i == 0 else None  # the later buckets follow the first back to back
        tasks.append(comm_task(inp, "params all_gather (step)", "all_gather", size, deps, after))


def zero1(inp: "Inputs", fwd: float | None, bwd: float | None, optimizer: float) -> list[Phase]:
    grads = buckets(inp.model.num_params * inp.comm_grad_bytes, inp.cfg.bucket_mb * MIB)
    tasks = [Task("forward", COMPUTE, fwd)]
    _backward_with(inp, tasks, bwd, grads, "grads reduce_scatter", "reduce_scatter")
    _gather_params(inp, tasks, optimizer)
    return _accumulate(inp, fwd, bwd, inp.grad_accum - 1) + [Phase(1, tuple(tasks))]


def zero2(inp: "Inputs", fwd: float | None, bwd: float | None, optimizer: float) -> list[Phase]:
    grads = buckets(inp.model.num_params * inp.comm_grad_bytes, inp.cfg.bucket_mb * MIB)
    micro = [Task("forward", COMPUTE, fwd)]
    _backward_with(inp, micro, bwd, grads, "grads reduce_scatter", "reduce_scatter")
    tail: list[Task] = []
    _gather_params(inp, tail, optimizer)
    return [Phase(inp.grad_accum, tuple(micro)), Phase(1, tuple(tail))]


def units(inp: "Inputs") -> list[tuple[str, int, float]]:
    """(name, parameters, share of the compute) of each ZeRO-3/FSDP unit, root first."""
    spec, model = inp.model.spec, inp.model
    if spec is None:
        per_unit = max(1, int(inp.cfg.bucket_mb * MIB / inp.param_bytes))
        counts = [int(b) for b in buckets(model.num_params, per_unit)]
        return [(f"shard unit {i}", c, c / model.num_params) for i, c in enumerate(counts)]
    seq = model.seq_len
    layer_flops = 6 * spec.layer_params() + 12 * spec.hidden_size * seq
    root_flops = 6 * (spec.norm_params() + spec.vocab_size * spec.hidden_size)
    whole = spec.num_layers * layer_flops + root_flops
    extra = model.num_params - spec.num_params()  # a --params correction goes to the root
    return [("root", spec.root_params() + extra, root_flops / whole)] + [
        (f"layer {i}", spec.layer_params(), layer_flops / whole) for i in range(spec.num_layers)]


def zero3(inp: "Inputs", fwd: float | None, bwd: float | None, optimizer: float,
          keep_root: bool = False) -> list[Phase]:
    parts = units(inp)
    p, c = inp.param_bytes, inp.comm_grad_bytes
    tasks: list[Task] = [comm_task(inp, "params all_gather fwd", "all_gather", parts[0][1] * p)]
    gathered = [0]
    computed: list[int] = []
    for i, (_, _, share) in enumerate(parts):
        if i + 1 < len(parts):  # prefetch the next unit once the previous one is done computing
            tasks.append(
                comm_task(inp, "params all_gather fwd", "all_gather", parts[i + 1][1] * p, tuple(computed[-1:]),
                          _took(tasks, computed[-1:]))
            )
            gathered.append(len(tasks) - 1)
        tasks.append(Task("forward", COMPUTE, _times(fwd, share), (gathered[i],)))
        computed.append(len(tasks) - 1)
    order = [parts[0]] + parts[:0:-1]  # root (the head) first, then the blocks in reverse
    need = [not (keep_root and j == 0) for j in range(len(order))]
    slots: dict[int, int] = {}
    if need[0]:
        tasks.append(comm_task(inp, "params all_gather bwd", "all_gather", order[0][1] * p, (computed[-1],),
                               _took(tasks, computed[-1:])))
        slots[0] = len(tasks) - 1
    for j, (_, count, share) in enumerate(order):
        if j + 1 < len(order) and need[j + 1]:
            tasks.append(comm_task(inp, "params all_gather bwd", "all_gather", order[j + 1][1] * p, (computed[-1],),
                                   _took(tasks, computed[-1:])))
            slots[j + 1] = len(tasks) - 1
        tasks.append(Task("backward", COMPUTE, _times(bwd, share), (slots[j],) if j in slots else ()))
        computed.append(len(tasks) - 1)
        tasks.append(comm_task(inp, "grads reduce_scatter", "reduce_scatter", count * c, (len(tasks) - 1,),
                               tasks[-1].duration_s or 0.0))
    tail: list[Task] = []
    _optimizer(inp, tail, optimizer)
    return [Phase(inp.grad_accum, tuple(tasks)), Phase(1, tuple(tail))]


def fsdp(inp: "Inputs", fwd: float | None, bwd: float | None, optimizer: float) -> list[Phase]:
    return zero3(inp, fwd, bwd, optimizer, keep_root=True)


def powersgd_ratio(inp: "Inputs") -> float:
    """Elements PowerSGD all-reduces ÷ Ψ. torch's hook compresses an n×m matrix to P (n×r) and
    Q (m×r) only when n·m ≥ 2·r·(n+m) (min_compression_rate 2); vectors go uncompressed."""
    spec, r = inp.model.spec, inp.cfg.powersgd_rank
    assert spec is not None, "PowerSGD needs the matrix shapes"
    sent, in_matrices = 0, 0
    for rows, cols, count in spec.matrices():
        in_matrices += rows * cols * count
        sent += count * (r * (rows + cols) if rows * cols >= 2 * r * (rows + cols) else rows * cols)
    vectors = spec.num_params() - in_matrices
    return (sent + vectors) / spec.num_params()


BUILDERS = {"ddp": ddp, "zero1": zero1, "zero2": zero2, "zero3": zero3, "fsdp": fsdp}


def phases(inp: "Inputs", fwd: float | None, bwd: float | None, optimizer: float = 0.0) -> list[Phase]:
    if inp.world_size == 1:  # nothing to communicate
        return _accumulate(inp, fwd, bwd, inp.grad_accum) + [Phase(1, (Task("optimizer step", COMPUTE, optimizer),))]
    return BUILDERS[inp.cfg.strategy](inp, fwd, bwd, optimizer)
