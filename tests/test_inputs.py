"""The exact inputs: every reduction is representable and independent of order, and the bit
comparison catches the smallest possible error."""

import itertools

import pytest
import torch

from distval.comm.inputs import DTYPES, compare, parse_dtype, reduce_expected, values


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("redop", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 8, 64])
def test_reduction_is_exact_in_every_order(dtype, redop, world_size):
    count = 4097
    kind = {"min": "data", "max": "data"}.get(redop, redop)
    parts = [values(kind, dtype, count, r, world_size, seed=7) for r in range(world_size)]
    expected = reduce_expected(redop, dtype, count, world_size, seed=7)
    # Reduce in the dtype itself, in two different orders (what a ring or a tree would do):
    # both must give exactly the expected bits, so no rounding happened anywhere.
    for order in (range(world_size), reversed(range(world_size))):
        order = list(order)
        acc = parts[order[0]].clone()
        for r in order[1:]:
            if redop == "sum":
                acc = acc + parts[r]
            elif redop == "prod":
                acc = acc * parts[r]
            elif redop == "min":
                acc = torch.minimum(acc, parts[r])
            else:
                acc = torch.maximum(acc, parts[r])
        assert compare(acc, expected) is None
    if world_size > 1 and redop == "sum":
        assert not torch.equal(parts[0], parts[1]), "ranks must contribute different values"


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_data_values_vary_with_rank_index_and_seed(dtype):
    a = values("bits", dtype, 1000, 0, 2, seed=1)
    assert len(torch.unique(a)) > 100  # positions are distinguishable: misplaced chunks show
    assert not torch.equal(a, values("bits", dtype, 1000, 1, 2, seed=1))
    assert not torch.equal(a, values("bits", dtype, 1000, 0, 2, seed=2))
    assert torch.equal(a, values("bits", dtype, 1000, 0, 2, seed=1))  # deterministic


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_compare_catches_one_flipped_bit_and_locates_it(dtype):
    expected = values("bits", dtype, 513, 0, 2, seed=3)
    got = expected.clone()
    bits = got.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()])
    bits[300] ^= 1
    bad = compare(got, expected)
    assert bad is not None and bad.num_wrong == 1 and bad.index == 300
    assert compare(expected.clone(), expected) is None


def test_avg_tolerates_two_ulp_only():
    expected = torch.tensor([1.0, -3.0, 1024.0], dtype=torch.float32)
    got = expected.clone()
    got.view(torch.int32)[0] += 2
    assert compare(got, expected, ulp=2) is None
    got.view(torch.int32)[0] += 1
    assert compare(got, expected, ulp=2).index == 0
    assert compare(-expected, expected, ulp=2).num_wrong == 3  # sign flips are never within tolerance


def test_avg_expected_is_the_rounded_mean():
    for world_size, dtype in itertools.product([2, 3, 7], [torch.float32, torch.float16, torch.bfloat16]):
        exp = reduce_expected("avg", dtype, 100, world_size, seed=0)
        total = sum(values("avg", dtype, 100, r, world_size, 0).to(torch.float64) for r in range(world_size))
        assert torch.equal(exp, (total / world_size).to(dtype))


@pytest.mark.parametrize("world_size", [3, 24, 100, 1000])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_avg_within_two_ulp_however_the_backend_computes_it(world_size, dtype):
    """NCCL premultiplies every input by 1/n in the dtype and sums; Gloo sums and divides. Both
    must land within the 2-ulp tolerance of the expected value at any world size."""
    count = 20000
    parts = [values("avg", dtype, count, r, world_size, seed=5) for r in range(world_size)]
    expected = reduce_expected("avg", dtype, count, world_size, seed=5)
    inv_n = torch.tensor(1.0 / world_size, dtype=dtype)
    premul = parts[0] * inv_n
    summed = parts[0].clone()
    for p in parts[1:]:
        premul = premul + p * inv_n
        summed = summed + p
    assert compare(premul, expected, ulp=2) is None
    assert compare(summed / world_size, expected, ulp=2) is None
    assert len(torch.unique(expected)) > 300


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("world_size", [256, 1024])
def test_inputs_stay_informative_at_large_world_sizes(dtype, world_size):
    for kind in ("sum", "prod"):
        parts = [values(kind, dtype, 4096, r, world_size, seed=1) for r in (0, 1, world_size - 1)]
        assert all(len(torch.unique(p)) >= 2 for p in parts), kind  # never a constant input
        exp = reduce_expected(kind, dtype, 4096, world_size, seed=1)
        assert len(torch.unique(exp)) >= 3, kind


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_bits_inputs_are_finite_and_use_the_low_bits(dtype):
    x = values("bits", dtype, 5000, 1, 2, seed=3)
    if dtype.is_floating_point:
        assert bool(torch.isfinite(x).all())
    raw = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]).to(torch.int64)
    assert len(torch.unique(raw & 0xFF)) > 200  # the lowest byte varies (mantissa tail for floats)


@pytest.mark.parametrize("kind", ["sum", "avg", "prod", "data", "bits"])
def test_offsets_address_the_same_elements(kind):
    whole = values(kind, torch.float32, 300, 2, 3, seed=9)
    assert torch.equal(values(kind, torch.float32, 100, 2, 3, seed=9, offset=150), whole[150:250])
    red = "sum" if kind in ("bits", "data") else kind
    assert torch.equal(reduce_expected(red, torch.float32, 50, 3, 9, offset=100),
                       reduce_expected(red, torch.float32, 300, 3, 9)[100:150])


def test_dtype_names_and_aliases():
    assert parse_dtype("half") is torch.float16 and parse_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'complex'"):
        parse_dtype("complex")


def test_the_torch_free_dtype_names_agree_with_torch():
    from distval.comm.config import DTYPE_NAMES, FLOAT_DTYPES, REDUCE_OPS
    from distval.comm.inputs import DTYPES
    from distval.comm.layer import _REDUCE_OPS

    assert tuple(DTYPES) == DTYPE_NAMES and all(str(d) == f"torch.{n}" for n, d in DTYPES.items())
    assert {n for n, d in DTYPES.items() if d.is_floating_point} == set(FLOAT_DTYPES)
    assert tuple(_REDUCE_OPS) == REDUCE_OPS and _REDUCE_OPS["prod"] == torch.distributed.ReduceOp.PRODUCT
