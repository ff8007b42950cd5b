"""What `comm check` and `comm bench` are asked to do (`CheckConfig`, `BenchConfig`): frozen,
validated at construction, each knob a flag (distval/knobs.py). torch-free, with the names of the
dtypes and reduce ops the collective layer maps to torch's (comm/inputs.py, comm/layer.py), so the
command line reads these flags without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from distval.comm.names import BENCH_OPS, CHECK_OPS
from distval.knobs import FieldError, comma_list, knob, normalise
from distval.units import format_size, parse_size

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8")
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
_DTYPE_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16",
                  "fp32": "float32", "fp64": "float64", "fp16": "float16", "int": "int32", "long": "int64"}
REDUCE_OPS = ("sum", "prod", "min", "max", "avg")
# Size classes: element counts per rank (for all_gather/reduce_scatter/all_to_all, per chunk).
SIZES = {"empty": 0, "one": 1, "odd": 7, "non_pow2": 1000, "large_odd": 65537}
TIMINGS = ("auto", "blocking", "burst")
GRAPH_NEEDS_CUDA = "-G captures each burst in a CUDA graph: it needs CUDA devices (--backend nccl); on CPU use " \
    "--timing burst"
DTYPE_HELP = "Comma list of dtypes (float32,float64,float16,bfloat16,int32,int64,uint8,int8), or all."


def dtype_key(name: str) -> str:
    """A dtype's name as the tables print it ('fp16' -> 'float16'); unknown: one line."""
    key = _DTYPE_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPE_NAMES)} (or 'all')")
    return key


def expand_all(items: tuple[str, ...] | list[str], universe: tuple[str, ...] | list[str]) -> list[str]:
    out: list[str] = []
    for item in items:
        out.extend(universe if item.strip().lower() == "all" else [item.strip()])
    if not out:
        raise ValueError("empty list")
    return list(dict.fromkeys(out))


def parse_ops(names: tuple[str, ...] | list[str], known: tuple[str, ...] = CHECK_OPS) -> tuple[str, ...]:
    out = []
    for name in expand_all(names, known):
        if name not in known:
            raise ValueError(f"unknown op {name!r}; choose from {', '.join(known)} (or 'all')")
        out.append(name)
    return tuple(out)


# The gradient norm of sharded gradients (zero1-3, FSDP): one fp32 all_reduce of NORM_BYTES, right after the
# backward's last reduce_scatter. The bench times it as such (the row NORM of its call_costs), the planner reads
# that row by this name (plan/calibration.py) and plans it (plan/steps.py), worldcost.py times it on N ranks.
NORM, NORM_BYTES = "norm", 4


def _counts(text: str, flag: str) -> dict[str, int]:
    out = {}
    for item in comma_list(text, flag):
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"{flag}: {item!r} is not a whole number of elements") from None
        if value < 0:
            raise ValueError(f"{flag}: {value} is negative")
        out[item] = value
    return out


@dataclass(frozen=True)
class CheckConfig:
    ops: tuple[str, ...] = knob(CHECK_OPS, parse=comma_list, text="all",
                                help=f"Comma list of {', '.join(CHECK_OPS)}, or all.")
    dtypes: tuple[str, ...] = knob(DTYPE_NAMES, "--dtypes", "-d", parse=comma_list, text="all", help=DTYPE_HELP)
    sizes: dict[str, int] = knob(None, "--counts", parse=_counts, factory=lambda: dict(SIZES),
                                 help="Comma list of element counts per rank to check (default 0,1,7,1000,65537).")
    iters: int = knob(1, "--check-iters", "-c", help="Repeat every check N times with fresh inputs.")
    seed: int = knob(0, help="Seed of the input generator.")

    def __post_init__(self) -> None:
        dtypes = tuple(dtype_key(d) for d in expand_all(self.dtypes, DTYPE_NAMES))
        normalise(self, ops=parse_ops(self.ops), dtypes=dtypes, sizes=dict(self.sizes))
        if self.iters < 1:
            raise ValueError(f"-c/--check-iters must be at least 1 (got {self.iters})")
        if not self.sizes:
            raise ValueError("no sizes to check: give at least one element count")
        for name, count in self.sizes.items():
            if count < 0:
                raise ValueError(f"size {name!r} has a negative element count {count}")


@dataclass(frozen=True)
class BenchConfig:
    ops: tuple[str, ...] = knob(("all_reduce",), parse=comma_list, text="all_reduce",
                                help=f"Comma list of {', '.join(BENCH_OPS)}, or all.")
    dtype: str = knob("float32", "--datatype", "-d", help="Element type, e.g. float32, bfloat16, int8.")
    min_bytes: int = knob(8, "--minbytes", "-b", parse=parse_size, text="8",
                          help="Smallest size in bytes (K/M/G binary).")
    max_bytes: int = knob(128 * 2**20, "--maxbytes", "-e", parse=parse_size, text="128M", help="Largest size in bytes.")
    factor: float = knob(2.0, "--stepfactor", "-f", help="Multiply the size by this each step.")
    step_bytes: int | None = knob(None, "--stepbytes", "-i", parse=parse_size,
                                  help="Add this many bytes each step instead of -f.")
    iters: int = knob(20, "--iters", "-n", help="Timed iterations per size.")
    warmup: int = knob(5, "--warmup-iters", "-w", help="Untimed iterations per size.")
    check_iters: int = knob(1, "--check", "-c", help="Correctness passes after timing (0: none).")
    redop: str = knob("sum", "--op", "-o", help="Reduce op: sum, prod, min, max, avg.")
    root: int = knob(0, "--root", "-r", help="Root rank of rooted collectives.")
    inplace: str = knob("both", help="both, in or out.")
    copy_ceiling: bool = True
    timing: str = knob("auto", help="blocking (barrier, one op, wait: a distribution per op), burst (-n "
                       "ops back to back, time / n, as nccl-tests), or auto: burst on CUDA, blocking on CPU.")
    graph: bool = knob(False, "--cuda-graph", "-G", help="Capture each burst in a CUDA graph and replay it "
                       "(nccl-tests' -G; CUDA only).")
    bursts: int = knob(5, help="Burst timing: timed bursts per size.")
    call_cost: bool = knob(True, "--call-cost/--no-call-cost", help="Also time all_reduce, all_gather and "
                           "reduce_scatter of 64 KiB as training issues them, one after a few ms of compute (table "
                           "call_costs: the per-call cost `distval plan --calibration` adds), and an all_reduce "
                           "overlapped with compute (table overlap_costs: how much overlap slows both).")

    def __post_init__(self) -> None:
        ops = expand_all(self.ops, BENCH_OPS)
        for op in ops:
            if op not in BENCH_OPS:
                raise ValueError(f"unknown op {op!r}; choose from {', '.join(BENCH_OPS)} (or 'all')")
        normalise(self, ops=tuple(ops), dtype=dtype_key(self.dtype))
        if self.redop not in REDUCE_OPS:
            raise ValueError(f"unknown reduce op {self.redop!r}; choose from {', '.join(REDUCE_OPS)}")
        if self.redop == "avg" and self.dtype not in FLOAT_DTYPES:
            raise FieldError("redop", f"avg needs a floating-point dtype (got {self.dtype}): integer averages round "
                             "differently per backend")
        if self.min_bytes < 0 or self.max_bytes < 0:
            raise ValueError("sizes must not be negative")
        if self.min_bytes > self.max_bytes:
            raise FieldError("min_bytes", f"{format_size(self.min_bytes)} is larger than {{max_bytes}} "
                             f"{format_size(self.max_bytes)}")
        if self.step_bytes is None and self.factor <= 1:
            raise FieldError("factor", f"must be greater than 1 (got {self.factor:g})")
        if self.step_bytes is not None and self.step_bytes <= 0:
            raise FieldError("step_bytes", f"must be positive (got {self.step_bytes})")
        if self.iters < 1:
            raise FieldError("iters", f"must be at least 1 (got {self.iters})")
        if self.warmup < 0 or self.check_iters < 0:
            raise FieldError("warmup", "and {check_iters} must not be negative")
        if self.inplace not in ("both", "in", "out"):
            raise FieldError("inplace", f"must be both, in or out (got {self.inplace!r})")
        if self.root < 0:
            raise FieldError("root", f"must not be negative (got {self.root})")
        if self.timing not in TIMINGS:
            raise FieldError("timing", f"must be {', '.join(TIMINGS)} (got {self.timing!r})")
        if self.graph and self.timing == "blocking":
            raise FieldError("graph", "replays bursts captured in a CUDA graph: it times bursts, not {timing} blocking")
        if self.bursts < 1:
            raise FieldError("bursts", f"must be at least 1 (got {self.bursts})")

    def method(self, device: torch.device) -> str:
        """The timing method on this device: burst or blocking."""
        if self.timing != "auto":
            return self.timing
        return "burst" if device.type == "cuda" or self.graph else "blocking"

    def describe(self, device: torch.device) -> str:
        """How the numbers were produced, for the table's title and the report's meta."""
        warm = f"after {self.warmup} warm-up"
        if self.method(device) == "blocking":
            return (f"{self.iters} iterations {warm}, blocking per op, time = p50 over iterations of the max over "
                    "ranks (nccl-tests conventions)")
        clock = ("captured once in a CUDA graph and replayed, timed with CUDA events" if self.graph
                 else "timed with CUDA events" if device.type == "cuda" else "timed with the host clock, one wait at "
                 "the end")
        return (f"{self.bursts} bursts of {self.iters} back-to-back ops {warm}, {clock}; time = p50 over bursts of "
                "burst time / ops, max over ranks (nccl-tests conventions)")

    def sizes(self) -> list[int]:
        out, size = [], self.min_bytes
        while size <= self.max_bytes:
            out.append(size)
            nxt = size + self.step_bytes if self.step_bytes else int(size * self.factor)
            size = nxt if nxt > size else size + 1
        return out

    def check_job(self, backend: str, world_size: int) -> None:
        """What the job must offer before a worker starts: CUDA for -G, a rank that is the root."""
        if self.graph and backend != "nccl":
            raise ValueError(GRAPH_NEEDS_CUDA)
        if self.root >= world_size:
            raise ValueError(f"-r {self.root} is not a rank of a world of {world_size} (ranks 0..{world_size - 1})")

