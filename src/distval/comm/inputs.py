"""Exact, verifiable inputs for collectives and the bit-exact comparison of their results.

Every rank can generate every other rank's input from (seed, rank, index), so every rank computes
the expected result locally, with no communication. Values are chosen, per dtype and reduce op, so
that the true result is exactly representable and independent of summation order (the idea of
nccl-tests' verifiable/): for a sum each element gets non-zero values from k ranks only (k = n
while that is possible), each in [-L/k, L/k] where L is the largest integer the dtype holds
exactly (2^11 for float16, 2^8 for bfloat16, 127 for int8...), scaled by a power of two for floats
so fractional bits are exercised; a product multiplies signed powers of two whose exponents cannot
overflow (non-contributors give 1); avg has one contributor per element so one rounding happens
whatever the backend does; min and max need nothing special; pure data movement uses random bit
patterns. Comparison is on the raw bits: exact, except `avg` (2 ulp, as in nccl-tests).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from distval.comm.config import DTYPE_NAMES, dtype_key

# torch's dtype for each of comm/config.py's names (torch spells them the same)
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}
# Largest integer held exactly (floats: 2^mantissa_bits), and for products the largest power of two.
_EXACT_INT = {torch.float16: 2**11, torch.bfloat16: 2**8, torch.float32: 2**24, torch.float64: 2**53,
              torch.int8: 127, torch.uint8: 255, torch.int32: 2**31 - 1, torch.int64: 2**62}
_MAX_POW2 = {torch.float16: 14, torch.bfloat16: 120, torch.float32: 120, torch.float64: 1000,
             torch.int8: 6, torch.uint8: 7, torch.int32: 30, torch.int64: 62}
BITS_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # raw-bit views
_FLOAT_SCALE = 2.0**-3  # exercises fractional bits; exactness unaffected (a power of two)
_HASH_MASK = 0x7FFFFFFF
_HASH_MAX = 2**30  # keep derived values well inside int64 arithmetic


def parse_dtype(name: str) -> torch.dtype:
    return DTYPES[dtype_key(name)]


@functools.lru_cache(maxsize=None)
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def _hash(seed: int, rank: int, count: int, salt: int = 0, offset: int = 0) -> torch.Tensor:
    """A cheap integer hash of (seed, rank, index, salt) in [0, 2^31) for indices offset ..
    offset+count-1: int64 arithmetic that never overflows (31-bit values times 32-bit constants)."""
    h = torch.arange(offset, offset + count, dtype=torch.int64)
    h = (h * 2654435761 + (rank * 40503 + seed * 69069 + salt * 7919 + 12345)) & _HASH_MASK
    h = ((h ^ (h >> 15)) * 2246822519) & _HASH_MASK
    h = ((h ^ (h >> 13)) * 3266489917) & _HASH_MASK
    return h ^ (h >> 16)


def _from_int(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if is_float(dtype):
        return (values.to(torch.float64) * _FLOAT_SCALE).to(dtype)
    return values.to(dtype)


def _contributes(rank: int, world_size: int, k: int, count: int, offset: int) -> torch.Tensor:
    """Element i gets a non-neutral value from k of the ranks, rotating with i: at any world
    size each result then depends on at most k inputs, which keeps it exact, while every rank
    still contributes to a k/n share of the elements."""
    idx = torch.arange(offset, offset + count, dtype=torch.int64)
    return (idx - rank) % world_size < k


def values(kind: str, dtype: torch.dtype, count: int, rank: int, world_size: int, seed: int,
           offset: int = 0) -> torch.Tensor:
    """Rank `rank`'s input (elements offset .. offset+count-1) for a collective of `kind`:
    'sum', 'avg', 'prod', 'data' (min and max) or 'bits' (ops that only move data)."""
    h = _hash(seed, rank, count, offset=offset)
    n = max(world_size, 1)
    signed = dtype != torch.uint8
    if kind in ("sum", "avg"):
        limit = _EXACT_INT[dtype]
        # avg: one contributor per element, so the result is a single rounding of v/n whatever
        # the backend does (NCCL premultiplies by 1/n, Gloo divides the sum).
        a = min(limit if kind == "avg" else max(limit // n, min(8, limit)), _HASH_MAX)
        k = 1 if kind == "avg" else min(n, limit // a)
        ints = h % (2 * a + 1) - a if signed else h % (a + 1)
        ints = torch.where(_contributes(rank, n, k, count, offset), ints, torch.zeros_like(ints))
        return _from_int(ints, dtype)
    if kind == "prod":
        e = min(max(_MAX_POW2[dtype] // n, 1), 6)
        k = min(n, _MAX_POW2[dtype] // e)
        if is_float(dtype):
            mags = torch.pow(2.0, (h % (2 * e + 1) - e).to(torch.float64))
        else:
            mags = torch.ones(count, dtype=torch.int64) << (h % (e + 1))
        if signed:
            neg = (_hash(seed, rank, count, salt=1, offset=offset) & 1).bool()
            mags = torch.where(neg, -mags, mags)
        mags = torch.where(_contributes(rank, n, k, count, offset), mags, torch.ones_like(mags))
        return mags.to(dtype)
    if kind == "data":
        if dtype in (torch.int8, torch.uint8):
            ints = h % 256 - (128 if signed else 0)
        elif dtype == torch.int64:
            ints = (h - _HASH_MAX) * 4294967311  # reaches high bits
        elif dtype == torch.int32:
            ints = h - _HASH_MAX
        else:
            span = min(_EXACT_INT[dtype], _HASH_MAX)
            ints = h % (2 * span + 1) - span
        return _from_int(ints, dtype)
    if kind == "bits":
        return _random_bits(dtype, h, seed, rank, count, offset)
    raise ValueError(f"unknown input kind {kind!r}")


def _random_bits(dtype: torch.dtype, h: torch.Tensor, seed: int, rank: int, count: int, offset: int) -> torch.Tensor:
    """Every bit of every element varies (data movement does no arithmetic, so any finite
    pattern is exact); non-finite float patterns are replaced by finite values."""
    size = torch.empty(0, dtype=dtype).element_size()
    if size == 1 or not is_float(dtype):
        return values("data", dtype, count, rank, 1, seed, offset)
    h2 = _hash(seed, rank, count, salt=2, offset=offset)
    if size == 2:
        raw = h & 0xFFFF
        raw = raw - ((raw >> 15) << 16)
    elif size == 4:
        raw = ((h << 1) ^ h2) & 0xFFFFFFFF
        raw = raw - ((raw >> 31) << 32)
    else:
        raw = ((h & 0x3FFFFFFF) << 33) ^ (h2 << 2) ^ (h & 3)
        raw = torch.where((h2 & 1).bool(), raw | torch.tensor(-(2**63)), raw)
    x = raw.to(BITS_OF_SIZE[size]).view(dtype)
    return torch.where(torch.isfinite(x), x, _from_int(h % 1000, dtype))


def input_kind(redop: str | None) -> str:
    return {"sum": "sum", "avg": "avg", "prod": "prod", "min": "data", "max": "data"}.get(redop or "", "bits")


def reduce_expected(redop: str, dtype: torch.dtype, count: int, world_size: int, seed: int,
                    offset: int = 0) -> torch.Tensor:
    """The exact reduction over all ranks' inputs (elements offset .. offset+count-1), computed
    in a wide type one rank at a time (memory independent of the world size), cast back."""
    kind = input_kind(redop)
    wide = torch.float64 if is_float(dtype) else torch.int64
    combine = {"sum": torch.add, "avg": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum}
    if redop not in combine:
        raise ValueError(f"unknown reduce op {redop!r}")
    out = values(kind, dtype, count, 0, world_size, seed, offset).to(wide)
    for r in range(1, world_size):
        out = combine[redop](out, values(kind, dtype, count, r, world_size, seed, offset).to(wide))
    if redop == "avg":
        out = out / world_size
    return out.to(dtype)


@dataclass
class Mismatch:
    num_wrong: int
    index: int
    expected: float | int | str
    got: float | int | str
    expected_bits: str = ""  # the raw bits in hex: what was compared
    got_bits: str = ""

    def to_dict(self) -> dict:
        return {"num_wrong": self.num_wrong, "index": self.index, "expected": self.expected, "got": self.got,
                "expected_bits": self.expected_bits, "got_bits": self.got_bits}


def compare(got: torch.Tensor, expected: torch.Tensor, ulp: int = 0) -> Mismatch | None:
    """Compare raw bits; `ulp` > 0 allows that many units in the last place (same sign only)."""
    assert got.dtype == expected.dtype and got.numel() == expected.numel(), (got.dtype, expected.dtype)
    if got.numel() == 0:
        return None
    size = got.element_size()
    gb = got.contiguous().view(-1).view(BITS_OF_SIZE[size]).to(torch.int64)
    eb = expected.contiguous().view(-1).view(BITS_OF_SIZE[size]).to(torch.int64)
    if ulp and is_float(got.dtype):
        same_sign = (gb < 0) == (eb < 0)
        bad = ~same_sign | ((gb - eb).abs() > ulp)
    else:
        bad = gb != eb
    num_wrong = int(bad.sum())
    if num_wrong == 0:
        return None
    i = int(bad.nonzero()[0])
    mask = (1 << (8 * size)) - 1
    return Mismatch(num_wrong, i, _scalar(expected.view(-1)[i]), _scalar(got.view(-1)[i]),
                    f"0x{int(eb[i]) & mask:0{2 * size}x}", f"0x{int(gb[i]) & mask:0{2 * size}x}")


def _scalar(x: torch.Tensor) -> float | int | str:
    """A JSON-safe value: non-finite floats as strings ('nan', 'inf', '-inf')."""
    if not is_float(x.dtype):
        return x.item()
    value = float(x.to(torch.float64).item())
    return value if math.isfinite(value) else str(value)
