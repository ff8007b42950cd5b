"""Make the Flight Recorder dumps of tests/data/frdumps: a real Gloo job under plain torchrun with the
recorder on, every rank writing its dump (`_dump_fr_trace`, the pickle NCCL's watchdog writes) when a
collective times out, or as it ends.

    TORCH_FR_BUFFER_SIZE=64 torchrun --standalone --nproc-per-node N make_dumps.py CASE OUT [json]

CASE (N): skip (3: rank 2 skips the last step's metric all_reduce), size (3: rank 1 reduces 5
numbers at step 3 where the others reduce 4), dtype (3: rank 1 reduces float64 at step 3), stop (3:
rank 1 stops in Python at step 4 and never dumps), mesh (4: a 2x2 mesh; rank 2 skips the last
data-parallel all_reduce: its group {0, 2} hangs, the other {1, 3} finishes). With `json`, each
rank writes the JSON form instead (`_dump_fr_trace_json`, what torch.distributed.debug serves).
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

STEPS = 6


def dump(out: str, rank: int) -> None:
    """Written whole, not cut short by torchrun's SIGTERM when another rank has already died."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    json_form = sys.argv[3:] == ["json"]
    data = _dump_fr_trace_json(includeCollectives=True, onlyActive=False) if json_form else _dump_fr_trace()
    path = os.path.join(out, f"rank{rank}" + (".json" if json_form else ""))
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)


def step(case: str, rank: int, it: int, grads: torch.Tensor, dp, tp) -> None:
    if case == "stop" and rank == 1 and it == 4:
        time.sleep(3600)  # stuck outside any collective: torchrun ends it when the others fail
    if case == "mesh":
        dist.all_reduce(grads, group=tp)
        if not (rank == 2 and it == STEPS - 1):
            dist.all_reduce(grads, group=dp)
        return
    metric = torch.ones(4)
    if it == 3 and rank == 1 and case == "size":
        metric = torch.ones(5)
    if it == 3 and rank == 1 and case == "dtype":
        metric = torch.ones(4, dtype=torch.float64)
    dist.all_reduce(grads)
    if not (case == "skip" and rank == 2 and it == STEPS - 1):
        dist.all_reduce(metric)


def main() -> None:
    case, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=4))
    rank = dist.get_rank()
    dp = tp = None
    if case == "mesh":  # every rank creates every group, in the same order
        groups = {r: g for ranks in ([0, 2], [1, 3]) for g in [dist.new_group(ranks)] for r in ranks}
        dp = groups[rank]
        groups = {r: g for ranks in ([0, 1], [2, 3]) for g in [dist.new_group(ranks)] for r in ranks}
        tp = groups[rank]
    grads = torch.ones(16)
    try:
        for it in range(STEPS):
            step(case, rank, it, grads, dp, tp)
    except RuntimeError as e:  # the collective timed out (or the backend caught the mismatch)
        print(f"rank {rank}: {str(e).splitlines()[0][:200]}", flush=True)
        dump(out, rank)
        sys.exit(1)
    dump(out, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
