"""The instrumented collective layer: what it records (OpRecord) is what the bench, the check and
the training step account with."""

import torch

from distval.launch import LaunchOptions, run
from distval.rank import RankContext


def _rank_fn(ctx: RankContext, cfg: dict):
    comm, n = ctx.comm, ctx.world_size
    x = torch.ones(1000, dtype=torch.float32)
    comm.all_reduce(x)
    out = torch.empty(n * 10, dtype=torch.float64)
    comm.all_gather(out, torch.zeros(10, dtype=torch.float64))
    comm.reduce_scatter(torch.empty(10), torch.ones(10 * n))
    h = comm.all_reduce(torch.ones(5, dtype=torch.int64), async_op=True)
    pending = [r.op for r in comm.pending()]
    h.wait()
    comm.broadcast(torch.zeros(3), src=n - 1)
    comm.barrier()
    for _ in range(cfg["extra"]):
        comm.all_reduce(torch.ones(1))
    return {
        "records": [r.to_dict() for r in comm.records],
        "totals": {op: (t.calls, t.bytes) for op, t in comm.totals.items()},
        "pending_during_async": pending,
        "pending_after": len(comm.pending()),
        "x0": float(x[0]),
    }


def test_every_collective_is_recorded_with_sequence_bytes_and_call_site():
    job = run(_rank_fn, {"extra": 0}, LaunchOptions(nproc=3, timeout_s=30))
    for rank, res in enumerate(job.results):
        recs = res["records"]
        assert [r["seq"] for r in recs] == list(range(len(recs)))
        assert [r["op"] for r in recs] == [
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "all_reduce",
            "broadcast",
            "barrier",
        ]
        # bytes = nccl-tests' S: all_gather counts the gathered output, reduce_scatter the input
        assert [r["bytes"] for r in recs] == [4000, 3 * 10 * 8, 3 * 10 * 4, 40, 12, 0]
        assert recs[0]["dtype"] == "float32" and recs[1]["dtype"] == "float64" and recs[0]["shape"] == [1000]
        assert recs[4]["peer"] == 2
        assert all(r["call_site"].startswith("test_layer.py:") and r["call_site"].endswith(":_rank_fn") for r in recs)
        assert all(r["end_s"] >= r["start_s"] for r in recs)
        assert res["pending_during_async"] == ["all_reduce"] and res["pending_after"] == 0
        assert res["totals"]["all_reduce"] == (2, 4040)
        assert res["x0"] == 3.0
    assert job.world_size == 3 and [i["rank"] for i in job.ranks] == [0, 1, 2]


def test_ring_buffer_is_bounded():
    job = run(_rank_fn, {"extra": 5000}, LaunchOptions(nproc=2, timeout_s=30))
    recs = job.results[0]["records"]
    assert len(recs) == 4096 and recs[-1]["seq"] == 6 + 5000 - 1
    assert job.results[0]["totals"]["all_reduce"][0] == 5002  # counters are not bounded
