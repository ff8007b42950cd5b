"""What `comm pairs` and `scale` are asked to do (`PairsConfig`, `ScaleConfig`): frozen, validated
at construction, each knob a flag (distval/knobs.py). torch-free, so the command line reads them
without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from distval.knobs import FieldError, comma_list, knob
from distval.units import format_size, parse_size

# a node, link or rank is named when its figure is under this share of its peers' median (docs/scaling.md)
OUTLIER_SHARE = 0.7
# measured efficiency within this share of the planned one is as planned (±20%, the planner's accuracy goal)
PLAN_BAND = 0.2


def _share(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not a number; give a share of the median, e.g. 0.7") from None
    if not 0 < value < 1:
        raise ValueError(f"{flag} must be a share between 0 and 1, e.g. 0.7 (got {text})")
    return value


def _bytes_or_auto(text: str, flag: str) -> int | None:
    return None if str(text).strip().lower() == "auto" else parse_size(text, flag)


def parse_worlds(text: str, flag: str = "--worlds") -> tuple[int, ...] | None:
    """'1,2,4' -> (1, 2, 4): the world sizes of a ladder, ascending, each once; 'auto': None."""
    if str(text).strip().lower() == "auto":
        return None
    values = []
    for item in comma_list(text, flag):
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"{flag}: {item!r} is not a world size (a whole number of ranks, at least 1)")
        values.append(int(item))
    if not values:
        raise ValueError(f"{flag}: give at least one world size, e.g. 1,2,4")
    return tuple(sorted(set(values)))


@dataclass(frozen=True)
class PairsConfig:
    bytes: int | None = knob(None, "--bytes", "-b", parse=_bytes_or_auto, text="auto",
                             help="Bytes per message (K/M/G binary); auto: 64M on GPUs, 4M on CPU.")
    iters: int = knob(5, "--iters", "-n", help="Timed messages per pair and direction.")
    warmup: int = knob(1, "--warmup-iters", "-w", help="Untimed messages per pair and direction.")
    outlier_share: float = knob(OUTLIER_SHARE, parse=_share, text=str(OUTLIER_SHARE),
                                help="Name a node, link or rank under this share of its peers' median.")
    bisect: bool = knob(False, help="For thousands of nodes: all_reduce on halves, then on the slower "
                        "half, in log2(nodes) rounds, instead of every pair (names one slow node).")
    compute: bool = knob(True, "--compute/--no-compute", help="Also time a fixed matmul on every rank (a slow "
                         "host is not a slow link).")

    def __post_init__(self) -> None:
        if self.iters < 1:
            raise ValueError(f"-n/--iters must be at least 1 (got {self.iters})")
        if self.warmup < 0:
            raise ValueError(f"-w/--warmup-iters must not be negative (got {self.warmup})")
        if self.bytes is not None and self.bytes < 4:
            raise ValueError(f"-b/--bytes must be at least 4 (got {self.bytes})")

    def message_bytes(self, device_type: str) -> int:
        if self.bytes is not None:
            return self.bytes
        return 64 * 2**20 if device_type == "cuda" else 4 * 2**20

    def describe(self, device_type: str) -> str:
        return (f"{format_size(self.message_bytes(device_type))} messages, {self.warmup} untimed then {self.iters} "
                "timed per pair and direction, bandwidth = bytes x messages / the slower end's time")


@dataclass(frozen=True)
class ScaleConfig:
    worlds: tuple[int, ...] | None = knob(None, parse=parse_worlds, text="auto",
                                          help="World sizes to measure, e.g. 1,2,4 (auto: 1, then doubling, and "
                                          "--nproc).")
    strong: bool = knob(False, help="Strong scaling: the global batch stays that of the largest world "
                        "(micro-batch x largest world); default weak: the per-rank batch stays.")
    bench: bool = knob(True, "--bench/--no-bench", help="Calibrate the planner with a comm bench at the largest world "
                       "(its alpha-beta and per-call cost) and one-rank step costs; without, no planned efficiency.")
    from_reports: tuple[str, ...] = knob((), "--join", parse=comma_list, text="",
                                         help="Build the table from `distval scale --json` points measured "
                                         "elsewhere (e.g. one Slurm job per node count), comma list of files.")

    def __post_init__(self) -> None:
        if self.worlds is not None and self.from_reports:
            raise FieldError("worlds", "and {from_reports} exclude each other: {from_reports} reads points "
                             "measured elsewhere")

    def ladder(self, top: int) -> tuple[int, ...]:
        """The worlds to measure when up to `top` ranks can run: the given ones (each at most
        `top`), else 1, 2, 4, ... and `top`."""
        if self.worlds is not None:
            too_many = [w for w in self.worlds if w > top]
            if too_many:
                raise ValueError(f"--worlds {','.join(map(str, too_many))}: more ranks than the launcher can start "
                                 f"here ({top}: give --nproc {max(too_many)}, or launch with torchrun/Slurm)")
            return self.worlds
        out, world = [], 1
        while world < top:
            out.append(world)
            world *= 2
        return tuple([*out, top])

