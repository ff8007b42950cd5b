"""The expectations file (`--expect FILE`, docs/expectations.md): TOML read into frozen dataclasses.

Every mistake a person can make in the file is a ValueError of one line that names the file and
the key (`cluster.toml: pairs.min_node_gbps: ...`). Units live in the key names: `*_gbps` decimal
GB/s, `*_s` seconds, `bytes` a size ("128M", binary as nccl-tests, or an integer of bytes);
efficiencies and MFU are fractions in (0, 1]. Presets are TOML files shipped in `presets/`, loaded
with importlib.resources and named `preset:NAME`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from distval.comm.config import DTYPE_NAMES, dtype_key
from distval.comm.names import BENCH_OPS
from distval.units import parse_size

PRESET_PREFIX = "preset:"
_PRESET_DIR = "presets"


@dataclass(frozen=True)
class BenchExpectation:
    """The best busbw (in- or out-of-place) of `op` at exactly `size_bytes` (file key `bytes`), of
    `dtype` when given, on a job of `world_size` ranks over `nodes` hosts when given."""

    op: str
    size_bytes: int
    min_busbw_gbps: float
    dtype: str | None = None
    world_size: int | None = None
    nodes: int | None = None


@dataclass(frozen=True)
class PairsExpectation:
    min_node_gbps: float | None = None  # every direction of every `pairs` row of level "node"
    min_rank_gbps: float | None = None  # the same for level "rank"
    min_allreduce_busbw_gbps: float | None = None  # every `pair_nodes` row's allreduce_busbw_gbps


@dataclass(frozen=True)
class ScaleExpectation:
    min_efficiency: tuple[tuple[int, float], ...] = ()  # (world size, minimal efficiency), ascending
    max_step_time_s: float | None = None  # step_time_s of every `scaling` row


@dataclass(frozen=True)
class TrainExpectation:
    max_step_time_s: float | None = None  # medians over table `steps`, the first step left out
    min_mfu: float | None = None
    min_tokens_per_s: float | None = None


@dataclass(frozen=True)
class Expectations:
    source: str  # the path as given, or "preset:NAME"
    name: str = ""
    description: str = ""
    bench: tuple[BenchExpectation, ...] = ()
    pairs: PairsExpectation | None = None
    scale: ScaleExpectation | None = None
    train: TrainExpectation | None = None

    @property
    def label(self) -> str:
        """How a summary names where a threshold comes from: "preset 8xH100-NVLink" or the path."""
        if self.source.startswith(PRESET_PREFIX):
            return f"preset {self.source[len(PRESET_PREFIX):]}"
        return self.source


# -- reading ----------------------------------------------------------------------------------------

_TOP = ("name", "description", "bench", "pairs", "scale", "train")
_BENCH_KEYS = ("op", "bytes", "min_busbw_gbps", "dtype", "world_size", "nodes")
_KINDS = {  # key -> how its value is checked
    "min_busbw_gbps": "gbps", "min_node_gbps": "gbps", "min_rank_gbps": "gbps", "min_allreduce_busbw_gbps": "gbps",
    "max_step_time_s": "seconds", "min_mfu": "fraction", "min_tokens_per_s": "rate",
}
_SECTIONS = {
    "pairs": (PairsExpectation, ("min_node_gbps", "min_rank_gbps", "min_allreduce_busbw_gbps")),
    "scale": (ScaleExpectation, ("min_efficiency", "max_step_time_s")),
    "train": (TrainExpectation, ("max_step_time_s", "min_mfu", "min_tokens_per_s")),
}


def _preset_files() -> dict[str, str]:
    folder = resources.files(__package__).joinpath(_PRESET_DIR)
    return {Path(f.name).stem: f.name for f in folder.iterdir() if f.name.endswith(".toml")}


PRESETS: dict[str, str] = dict(sorted(_preset_files().items(), key=lambda kv: kv[0].lower()))  # name -> file


def load(spec: str) -> Expectations:
    """`spec` is a TOML file's path or `preset:NAME`; ValueError (one line) for anything wrong."""
    if spec.startswith(PRESET_PREFIX):
        wanted = spec[len(PRESET_PREFIX):].strip()
        name = next((n for n in PRESETS if n.lower() == wanted.lower()), None)
        if name is None:
            raise ValueError(f"--expect {spec!r}: no such preset; presets: {', '.join(PRESETS)}")
        text = resources.files(__package__).joinpath(_PRESET_DIR, PRESETS[name]).read_text(encoding="utf-8")
        return parse(_toml(text, f"{PRESET_PREFIX}{name}"), f"{PRESET_PREFIX}{name}")
    path = Path(spec)
    if not path.is_file():
        why = "is a directory" if path.is_dir() else "no such file"
        raise ValueError(f"--expect {spec!r}: {why} (give a TOML file, or preset:NAME: {', '.join(PRESETS)})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--expect {spec!r}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    return parse(_toml(text, spec), spec)


def list_presets() -> list[tuple[str, str]]:
    """(name, description) of every shipped preset, for `--expect` help and the docs."""
    out = []
    for name in PRESETS:
        exp = load(PRESET_PREFIX + name)
        out.append((name, exp.description or exp.name))
    return out


def parse(data: dict[str, Any], source: str) -> Expectations:
    """Expectations from a TOML document already read into `data` (tomllib's dict)."""
    _known(data, _TOP, source, "", "section")
    bench = _bench(data.get("bench", []), source)
    sections = {key: _section(data[key], key, source) for key in _SECTIONS if key in data}
    if not bench and not sections:
        raise ValueError(f"{source}: no thresholds; give at least one of [[bench]], [pairs], [scale], [train]")
    return Expectations(source, _text(data, "name", source), _text(data, "description", source), bench,
                        sections.get("pairs"), sections.get("scale"), sections.get("train"))


def _toml(text: str, source: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomli is the same parser
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ValueError(f"{source}: reading TOML needs Python 3.11 or the tomli package") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{source}: not valid TOML: {' '.join(str(e).split())}") from None


def _known(table: dict[str, Any], known: tuple[str, ...], source: str, where: str, what: str = "key") -> None:
    for key in table:
        if key not in known:
            raise ValueError(f"{source}: {where}unknown {what} {key!r}; known: {', '.join(known)}")


def _text(data: dict[str, Any], key: str, source: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{source}: {key}: give a string (got {value!r})")
    return value


def _bench(entries: Any, source: str) -> tuple[BenchExpectation, ...]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{source}: bench: give one [[bench]] table per (op, size), not {type(entries).__name__}")
    out: list[BenchExpectation] = []
    for i, entry in enumerate(entries):
        where = f"bench[{i}]"
        _known(entry, _BENCH_KEYS, source, f"{where}: ")
        for key in ("op", "bytes", "min_busbw_gbps"):
            if key not in entry:
                raise ValueError(f"{source}: {where}: missing key {key!r} (each [[bench]] needs op, bytes and "
                                 "min_busbw_gbps)")
        op = entry["op"]
        if op not in BENCH_OPS:
            raise ValueError(f"{source}: {where}.op: unknown op {op!r}; ops: {', '.join(BENCH_OPS)}")
        dtype = entry.get("dtype")
        if dtype is not None:
            dtype = _dtype(dtype, source, f"{where}.dtype")
        item = BenchExpectation(op, _size(entry["bytes"], source, f"{where}.bytes"),
                                _value(entry["min_busbw_gbps"], "gbps", source, f"{where}.min_busbw_gbps"), dtype,
                                *(_count(entry.get(k), source, f"{where}.{k}") for k in ("world_size", "nodes")))
        if (twin := next((j for j, b in enumerate(out) if _same_point(b, item)), None)) is not None:
            raise ValueError(f"{source}: {where}: repeats bench[{twin}] (same op, bytes, dtype, world_size, nodes)")
        out.append(item)
    return tuple(out)


def _same_point(a: BenchExpectation, b: BenchExpectation) -> bool:
    return (a.op, a.size_bytes, a.dtype, a.world_size, a.nodes) == (b.op, b.size_bytes, b.dtype, b.world_size, b.nodes)


def _section(table: Any, key: str, source: str) -> PairsExpectation | ScaleExpectation | TrainExpectation:
    cls, known = _SECTIONS[key]
    if not isinstance(table, dict):
        raise ValueError(f"{source}: {key}: give a [{key}] table (got {table!r})")
    _known(table, known, source, f"{key}: ")
    if not table:
        raise ValueError(f"{source}: [{key}] holds no thresholds; known: {', '.join(known)}")
    values = {k: (_efficiencies(v, source, f"{key}.{k}") if k == "min_efficiency"
                  else _value(v, _KINDS[k], source, f"{key}.{k}")) for k, v in table.items()}
    return cls(**values)


def _efficiencies(table: Any, source: str, where: str) -> tuple[tuple[int, float], ...]:
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{source}: {where}: give world size = fraction pairs, e.g. {{ 8 = 0.9, 16 = 0.85 }}")
    out = {}
    for size, value in table.items():
        if not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"{source}: {where}: world size {size!r} is not a whole number of ranks, e.g. 8")
        out[int(size)] = _value(value, "fraction", source, f"{where}.{size}")
    return tuple(sorted(out.items()))


_EXAMPLES = {"gbps": "give GB/s (decimal) as a number, e.g. 40", "seconds": "give seconds as a number, e.g. 0.5",
             "fraction": "give a fraction, e.g. 0.9", "rate": "give a number per second, e.g. 1000"}


def _value(value: Any, kind: str, source: str, where: str) -> float:
    """A positive threshold of `kind`; fractions at most 1 (90 for 90% is the mistake to catch)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{source}: {where}: {_EXAMPLES[kind]} (got {value!r})")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{source}: {where}: must be above 0 (got {value!r})")
    if kind == "fraction" and value > 1:
        raise ValueError(f"{source}: {where}: {value!r} is not a fraction; give a fraction, e.g. 0.9")
    return float(value)


def _size(value: Any, source: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{source}: {where}: give a size such as \"128M\", \"1G\" or an integer of bytes "
                         f"(got {value!r})")
    size = value if isinstance(value, int) else _parsed_size(value, source, where)
    if size <= 0:
        raise ValueError(f"{source}: {where}: must be above 0 bytes (got {value!r})")
    return size


def _parsed_size(text: str, source: str, where: str) -> int:
    try:
        return parse_size(text, "size")
    except ValueError as e:
        raise ValueError(f"{source}: {where}: {e}") from None


def _count(value: Any, source: str, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{source}: {where}: give a whole number of at least 1 (got {value!r})")
    return value


def _dtype(value: Any, source: str, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{source}: {where}: give a dtype name, one of {', '.join(DTYPE_NAMES)} (got {value!r})")
    try:
        return dtype_key(value)
    except ValueError:
        raise ValueError(f"{source}: {where}: unknown dtype {value!r}; dtypes: {', '.join(DTYPE_NAMES)}") from None
