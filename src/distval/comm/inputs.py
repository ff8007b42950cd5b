"""Exact, verifiable inputs for collectives and the bit-exact comparison of their results.

Every rank can generate every other rank's input from (seed, rank, index), so every rank computes
the expected result locally, with no communication. Values are chosen, per dtype and reduce op, so
that the true result is exactly representable and independent of summation order (the idea of
nccl-tests' verifiable/): for a sum over n ranks each value lies in [-L/n, L/n] where L is the
largest integer the dtype holds exactly (2^11 for float16, 2^8 for bfloat16, 127 for int8...),
scaled by a power of two for floats so fractional bits are exercised; a product multiplies signed
powers of two whose exponents cannot overflow; min and max need nothing special. Comparison is on
the raw bits: exact, except `avg` (2 ulp, as in nccl-tests, since backends premultiply differently).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "int8": torch.int8,
}
# nccl-tests spellings accepted too
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16",
            "fp32": "float32", "fp64": "float64", "fp16": "float16", "int": "int32", "long": "int64"}

# Largest integer held exactly (floats: 2^mantissa_bits), and for products the largest power of two.
_EXACT_INT = {torch.float16: 2**11, torch.bfloat16: 2**8, torch.float32: 2**24, torch.float64: 2**53,
              torch.int8: 127, torch.uint8: 255, torch.int32: 2**31 - 1, torch.int64: 2**62}
_MAX_POW2 = {torch.float16: 14, torch.bfloat16: 120, torch.float32: 120, torch.float64: 1000,
             torch.int8: 6, torch.uint8: 7, torch.int32: 30, torch.int64: 62}
_FLOAT_SCALE = 2.0**-3  # exercises fractional bits; exactness unaffected (a power of two)
_HASH_MASK = 0x7FFFFFFF
_HASH_MAX = 2**30  # keep derived values well inside int64 arithmetic


def parse_dtype(name: str) -> torch.dtype:
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)} (or 'all')")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def _hash(seed: int, rank: int, count: int, salt: int = 0) -> torch.Tensor:
    """A cheap integer hash of (seed, rank, index, salt) in [0, 2^31): int64 arithmetic that
    never overflows (31-bit values times 32-bit constants)."""
    h = torch.arange(count, dtype=torch.int64)
    h = (h * 2654435761 + (rank * 40503 + seed * 69069 + salt * 7919 + 12345)) & _HASH_MASK
    h = ((h ^ (h >> 15)) * 2246822519) & _HASH_MASK
    h = ((h ^ (h >> 13)) * 3266489917) & _HASH_MASK
    return h ^ (h >> 16)


def _from_int(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if is_float(dtype):
        return (values.to(torch.float64) * _FLOAT_SCALE).to(dtype)
    return values.to(dtype)


def values(kind: str, dtype: torch.dtype, count: int, rank: int, world_size: int, seed: int) -> torch.Tensor:
    """Rank `rank`'s input for a collective of `kind`: 'sum'/'avg', 'prod', or 'data' (min, max
    and every op that only moves data)."""
    h = _hash(seed, rank, count)
    signed = dtype != torch.uint8
    if kind in ("sum", "avg"):
        a = min(_EXACT_INT[dtype] // max(world_size, 1), _HASH_MAX)
        ints = h % (2 * a + 1) - a if signed else h % (a + 1)
        return _from_int(ints, dtype)
    if kind == "prod":
        kmax = min(_MAX_POW2[dtype] // max(world_size, 1), 6)
        if is_float(dtype):
            exps = h % (2 * kmax + 1) - kmax
            mags = torch.pow(2.0, exps.to(torch.float64))
        else:
            mags = torch.ones(count, dtype=torch.int64) << (h % (kmax + 1))
        if signed:
            neg = (_hash(seed, rank, count, salt=1) & 1).bool()
            mags = torch.where(neg, -mags, mags)
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
    raise ValueError(f"unknown input kind {kind!r}")


def input_kind(redop: str | None) -> str:
    return {"sum": "sum", "avg": "avg", "prod": "prod"}.get(redop or "", "data")


def reduce_expected(redop: str, dtype: torch.dtype, count: int, world_size: int, seed: int) -> torch.Tensor:
    """The exact reduction over all ranks' inputs, computed in a wide type, cast back."""
    kind = input_kind(redop)
    wide = torch.float64 if is_float(dtype) else torch.int64
    parts = [values(kind, dtype, count, r, world_size, seed).to(wide) for r in range(world_size)]
    if redop in ("sum", "avg"):
        out = torch.stack(parts).sum(0) if parts else torch.zeros(count, dtype=wide)
        if redop == "avg":
            out = out / world_size
    elif redop == "prod":
        out = torch.stack(parts).prod(0)
    elif redop == "min":
        out = torch.stack(parts).min(0).values
    elif redop == "max":
        out = torch.stack(parts).max(0).values
    else:
        raise ValueError(f"unknown reduce op {redop!r}")
    return out.to(dtype)


@dataclass
class Mismatch:
    num_wrong: int
    index: int
    expected: float | int
    got: float | int

    def to_dict(self) -> dict:
        return {"num_wrong": self.num_wrong, "index": self.index, "expected": self.expected, "got": self.got}


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def compare(got: torch.Tensor, expected: torch.Tensor, ulp: int = 0) -> Mismatch | None:
    """Compare raw bits; `ulp` > 0 allows that many units in the last place (same sign only)."""
    assert got.dtype == expected.dtype and got.numel() == expected.numel(), (got.dtype, expected.dtype)
    if got.numel() == 0:
        return None
    itype = _BITS[got.element_size()]
    gb = got.contiguous().view(-1).view(itype).to(torch.int64)
    eb = expected.contiguous().view(-1).view(itype).to(torch.int64)
    if ulp and is_float(got.dtype):
        same_sign = (gb < 0) == (eb < 0)
        bad = ~same_sign | ((gb - eb).abs() > ulp)
    else:
        bad = gb != eb
    num_wrong = int(bad.sum())
    if num_wrong == 0:
        return None
    i = int(bad.nonzero()[0])
    return Mismatch(num_wrong, i, _scalar(expected.view(-1)[i]), _scalar(got.view(-1)[i]))


def _scalar(x: torch.Tensor) -> float | int:
    return x.item() if not is_float(x.dtype) else float(x.to(torch.float64).item())
