"""One prepared collective on this rank: its buffers, how to fill them with exact inputs, how to
issue it through `Comm`, and how to verify its output. `comm check` builds one per case and
root; `comm bench` builds one per (op, size, in-place) and issues it many times, then verifies.

Each collective is one record: its torch-free facts in `names.OP_SPECS` (`OpSpec`: in-place
forms, S and bus factors, root, reduce op) and its torch half here in `OP_IMPLS` (`OpImpl`: how
its buffers are made, its inputs filled, its expected output computed and the op issued);
`Collective` only follows the record. Adding a collective is adding one entry to each.

Sizes follow nccl-tests: `count` is the per-rank parameter count (for all_gather the per-rank
send count, for reduce_scatter the per-rank receive count, for all_to_all the per-peer count).
`size_bytes` is the S of nccl-tests' bandwidth formulas and `busbw_factor` its bus factor, so
algbw = S / t and busbw = algbw * factor (nccl-tests' conventions; docs/report-schema.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from distval.comm import names
from distval.comm.inputs import Mismatch, compare, input_kind, reduce_expected, values
from distval.comm.layer import Comm
from distval.comm.names import OP_SPECS, OpSpec

BENCH_OPS = names.BENCH_OPS
_POISON = 0x5A  # byte written over outputs before an op: an untouched output then fails almost everywhere


@dataclass(frozen=True)
class OpImpl:
    """How torch runs one collective. Each function takes the `Collective` being prepared."""

    buffers: Callable[[Collective], None]  # sets inp / out, or ins / outs for the list forms
    fill: Callable[[Collective, int], None]  # this rank's exact inputs for a seed
    expected: Callable[[Collective, int], torch.Tensor | None]  # None: this rank receives nothing
    issue: Callable[[Collective], None]  # the call through `Comm`


# -- buffers ------------------------------------------------------------------------------------


def _one_buffer(c: Collective) -> None:  # in place: input and output are one tensor
    c.inp = c.out = c.empty(c.count)


def _all_gather_buffers(c: Collective) -> None:
    n, k, r = c.n, c.count, c.rank
    c.out = c.empty(n * k)
    c.inp = c.out[r * k:(r + 1) * k] if c.inplace else c.empty(k)


def _reduce_scatter_buffers(c: Collective) -> None:
    n, k, r = c.n, c.count, c.rank
    c.inp = c.empty(n * k)
    c.out = c.inp[r * k:(r + 1) * k] if c.inplace else c.empty(k)


def _all_to_all_buffers(c: Collective) -> None:
    c.inp, c.out = c.empty(c.n * c.count), c.empty(c.n * c.count)


def _gathered_buffers(c: Collective) -> None:  # outputs on every rank, or on the root of a rooted op
    c.inp = c.empty(c.count)
    c.outs = [c.empty(c.count) for _ in range(c.n)] if (not c.spec.rooted or c.rank == c.root) else None


def _scatter_buffers(c: Collective) -> None:
    c.out = c.empty(c.count)
    c.ins = [c.empty(c.count) for _ in range(c.n)] if c.rank == c.root else None


def _pair_buffers(c: Collective) -> None:
    c.inp, c.out = c.empty(c.count), c.empty(c.count)


# -- inputs ---------------------------------------------------------------------------------------


def _fill_reduction(c: Collective, seed: int) -> None:  # inp holds 1 or n chunks
    c.inp.copy_(values(input_kind(c.redop), c.dtype, c.inp.numel(), c.rank, c.n, seed))


def _fill_bits(c: Collective, seed: int) -> None:  # broadcast: every rank (non-roots are overwritten)
    c.inp.copy_(c.data(c.rank, c.inp.numel(), seed))


def _fill_scatter(c: Collective, seed: int) -> None:
    if c.ins is not None:
        for j, chunk in enumerate(c.ins):
            chunk.copy_(c.data(c.rank, c.count, seed, offset=j * c.count))


# -- expected outputs, from (seed, rank, index) -------------------------------------------------


def _reduced(c: Collective, seed: int) -> torch.Tensor:
    return reduce_expected(c.redop, c.dtype, c.count, c.n, seed)


def _reduced_at_root(c: Collective, seed: int) -> torch.Tensor | None:
    return _reduced(c, seed) if c.rank == c.root else None


def _reduced_chunk(c: Collective, seed: int) -> torch.Tensor:
    return reduce_expected(c.redop, c.dtype, c.count, c.n, seed, offset=c.rank * c.count)


def _roots_data(c: Collective, seed: int) -> torch.Tensor:
    return c.data(c.root, c.count, seed)


def _every_ranks_data(c: Collective, seed: int) -> torch.Tensor | None:
    if c.outs is None and c.out is None:
        return None  # gather's non-roots
    return torch.cat([c.data(j, c.count, seed) for j in range(c.n)])


def _my_chunk_of_every_rank(c: Collective, seed: int) -> torch.Tensor:
    return torch.cat([c.data(j, c.count, seed, offset=c.rank * c.count) for j in range(c.n)])


def _my_chunk_of_root(c: Collective, seed: int) -> torch.Tensor:
    return c.data(c.root, c.count, seed, offset=c.rank * c.count)


def _left_neighbours_data(c: Collective, seed: int) -> torch.Tensor:
    return c.data((c.rank - 1) % c.n, c.count, seed)


OP_IMPLS: dict[str, OpImpl] = {
    "all_reduce": OpImpl(_one_buffer, _fill_reduction, _reduced, lambda c: c.comm.all_reduce(c.inp, c.redop)),
    "broadcast": OpImpl(_one_buffer, _fill_bits, _roots_data, lambda c: c.comm.broadcast(c.inp, c.root)),
    "reduce": OpImpl(_one_buffer, _fill_reduction, _reduced_at_root,
                     lambda c: c.comm.reduce(c.inp, c.root, c.redop)),
    "all_gather": OpImpl(_all_gather_buffers, _fill_bits, _every_ranks_data,
                         lambda c: c.comm.all_gather(c.out, c.inp)),
    "all_gather_list": OpImpl(_gathered_buffers, _fill_bits, _every_ranks_data,
                              lambda c: c.comm.all_gather_list(c.outs, c.inp)),
    "reduce_scatter": OpImpl(_reduce_scatter_buffers, _fill_reduction, _reduced_chunk,
                             lambda c: c.comm.reduce_scatter(c.out, c.inp, c.redop)),
    "all_to_all": OpImpl(_all_to_all_buffers, _fill_bits, _my_chunk_of_every_rank,
                         lambda c: c.comm.all_to_all(c.out, c.inp)),
    "gather": OpImpl(_gathered_buffers, _fill_bits, _every_ranks_data,
                     lambda c: c.comm.gather(c.inp, c.outs, c.root)),
    "scatter": OpImpl(_scatter_buffers, _fill_scatter, _my_chunk_of_root,
                      lambda c: c.comm.scatter(c.out, c.ins, c.root)),
    "sendrecv": OpImpl(_pair_buffers, _fill_bits, _left_neighbours_data,
                       lambda c: c.comm.sendrecv(c.inp, (c.rank + 1) % c.n, c.out, (c.rank - 1) % c.n)),
}
assert tuple(OP_IMPLS) == BENCH_OPS, "comm/names.py and comm/ops.py list the same ops"


def inplace_variants(op: str) -> tuple[bool, ...]:
    return OP_SPECS[op].inplace_forms


def busbw_factor(op: str, world_size: int) -> float:
    return names.bus_factor(op, world_size)


def count_for_bytes(op: str, size_bytes: int, elt: int, world_size: int) -> int:
    """nccl-tests' per-rank count for a sweep size given in bytes."""
    count = size_bytes // elt
    if OP_SPECS[op].divided:
        count = (count // world_size) & ~(max(16 // elt, 1) - 1)
    return count


class Collective:
    inp: torch.Tensor | None = None  # the input (reduce_scatter, all_to_all: n chunks)
    out: torch.Tensor | None = None  # the output (all_gather, all_to_all: n chunks)
    ins: list[torch.Tensor] | None = None  # scatter's per-rank inputs, on the root
    outs: list[torch.Tensor] | None = None  # all_gather_list's and gather's per-rank outputs

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
        self.spec: OpSpec = OP_SPECS[op]
        self.impl: OpImpl = OP_IMPLS[op]
        self.device = device
        n, rank = comm.world_size, comm.rank
        self.n, self.rank = n, rank
        self.size_bytes = self.spec.s_chunks(n) * count * dtype.itemsize
        self.busbw_factor = busbw_factor(op, n)
        self.impl.buffers(self)

    def empty(self, numel: int) -> torch.Tensor:
        return torch.empty(numel, dtype=self.dtype, device=self.device)

    def data(self, rank: int, numel: int, seed: int, offset: int = 0) -> torch.Tensor:
        """`rank`'s input for ops that only move data: random bit patterns."""
        return values("bits", self.dtype, numel, rank, self.n, seed, offset)

    def _outputs(self) -> list[torch.Tensor]:
        if self.outs is not None:
            return self.outs
        return [] if self.out is None else [self.out]

    def fill(self, seed: int) -> None:
        """Exact inputs for `seed`; outputs poisoned first, so an op that leaves its output
        untouched can never pass on stale data."""
        for out in self._outputs():
            out.view(torch.uint8).fill_(_POISON)
        self.impl.fill(self, seed)

    def verify(self, seed: int) -> Mismatch | None:
        """Compare this rank's output with the exact expected result (None on ranks that
        receive nothing, e.g. non-roots of reduce and gather)."""
        expected = self.impl.expected(self, seed)
        if expected is None:
            return None
        got = torch.cat([o.cpu() for o in self.outs]) if self.outs is not None else self.out.cpu()
        return compare(got, expected, 2 if self.spec.reduces and self.redop == "avg" else 0)

    def __call__(self) -> None:
        self.impl.issue(self)

    def check_once(self, seed: int) -> Mismatch | None:
        self.fill(seed)
        self()
        return self.verify(seed)
