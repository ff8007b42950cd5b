"""`comm check` on real multi-process Gloo groups (2 ranks and an odd 3), and proof that a
corrupted result is caught with the right rank and index."""

import pytest

from distval.comm.check import CheckConfig, cases
from distval.comm.inputs import DTYPES
from distval.launch import LaunchOptions
from distval.results import Status

from conftest import run_check

# What Gloo may legitimately skip: avg of integers (we define avg for floats only).
EXPECTED_SKIPS = {f"all_reduce/avg {d}" for d in ("int32", "int64", "uint8", "int8")}


@pytest.mark.parametrize("nproc", [2, 3])
def test_every_op_dtype_and_size_is_exact(nproc):
    cfg = CheckConfig()
    report = run_check(cfg, LaunchOptions(nproc=nproc, timeout_s=30))
    assert report.meta["world_size"] == nproc and report.meta["backend"] == "gloo"
    by_name = {c.name: c for c in report.checks}
    assert len(report.checks) == len(cases(cfg))
    for c in report.checks:
        op, dtype = c.where["op"], c.where["dtype"]
        if f"{op} {dtype}" in EXPECTED_SKIPS:
            assert c.status is Status.SKIP, c.summary
        else:
            assert c.status is Status.OK, c.summary
    # every dtype and size class was actually exercised for every op
    for op in ("all_reduce/sum", "broadcast", "reduce", "all_gather", "all_gather_list", "reduce_scatter",
               "all_to_all", "gather", "scatter", "sendrecv"):
        for dtype in DTYPES:
            for size in ("empty", "one", "odd", "non_pow2", "large_odd"):
                assert f"comm.check {op} {dtype} {size}" in by_name
    assert report.exit_code() == 0


@pytest.mark.parametrize("op, rank, index", [
    ("all_reduce", 2, 5),
    ("reduce_scatter", 1, 0),
    ("all_to_all", 0, 900),
    ("broadcast", 1, 3),
])
def test_corrupted_result_is_caught_with_rank_and_index(monkeypatch, op, rank, index):
    monkeypatch.setenv("DISTVAL_FAULT", f"op={op},rank={rank},index={index}")
    cfg = CheckConfig(ops=[op], dtypes=["float32", "int8"], sizes={"non_pow2": 1000})
    report = run_check(cfg, LaunchOptions(nproc=3, timeout_s=30))
    failed = [c for c in report.checks if c.status is Status.FAIL]
    # every case of the op fails (all reduce ops of all_reduce but avg, whose 2-ulp tolerance
    # rightly absorbs a one-bit flip of the last place)
    must_fail = [c for c in report.checks if c.status is not Status.SKIP and c.where["op"] != "all_reduce/avg"]
    assert failed == must_fail
    assert {c.where["dtype"] for c in failed} == {"float32", "int8"}
    for c in failed:
        assert c.where["op"].split("/")[0] == op
        assert c.details["rank"] == rank and c.details["index"] == index
        assert c.details["num_wrong"] == 1 and c.details["wrong_ranks"] == [rank]
        assert c.details["expected"] != c.details["got"]
        assert f"rank {rank}" in c.summary and f"index {index}" in c.summary
    assert report.exit_code() == 1


def test_every_op_form_and_root_catches_corruption(monkeypatch):
    """One bit flipped in any op's output on rank 2 is caught, in every in-place form and from
    every root where rank 2 receives data."""
    monkeypatch.setenv("DISTVAL_FAULT", "op=any,rank=2,index=3")
    cfg = CheckConfig(ops=["all"], dtypes=["int32"], sizes={"n": 100})
    report = run_check(cfg, LaunchOptions(nproc=3, timeout_s=30))
    by_op = {c.where["op"]: c for c in report.checks}
    assert by_op["barrier"].status is Status.OK and by_op["all_reduce/avg"].status is Status.SKIP
    for op, c in by_op.items():
        if op in ("barrier", "all_reduce/avg"):
            continue
        assert c.status is Status.FAIL, op
        assert c.details["wrong_ranks"] == [2] and c.details["index"] == 3, op
        forms = {(w.get("root"), w.get("inplace")) for w in c.details["all"]}
        if op in ("reduce", "gather"):  # only the root receives: caught when rank 2 is the root
            assert forms == {(2, None)}, op
        elif op in ("broadcast", "scatter"):  # every rank receives from every root but itself
            assert {root for root, _ in forms} >= {0, 1}, op
        elif op in ("all_gather", "reduce_scatter"):
            assert forms == {(None, False), (None, True)}, op


def test_repetitions_use_fresh_inputs_and_stop_at_first_failure(monkeypatch):
    # the fault fires only on the 2nd all_reduce call of rank 1: repetition 1 of the first case
    monkeypatch.setenv("DISTVAL_FAULT", "op=all_reduce,rank=1,index=0,nth=2")
    cfg = CheckConfig(ops=["all_reduce"], dtypes=["int32"], sizes={"odd": 7}, iters=4)
    report = run_check(cfg, LaunchOptions(nproc=2, timeout_s=30))
    sum_check = next(c for c in report.checks if c.where["op"] == "all_reduce/sum")
    assert sum_check.status is Status.FAIL
    assert [w["rep"] for w in sum_check.details["all"]] == [1]
    assert all(c.status is Status.OK for c in report.checks if c is not sum_check and c.status is not Status.SKIP)
