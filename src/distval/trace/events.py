"""One pass over a rank's Kineto trace keeps what the analysis needs, compactly (tuples of
floats, no DataFrame): profiler steps, GPU kernels (compute, communication, memory), the CPU
ops of every thread, the communication spans Gloo and NCCL record, the phases marked with
record_function, the memory counters and distval's own metadata.

GPU communication kernels are told from compute by their name (nccl/rccl/hccl) or by the
collective arguments Kineto copies onto them; on CPU the communication is the `gloo:*` (or
`nccl:*`) work a process group records on its worker threads, with the message size from the
recorded input shapes.
"""

from __future__ import annotations

import bisect
import math
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distval.trace.kineto import TraceError, open_trace

KERNEL_CATS = {"kernel": "kernel", "gpu_memcpy": "memory", "gpu_memset": "memory", "memcpy": "memory",
               "memset": "memory"}
_COMM_KERNEL = re.compile(r"nccl|rccl|^hccl", re.IGNORECASE)
# copies and fills that run as kernels: ROCm's blit kernels (__amd_rocclr_copyBuffer, _fillBufferAligned,
# ...) move memory as HIP's memcpy/memset do; counting them as compute would inflate it
_MEMORY_KERNEL = re.compile(r"^(?:void )?__amd_rocclr_(?:copy|fill)|^Memcpy|^Memset")
# matrix multiplies: rocBLAS/hipBLASLt's Tensile kernels (Cijk_...), Composable Kernel's and cuBLAS/CUTLASS's *gemm*
_GEMM_KERNEL = re.compile(r"^(?:void )?Cijk_|gemm|xmma|wgmma", re.IGNORECASE)
_ATTENTION_KERNEL = re.compile(r"flash|fmha|attn|attention", re.IGNORECASE)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
# phases: distval's record_function names, and the annotations torch writes by itself
PHASES = {"distval:forward": "forward", "distval:backward": "backward", "distval:optimizer": "optimizer",
          "distval:data": "data", "distval:checkpoint": "checkpoint", "distval:grad_sync": "grad_sync"}
_AUTO_PHASES = (("Optimizer.step#", "optimizer"), ("Optimizer.zero_grad#", "optimizer"),
                ("enumerate(DataLoader)#", "data"))
DTYPE_BYTES = {"float": 4, "float32": 4, "c10::half": 2, "half": 2, "float16": 2, "c10::bfloat16": 2, "bfloat16": 2,
               "double": 8, "float64": 8, "long int": 8, "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2,
               "int16": 2, "unsigned char": 1, "uint8": 1, "byte": 1, "signed char": 1, "char": 1, "int8": 1,
               "bool": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1}
# the op for words found in kernel and work names; the first match wins (all_reduce before reduce)
_KERNEL_NAMES = (("all_reduce", ("allreduce", "all_reduce")), ("reduce_scatter", ("reducescatter", "reduce_scatter")),
                 ("all_gather", ("allgather", "all_gather")), ("all_to_all", ("alltoall", "all_to_all")),
                 ("broadcast", ("broadcast",)), ("sendrecv", ("sendrecv", "send", "recv")), ("reduce", ("reduce",)),
                 ("barrier", ("barrier",)), ("gather", ("gather",)), ("scatter", ("scatter",)))


def kernel_class(name: str) -> str:
    """What a GPU kernel (or copy) does, by its name: communication, memory, gemm, attention or
    other compute (elementwise, reductions, the optimizer's fused kernels, ...)."""
    if _COMM_KERNEL.search(name):
        return "communication"
    if _MEMORY_KERNEL.search(name):
        return "memory"
    if _GEMM_KERNEL.search(name):
        return "gemm"
    return "attention" if _ATTENTION_KERNEL.search(name) else "other compute"


def op_name(text: str) -> str:
    """A collective's name in nccl-tests' vocabulary, from a kernel name, a Gloo/NCCL work
    title or a `Collective name` argument (`_allgather_base`, `ncclDevKernel_AllReduce_Sum_f32`)."""
    low = text.lower().split("(")[0]
    for op, keys in _KERNEL_NAMES:
        if any(k in low for k in keys):
            return op
    return "other"


@dataclass
class Collective:
    """One collective as this rank ran it: on GPU its kernel, on CPU its worker-thread span."""

    op: str
    bytes: int
    ts: float
    dur: float
    wait: float = 0.0  # the part spent before the last rank arrived (set by cross-rank matching)


@dataclass
class RankTrace:
    path: str
    rank: int | None = None
    world_size: int | None = None
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # (number, start, end), main thread
    profiler_steps: list[tuple[int, float, float]] = field(default_factory=list)  # the ProfilerStep#N ranges
    kernels: list[tuple[float, float, int, str, str]] = field(default_factory=list)  # start, end, stream, cls, name
    kernel_corr: list[int] = field(default_factory=list)  # the launch's correlation id, per kernel
    launch_ts: array = field(default_factory=lambda: array("d"))  # CPU time of each runtime call (a launch)
    launch_corr: array = field(default_factory=lambda: array("q"))  # ... and its correlation id
    cpu_ops: dict[Any, array] = field(default_factory=dict)  # thread -> op spans, flat: start, end, start, ...
    collectives: list[Collective] = field(default_factory=list)
    phases: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    main_thread: Any = None
    memory_peak: dict[str, int] = field(default_factory=dict)  # "cuda"/"cpu" -> peak Total Allocated
    meta: dict[str, Any] = field(default_factory=dict)  # distval's own (model FLOPs, tokens per step)
    ops: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (kind, name) -> [calls, total us]
    events: int = 0
    first: float = float("inf")  # the earliest start and latest end of any timed event
    last: float = float("-inf")

    @property
    def on_gpu(self) -> bool:
        return bool(self.kernels)


_CATS: dict[Any, str] = {}  # an event's category as found -> lower case (a handful of values)
_UNTIMED = ("trace", "python_function")


def _cat(raw: Any) -> str:
    cat = str(raw or "").lower()
    if isinstance(raw, str):
        _CATS[raw] = cat
    return cat


def short_name(name: str) -> str:
    """A kernel's name without its argument list (the last parenthesised group; templates keep
    theirs: `...<at::native::(anonymous namespace)::f>(int, float*)` -> `...<...f>`), 120 chars."""
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return name[:120]


def _int(value: Any) -> int:
    """An id from the trace, or -1 (HTA's reading: a stream such as ROCm's "0x0" is no stream)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def _bytes_from_shapes(args: dict[str, Any]) -> int:
    """A CPU collective's message size from its recorded input shapes (record_shapes): the
    largest argument's element count times the element size, as nccl-tests sizes it."""
    types = [str(t).lower() for t in args.get("Input type", []) if t]
    elt = next((DTYPE_BYTES[t] for t in types if t in DTYPE_BYTES), 4)

    def count(dims: Any) -> int:
        if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
            return math.prod(dims)
        return sum(count(d) for d in dims) if isinstance(dims, list) else 0

    return max((count(d) for d in args.get("Input Dims", [])), default=0) * elt


def _kernel_collective(name: str, args: dict[str, Any], ts: float, dur: float) -> Collective:
    nelems = max(_int(args.get("In msg nelems")), _int(args.get("Out msg nelems")), 0)
    elt = DTYPE_BYTES.get(str(args.get("dtype", "")).lower(), 0)
    return Collective(op_name(str(args.get("Collective name") or name)), nelems * elt, ts, dur)


def read_rank(path: str | Path) -> RankTrace:
    """Read one rank's trace file. Raises TraceError for a file that is not a readable trace."""
    header, events = open_trace(path)
    rt = RankTrace(str(path))
    step_threads: dict[Any, int] = {}
    ops: dict[tuple[str, str], list[float]] = {}  # by the full name while reading, shortened once at the end
    work: list[tuple[Any, str, float, float, dict]] = []  # gloo:*/nccl:* spans: kept once the main thread is known
    timed: list[tuple[float, float]] = []
    first, last, count = float("inf"), float("-inf"), 0
    comm_names: dict[str, tuple[bool, bool]] = {}  # kernel name -> (communication, copy/fill) by its name
    kernel_names: dict[str, str] = {}
    cpu_ops = rt.cpu_ops
    for ev in events:
        count += 1
        ph = ev.get("ph")
        if ph != "X":
            if ph == "i" and ev.get("name") == "[memory]":
                a = ev.get("args", {})
                dev = "cuda" if a.get("Device Type") == 1 else "cpu"
                rt.memory_peak[dev] = max(rt.memory_peak.get(dev, 0), max(_int(a.get("Total Allocated")), 0))
            continue
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        raw, name = ev.get("cat"), ev.get("name")
        cat = (_CATS.get(raw) if isinstance(raw, str) else None) or _cat(raw)
        if not isinstance(name, str):
            name = str(name)
        if cat not in _UNTIMED:  # the profiler's own span covers its warm-up too
            if ts < first:
                first = ts
            if ts + dur > last:
                last = ts + dur
        if cat == "cpu_op":
            per = ops.get((cat, name))
            if per is None:
                per = ops[(cat, name)] = [0, 0.0]
            per[0] += 1
            per[1] += dur
            spans = cpu_ops.get(ev.get("tid"))
            if spans is None:
                spans = cpu_ops[ev.get("tid")] = array("d")
            spans.append(ts)
            spans.append(ts + dur)
        elif cat in KERNEL_CATS:
            per = ops.get((cat, name))  # time per kernel name
            if per is None:
                per = ops[(cat, name)] = [0, 0.0]
            per[0] += 1
            per[1] += dur
            args = ev.get("args", {})
            by_name = comm_names.get(name)
            if by_name is None:  # (a communication kernel, a copy or fill) by its name
                by_name = comm_names[name] = (bool(_COMM_KERNEL.search(name)), bool(_MEMORY_KERNEL.search(name)))
                kernel_names[name] = name
            name = kernel_names[name]  # one string per distinct name: less memory, a smaller pickle
            comm = cat == "kernel" and (by_name[0] or "Collective name" in args)
            cls = "comm" if comm else ("compute" if cat == "kernel" and not by_name[1] else "memory")
            rt.kernels.append((ts, ts + dur, _int(args.get("stream")), cls, name))
            rt.kernel_corr.append(_int(args.get("correlation")))
            if comm:
                rt.collectives.append(_kernel_collective(name, args, ts, dur))
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            corr = ev.get("args", {}).get("correlation")
            if corr is not None:
                rt.launch_ts.append(ts)
                rt.launch_corr.append(_int(corr))
        elif cat == "user_annotation":
            tid = ev.get("tid")
            m = _STEP.match(name)
            if m:
                rt.steps.append((int(m.group(1)), ts, ts + dur))
                step_threads[tid] = step_threads.get(tid, 0) + 1
            elif name.startswith(("gloo:", "nccl:")):
                work.append((tid, name, ts, dur, ev.get("args", {})))
            elif name == "distval:step":
                timed.append((ts, dur))
            elif phase := PHASES.get(name) or next((p for prefix, p in _AUTO_PHASES if name.startswith(prefix)), None):
                rt.phases.setdefault(phase, []).append((ts, ts + dur))
    rt.events, rt.first, rt.last = count, first, last
    _header(rt, header, Path(path))
    for (cat, name), (calls, us) in ops.items():
        per = rt.ops.setdefault(("kernel" if cat in KERNEL_CATS else "cpu_op", short_name(name)), [0, 0.0])
        per[0] += calls
        per[1] += us
    rt.main_thread = max(step_threads, key=step_threads.get) if step_threads else \
        max(rt.cpu_ops, key=lambda t: len(rt.cpu_ops[t]), default=None)
    if rt.on_gpu:  # the breakdown reads kernels; the CPU ops of the main thread only on CPU
        rt.cpu_ops.clear()
    for tid, name, ts, dur, args in work:  # on CPU, a process group's work is the communication itself
        if not rt.on_gpu and tid != rt.main_thread:
            op = name.split(":", 1)[1]
            rt.collectives.append(Collective(op_name(op), _bytes_from_shapes(args), ts, dur))
    rt.steps.sort(key=lambda s: s[1])
    rt.profiler_steps = list(rt.steps)
    timed.sort()
    if timed:  # distval's own trace: the step is the region the harness times, numbered as the harness does
        first = int(rt.meta.get("first_step", 0))
        starts = [start for _, start, _ in rt.steps]
        numbered = [rt.steps[bisect.bisect_right(starts, ts) - 1][0] if starts and ts >= starts[0] else i
                    for i, (ts, _) in enumerate(timed)]
        rt.steps = [(first + n, ts, ts + dur) for n, (ts, dur) in zip(numbered, timed)]
    rt.collectives.sort(key=lambda c: c.ts)
    if not rt.events:
        raise TraceError(path, "no trace events")
    if rt.last < rt.first:
        raise TraceError(path, "no timed events (only metadata): nothing to analyse")
    return rt


def _header(rt: RankTrace, header: dict[str, Any], path: Path) -> None:
    info = header.get("distributedInfo") or {}
    rank = info.get("rank") if isinstance(info, dict) else None
    if rank is None:  # HTA's advice is to add distributedInfo; we read the file name too
        m = _RANK_IN_NAME.search(path.name)
        rank = int(m.group(1)) if m else None
    rt.rank = _int(rank) if rank is not None and _int(rank) >= 0 else None
    rt.world_size = info.get("world_size") if isinstance(info, dict) else None
    meta = header.get("distval")
    rt.meta = meta if isinstance(meta, dict) else {}
