"""One prepared collective on this rank: its buffers, how to fill them with exact inputs, how to
issue it through `Comm`, and how to verify its output. `comm check` builds one per case and
root; `comm bench` builds one per (op, size, in-place) and issues it many times, then verifies.

Sizes follow nccl-tests: `count` is the per-rank parameter count (for all_gather the per-rank
send count, for reduce_scatter the per-rank receive count, for all_to_all the per-peer count).
`size_bytes` is the S of nccl-tests' bandwidth formulas and `busbw_factor` its bus factor, so
algbw = S / t and busbw = algbw * factor (nccl-tests' conventions; docs/report-schema.md).
"""

from __future__ import annotations

import torch

from distval.comm import names
from distval.comm.inputs import Mismatch, compare, input_kind, reduce_expected, values
from distval.comm.layer import Comm
from distval.comm.names import OPS

BENCH_OPS = tuple(OPS)
assert BENCH_OPS == names.BENCH_OPS, "comm/names.py lists the same ops"
_POISON = 0x5A  # byte written over outputs before an op: an untouched output then fails almost everywhere


def inplace_variants(op: str) -> tuple[bool, ...]:
    return OPS[op].inplace_forms


def busbw_factor(op: str, world_size: int) -> float:
    return names.bus_factor(op, world_size)


def count_for_bytes(op: str, size_bytes: int, elt: int, world_size: int) -> int:
    """nccl-tests' per-rank count for a sweep size given in bytes."""
    count = size_bytes // elt
    if OPS[op].divided:
        count = (count // world_size) & ~(max(16 // elt, 1) - 1)
    return count


class Collective:
    def __init__(self, comm: Comm, op: str, dtype: torch.dtype, count: int, device: torch.device,
                 redop: str = "sum", root: int = 0, inplace: bool = False):
        if inplace not in inplace_variants(op):
            raise ValueError(f"{op} has no {'in' if inplace else 'out-of'}-place form")
        self.comm, self.op, self.dtype, self.count, self.redop, self.root, self.inplace = (
            comm,
            op,
            dtype,
            count,
            redop,
            root,
            inplace,
        )
        n, rank = comm.world_size, comm.rank
        self.n, self.rank = n, rank
        self.size_bytes = OPS[op].s_chunks(n) * count * dtype.itemsize
        self.busbw_factor = busbw_factor(op, n)
        empty = lambda k: torch.empty(k, dtype=dtype, device=device)  # noqa: E731
        c = count
        if op in ("all_reduce", "broadcast", "reduce"):
            self.inp = self.out = empty(c)
        elif op == "all_gather":
            self.out = empty(n * c)
            self.inp = self.out[rank * c:(rank + 1) * c] if inplace else empty(c)
        elif op == "reduce_scatter":
            self.inp = empty(n * c)
            self.out = self.inp[rank * c:(rank + 1) * c] if inplace else empty(c)
        elif op == "all_to_all":
            self.inp, self.out = empty(n * c), empty(n * c)
        elif op in ("all_gather_list", "gather"):
            self.inp = empty(c)
            self.outs = [empty(c) for _ in range(n)] if (op == "all_gather_list" or rank == root) else None
        elif op == "scatter":
            self.out = empty(c)
            self.ins = [empty(c) for _ in range(n)] if rank == root else None
        elif op == "sendrecv":
            self.inp, self.out = empty(c), empty(c)
        else:
            raise AssertionError(op)

    # -- inputs and expected outputs, all from (seed, rank, index) ----------------------------

    def _data(self, rank: int, numel: int, seed: int, offset: int = 0) -> torch.Tensor:
        return values("bits", self.dtype, numel, rank, self.n, seed, offset)

    def _outputs(self) -> list[torch.Tensor]:
        if self.op in ("all_gather_list", "gather"):
            return self.outs or []
        return [self.out]

    def fill(self, seed: int) -> None:
        """Exact inputs for `seed`; outputs poisoned first, so an op that leaves its output
        untouched can never pass on stale data."""
        for out in self._outputs():
            out.view(torch.uint8).fill_(_POISON)
        n, c, r, op = self.n, self.count, self.rank, self.op
        if op in ("all_reduce", "reduce"):
            self.inp.copy_(values(input_kind(self.redop), self.dtype, c, r, n, seed))
        elif op == "reduce_scatter":
            self.inp.copy_(values(input_kind(self.redop), self.dtype, n * c, r, n, seed))
        elif op == "all_to_all":
            self.inp.copy_(self._data(r, n * c, seed))
        elif op == "scatter":
            if self.ins is not None:
                for j, chunk in enumerate(self.ins):
                    chunk.copy_(self._data(r, c, seed, offset=j * c))
        else:  # broadcast (every rank: non-roots are overwritten), all_gather(s), gather, sendrecv
            self.inp.copy_(self._data(r, c, seed))

    def verify(self, seed: int) -> Mismatch | None:
        """Compare this rank's output with the exact expected result (None on ranks that
        receive nothing, e.g. non-roots of reduce and gather)."""
        n, c, r, op = self.n, self.count, self.rank, self.op
        ulp = 2 if self.redop == "avg" else 0
        if op == "all_reduce" or (op == "reduce" and r == self.root):
            return compare(self.out.cpu(), reduce_expected(self.redop, self.dtype, c, n, seed), ulp)
        if op == "reduce_scatter":
            return compare(self.out.cpu(), reduce_expected(self.redop, self.dtype, c, n, seed, offset=r * c), ulp)
        if op == "broadcast":
            return compare(self.out.cpu(), self._data(self.root, c, seed))
        if op == "all_gather":
            return compare(self.out.cpu(), torch.cat([self._data(j, c, seed) for j in range(n)]))
        if op in ("all_gather_list", "gather"):
            if self.outs is None:
                return None
            return compare(
                torch.cat([o.cpu() for o in self.outs]), torch.cat([self._data(j, c, seed) for j in range(n)])
            )
        if op == "all_to_all":
            return compare(self.out.cpu(), torch.cat([self._data(j, c, seed, offset=r * c) for j in range(n)]))
        if op == "scatter":
            return compare(self.out.cpu(), self._data(self.root, c, seed, offset=r * c))
        if op == "sendrecv":
            return compare(self.out.cpu(), self._data((r - 1) % n, c, seed))
        return None

    # -- issuing ----------------------------------------------------------------------------

    def __call__(self) -> None:
        comm, op = self.comm, self.op
        if op == "all_reduce":
            comm.all_reduce(self.inp, self.redop)
        elif op == "broadcast":
            comm.broadcast(self.inp, self.root)
        elif op == "reduce":
            comm.reduce(self.inp, self.root, self.redop)
        elif op == "all_gather":
            comm.all_gather(self.out, self.inp)
        elif op == "all_gather_list":
            comm.all_gather_list(self.outs, self.inp)
        elif op == "reduce_scatter":
            comm.reduce_scatter(self.out, self.inp, self.redop)
        elif op == "all_to_all":
            comm.all_to_all(self.out, self.inp)
        elif op == "gather":
            comm.gather(self.inp, self.outs, self.root)
        elif op == "scatter":
            comm.scatter(self.out, self.ins, self.root)
        elif op == "sendrecv":
            comm.sendrecv(self.inp, (self.rank + 1) % self.n, self.out, (self.rank - 1) % self.n)

    def check_once(self, seed: int) -> Mismatch | None:
        self.fill(seed)
        self()
        return self.verify(seed)
