"""Sizes, sweeps and nccl-tests' counting rules, without a process group."""

import pytest

from distval.comm.bench import BenchConfig
from distval.comm.check import CheckConfig, cases
from distval.comm.ops import busbw_factor, count_for_bytes
from distval.stats import percentile
from distval.units import format_size, parse_duration, parse_size


def test_sizes_parse_like_nccl_tests():
    assert parse_size("8") == 8
    assert parse_size("1K") == 1024
    assert parse_size("128M") == 128 * 2**20 == parse_size("128MiB") == parse_size("128mb")
    assert parse_size("1G") == 2**30
    assert format_size(64 * 2**20) == "64M" and format_size(1000) == "1000"
    for bad in ("abc", "-1", "1.5", "12Q"):
        with pytest.raises(ValueError):
            parse_size(bad, "-b")


def test_durations():
    assert parse_duration("30") == 30 and parse_duration("500ms") == 0.5 and parse_duration("2m") == 120
    with pytest.raises(ValueError, match="--timeout 'soon'"):
        parse_duration("soon", "--timeout")


def test_sweep_sizes():
    assert BenchConfig(min_bytes=1 << 20, max_bytes=64 << 20, factor=4).sizes() == [
        1 << 20,
        4 << 20,
        16 << 20,
        64 << 20,
    ]
    assert BenchConfig(min_bytes=8, max_bytes=32, step_bytes=8).sizes() == [8, 16, 24, 32]
    assert BenchConfig(min_bytes=0, max_bytes=2, factor=2).sizes() == [0, 1, 2]


@pytest.mark.parametrize("kwargs, message", [
    ({"min_bytes": 2048, "max_bytes": 1024}, "min_bytes 2K is larger than max_bytes 1K"),
    ({"factor": 1.0}, "factor must be greater than 1"),
    ({"ops": ["all_reduce", "allreduce"]}, "unknown op 'allreduce'"),
    ({"dtype": "float8"}, "unknown dtype 'float8'"),
    ({"redop": "xor"}, "unknown reduce op 'xor'"),
    ({"iters": 0}, "iters must be at least 1"),
    ({"inplace": "sideways"}, "inplace must be both, in or out"),
])
def test_bench_config_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BenchConfig(**kwargs)


def test_nccl_tests_counts_and_factors():
    # per-rank count is rounded down so each chunk is 16-byte aligned (nccl-tests setupArgs)
    assert count_for_bytes("all_reduce", 1000, 4, 3) == 250
    assert count_for_bytes("all_gather", 1000, 4, 3) == (250 // 3) & ~3 == 80
    assert count_for_bytes("all_to_all", 1 << 20, 1, 3) == (2**20 // 3) & ~15
    assert count_for_bytes("reduce_scatter", 64, 8, 2) == 4
    assert busbw_factor("all_reduce", 4) == 2 * 3 / 4
    for op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert busbw_factor(op, 3) == pytest.approx(2 / 3)
    for op in ("broadcast", "reduce", "sendrecv"):
        assert busbw_factor(op, 5) == 1.0


def test_check_cases_cover_every_op_dtype_and_size():
    cfg = CheckConfig()
    names = {c.name for c in cases(cfg)}
    assert "all_reduce/prod bfloat16 large_odd" in names and "all_to_all uint8 empty" in names
    assert "barrier" in names
    # 5 reduce ops + 9 other ops with dtypes, 8 dtypes x 5 sizes each, plus one barrier
    assert len(names) == (5 + 9) * 8 * 5 + 1
    with pytest.raises(ValueError, match="unknown op 'allgather'"):
        CheckConfig(ops=["allgather"])
    with pytest.raises(ValueError, match="-c/--check-iters must be at least 1"):
        CheckConfig(iters=0)


def test_percentile_matches_numpy_linear():
    import numpy as np

    xs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (0, 50, 95, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_what_counts_as_unsupported():
    import torch.distributed as dist

    from distval.comm.agree import Unsupported, is_unsupported
    from distval.rank import PeerFailed

    assert is_unsupported(Unsupported("avg of ints"))
    assert is_unsupported(RuntimeError("Cannot use ReduceOp.AVG with Gloo"))
    assert is_unsupported(ValueError("unsupported dtype"))
    assert not is_unsupported(RuntimeError("[gloo] Timed out waiting 5000ms for recv operation to complete"))
    assert not is_unsupported(RuntimeError("Connection closed by peer [127.0.0.1]:1234"))
    assert not is_unsupported(PeerFailed("rank(s) [1] failed"))
    assert not is_unsupported(dist.DistBackendError("NCCL error"))
    assert not is_unsupported(KeyError("bug"))
    assert not is_unsupported(TypeError("tuple indices must be integers or slices, not str"))


@pytest.mark.parametrize("gpus", [1, 3, 8])
def test_compare_trains_its_reference_on_the_strategies_global_batch(monkeypatch, gpus):
    """Without --nproc the strategies run on default_nproc() ranks (one per GPU): the one-process
    reference must train on that many micro-batches, not on 2."""
    from distval import device as devices
    from distval.launch import LaunchOptions
    from distval.results import Report
    from distval.train import compare
    from distval.train.config import TrainConfig

    seen = []
    monkeypatch.setattr(devices, "default_nproc", lambda: gpus)
    monkeypatch.setattr(compare, "_one", lambda cfg, opts, rank_fn=None: seen.append((cfg, opts)) or Report("train"))
    cfg = TrainConfig(model="tiny", steps=2)
    compare.run_compare(cfg, ["simple_ddp"], LaunchOptions())
    (ref, opts), = seen
    assert ref.micro_batch == cfg.micro_batch * gpus and opts.nproc == 1
