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
    a = values("data", dtype, 1000, 0, 2, seed=1)
    assert len(torch.unique(a)) > 100  # positions are distinguishable: misplaced chunks show
    assert not torch.equal(a, values("data", dtype, 1000, 1, 2, seed=1))
    assert not torch.equal(a, values("data", dtype, 1000, 0, 2, seed=2))
    assert torch.equal(a, values("data", dtype, 1000, 0, 2, seed=1))  # deterministic


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_compare_catches_one_flipped_bit_and_locates_it(dtype):
    expected = values("data", dtype, 513, 0, 2, seed=3)
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
        s = reduce_expected("sum", dtype, 100, world_size, seed=0).to(torch.float64)
        assert torch.equal(exp, (s / world_size).to(dtype))


def test_dtype_names_and_aliases():
    assert parse_dtype("half") is torch.float16 and parse_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'complex'"):
        parse_dtype("complex")
