"""Test- and drill-only faults: one grammar, one catalogue, read from DISTVAL_FAULT.

    DISTVAL_FAULT="op=all_reduce,rank=1,index=3,nth=2"         a collective's result corrupted
    DISTVAL_FAULT="op=broadcast,rank=0,action=hang"            a rank hung after a collective
    DISTVAL_FAULT="step=7,rank=1,action=kill,attempt=-1"       a rank killed at a training step
    DISTVAL_FAULT="step=7,rank=1,action=kill;op=any,rank=0,action=hang,nth=500"   several: `;`
    DISTVAL_FAULT="op=all_reduce,rank=1,action=skip,nth=40"       a rank skips one collective
    DISTVAL_FAULT="op=all_reduce,rank=1,action=reshape,nth=40"    a rank's one all_reduce in another shape

Where a fault fires, by its key:
  op=OP     after the `nth` call (0: every call) of collective OP ("any": every op) on the
            measured group completes on rank `rank` (a `Comm` finish hook the worker installs;
            the control group is never faulted)
  step=N    at the start of training step N on rank `rank`, in restart attempt `attempt`
            (TORCHELASTIC_RESTART_COUNT; default 0, the first attempt; -1: every attempt, a
            fault that comes back after each restart); `kill_in_save`: halfway through writing
            this rank's files of the first save at or after step N

The catalogue (ACTIONS: where each applies):
  corrupt       op     flip the lowest bit of element `index` of the op's outputs
  raise         both   raise RuntimeError (a crashing rank)
  hang          both   sleep forever (a hung rank)
  kill          both   SIGKILL this process (a rank lost without a word: OOM killer, dead host)
  sigterm       step   SIGTERM this rank (a preemption notice to one worker)
  sigterm_job   step   SIGTERM this rank's process group: the launcher and every worker
  kill_in_save  step   SIGKILL halfway through this rank's files of the next checkpoint save
  stop          both   SIGSTOP this process (a rank frozen: a debugger, a stopped container)
  spin          both   loop in Python forever (a rank stuck outside any collective)
  skip          both   op: the `nth` call, step: the first call of step N, is never handed to
                       the backend (a rank that skipped a collective)
  kill_in_op    step   the first all_reduce of step N is handed to the backend, then this
                       process is SIGKILLed while it is in flight (a rank that dies inside a
                       collective)
  slow          step   from step N on, this rank's compute of every step takes `percent`% longer
                       (a sleep inside the step: a straggler slowed by a known factor)
  throttle      step   from step N on, another process stops this one (SIGSTOP) 100·P/(100+P)
                       of every 100 ms and continues it (SIGCONT): a rank slowed from outside by
                       `percent`% wherever it is, in its collectives too (a CPU quota, a
                       throttled device)
  perturb       step   after step N's update, 1e-3 is added to this rank's first parameter (a
                       replica that drifted: a desync)
  grad_drift    step   from step N on, after the gradients' synchronisation, 1e-3 is added to this
                       rank's first gradient (a synchronisation that leaves the replicas'
                       gradients apart)
  nan           step   this rank's loss at step N is NaN (a bad batch, an overflow)
  leak          step   from step N on, this rank keeps `mib` MiB more every step (a memory leak)
  reshape       both   op: the `nth` all_reduce, step: the first all_reduce of step N, is issued
                       as the same bytes in another shape, (1, n), on this rank (a shape mismatch
                       the backend lets through, silently)
  slow_save     step   sleep `seconds` inside this rank's next checkpoint save (a slow disk:
                       real work, not a hang)
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.distributed as dist

from distval import envvars
from distval.comm.inputs import BITS_OF_SIZE

if TYPE_CHECKING:
    from distval.comm.layer import OpRecord

ENV = envvars.FAULT.name
ACTIONS = {"corrupt": ("op",), "raise": ("op", "step"), "hang": ("op", "step"), "kill": ("op", "step"),
           "sigterm": ("step",), "sigterm_job": ("step",), "kill_in_save": ("step",), "stop": ("op", "step"),
           "spin": ("op", "step"), "skip": ("op", "step"), "slow_save": ("step",), "reshape": ("op", "step"),
           "kill_in_op": ("step",), "slow": ("step",), "throttle": ("step",), "perturb": ("step",), "nan": ("step",),
           "leak": ("step",), "grad_drift": ("step",)}
# faults the training step asks about, not fired at its start
_IN_STEP = ("slow", "perturb", "nan", "leak", "grad_drift")
_AT_ISSUE = ("skip", "reshape", "kill_in_op")  # faults that act as the op is issued
_INT_FIELDS = ("rank", "index", "nth", "step", "attempt", "seconds", "percent", "mib")


def attempt_number() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


@dataclass(frozen=True)
class Fault:
    rank: int
    action: str
    op: str | None = None  # a collective fault ...
    step: int | None = None  # ... or a step fault
    index: int = 0
    nth: int = 0
    attempt: int = 0
    seconds: int = 10  # slow_save
    percent: int = 50  # slow, throttle
    mib: int = 4  # leak

    def __post_init__(self) -> None:
        if (self.op is None) == (self.step is None):
            raise ValueError(f"{ENV}: a fault names either op= (a collective) or step= (a training step)")
        where = "op" if self.op is not None else "step"
        if self.action not in ACTIONS:
            raise ValueError(f"{ENV} action {self.action!r}; choose from {', '.join(ACTIONS)}")
        if where not in ACTIONS[self.action]:
            raise ValueError(
                f"{ENV} action {self.action!r} applies to {' or '.join(ACTIONS[self.action])}=, not {where}="
            )
        if self.action == "reshape" and self.op not in (None, "all_reduce"):
            raise ValueError(f"{ENV} action {self.action!r} applies to op=all_reduce only")

    def armed(self, rank: int) -> bool:
        return rank == self.rank and self.attempt in (-1, attempt_number())


def parse(value: str | None) -> list[Fault]:
    """Every fault of a DISTVAL_FAULT value (empty: none)."""
    faults = []
    for spec in filter(None, (s.strip() for s in (value or "").split(";"))):
        fields: dict[str, object] = {"action": "corrupt"} if "op=" in spec else {}
        for part in spec.split(","):
            key, _, val = (x.strip() for x in part.partition("="))
            if key not in ("op", "action", *_INT_FIELDS):
                raise ValueError(f"{ENV}: unknown key {key!r} in {spec!r}")
            try:
                fields[key] = int(val) if key in _INT_FIELDS else val
            except ValueError:
                raise ValueError(f"{ENV}: {key}={val!r} is not a whole number") from None
        if "rank" not in fields:
            raise ValueError(f"{ENV}: {spec!r} names no rank=")
        faults.append(Fault(**fields))  # type: ignore[arg-type]
    return faults


class Faults:
    """This rank's faults: the collective ones as a `Comm` finish hook, the step ones asked at
    each step boundary and save."""

    def __init__(self, faults: list[Fault], rank: int):
        self.rank = rank
        self.on_ops = [f for f in faults if f.op is not None and f.armed(rank)]
        self.on_steps = [f for f in faults if f.step is not None and f.armed(rank)]
        self._hits = [0] * len(self.on_ops)
        self._next: str | None = None  # a step's fault for its next collective (skip) or all_reduce
        self._kept: list[torch.Tensor] = []  # a `leak` fault's

    @classmethod
    def from_env(cls, rank: int) -> Faults:
        return cls(parse(os.environ.get(ENV)), rank)

    def __bool__(self) -> bool:
        return bool(self.on_ops or self.on_steps)

    def before_op(self, rec: OpRecord, group: Any = None, device: Any = "cpu") -> bool:
        """The `Comm` issue hook: False vetoes this call (a `skip` fault's; a `reshape` fault's,
        which issues its mismatched collective on `group` instead)."""
        actions = [f.action for f in self._firing(rec.op, _AT_ISSUE)]
        if self._next is not None and (self._next == "skip" or rec.op == "all_reduce"):
            actions.append(self._next)
            self._next = None
        if "reshape" in actions or "kill_in_op" in actions:  # this fault issues the all_reduce itself
            shape = (1, math.prod(rec.shape)) if "reshape" in actions else rec.shape
            zeros = torch.zeros(shape, dtype=getattr(torch, rec.dtype), device=device)
            work = dist.all_reduce(zeros, group=group, async_op=True)
            if "kill_in_op" in actions:
                os.kill(os.getpid(), signal.SIGKILL)
            work.wait()
        return not actions

    def after_op(self, op: str, outputs: Sequence[torch.Tensor]) -> None:
        """The `Comm` finish hook."""
        for f in self._firing(op, tuple(a for a in ACTIONS if a not in _AT_ISSUE)):
            _act(f, outputs, f"at {op} on rank {self.rank}")

    def _firing(self, op: str, actions: tuple[str, ...]) -> list[Fault]:
        """The faults of these actions that fire at this call of `op` (each counts its calls)."""
        out = []
        for i, f in enumerate(self.on_ops):
            if f.action in actions and f.op in (op, "any"):
                self._hits[i] += 1
                if f.nth in (0, self._hits[i]):
                    out.append(f)
        return out

    def at_step(self, step: int) -> None:
        for f in self.on_steps:
            if f.step == step and f.action in _AT_ISSUE:
                self._next = f.action
            elif f.step == step and f.action not in ("kill_in_save", "slow_save", *_IN_STEP):
                _act(f, (), f"at step {step} on rank {self.rank}")

    def _in_step(self, action: str, step: int, from_on: bool = False) -> Fault | None:
        hit = (lambda f: step >= f.step) if from_on else (lambda f: step == f.step)
        return next((f for f in self.on_steps if f.action == action and hit(f)), None)

    def slowdown(self, step: int) -> float:
        """The share by which this step's compute is to be stretched (a `slow` fault), else 0."""
        f = self._in_step("slow", step, from_on=True)
        return f.percent / 100 if f else 0.0

    def poisoned(self, step: int) -> bool:
        """This step's loss is to be NaN (a `nan` fault)."""
        return self._in_step("nan", step) is not None

    def after_sync(self, step: int, module: torch.nn.Module) -> None:
        """After the gradients' synchronisation: a `grad_drift` fault's nudge."""
        if self._in_step("grad_drift", step, from_on=True):
            grad = next((p.grad for p in module.parameters() if p.grad is not None), None)
            if grad is not None:
                grad.view(-1)[0] += 1e-3

    def after_update(self, step: int, module: torch.nn.Module) -> None:
        """After the optimizer step: a `perturb` fault's drift, a `leak` fault's kept memory."""
        if self._in_step("perturb", step):
            with torch.no_grad():
                next(module.parameters()).view(-1)[0] += 1e-3
        f = self._in_step("leak", step, from_on=True)
        if f:
            self._kept.append(torch.ones(f.mib << 18))  # f.mib MiB of float32, touched

    def in_save(self, step: int) -> bool:
        """True when this save (the first one at or after the fault's step) must be killed mid-write.
        A `slow_save` fault sleeps here, once."""
        for f in [f for f in self.on_steps if f.action == "slow_save" and step >= f.step]:
            self.on_steps.remove(f)
            time.sleep(f.seconds)
        return any(f.action == "kill_in_save" and step >= f.step for f in self.on_steps)


def _act(f: Fault, outputs: Sequence[torch.Tensor], where: str) -> None:
    if f.action == "corrupt":
        corrupt(outputs, f.index)
    elif f.action == "raise":
        raise RuntimeError(f"{ENV}: injected failure {where}")
    elif f.action == "hang":
        while True:
            time.sleep(3600)
    elif f.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif f.action == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif f.action == "sigterm_job":
        os.killpg(os.getpgrp(), signal.SIGTERM)
    elif f.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif f.action == "spin":
        _spin()
    elif f.action == "throttle":
        throttle(os.getpid(), f.percent)


def throttle(pid: int, percent: int, period_s: float = 0.1) -> subprocess.Popen:
    """A process of its own that stops `pid` for period·P/(100+P) of every `period_s` (so it
    runs P% slower) until `pid` is gone, and never leaves it stopped when it ends on its own."""
    stop_s = period_s * percent / (100 + percent)
    code = ("import os, signal, sys, time\npid, stop, rest = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])\n"
            "try:\n    while True:\n        os.kill(pid, signal.SIGSTOP)\n        try:\n            time.sleep(stop)\n"
            "        finally:\n            os.kill(pid, signal.SIGCONT)\n        time.sleep(rest)\n"
            "except (ProcessLookupError, KeyboardInterrupt):\n    pass\n")
    return subprocess.Popen([sys.executable, "-c", code, str(pid), str(stop_s), str(period_s - stop_s)],
                            start_new_session=True, stdin=subprocess.DEVNULL)


def _spin() -> None:
    """Busy Python forever, holding no collective: what a rank stuck in a loop looks like."""
    n = 0
    while True:
        n = (n * 31 + 7) % 1_000_003


def corrupt(outputs: Sequence[torch.Tensor], index: int) -> None:
    """Flip the lowest bit of element `index`, counted across `outputs` in order: a change every
    dtype can represent, and the smallest one, so only an exact comparison catches it."""
    for out in outputs:
        n = out.numel()
        if index < n:
            flat = out.view(-1)
            bits = flat[index : index + 1].view(BITS_OF_SIZE[out.element_size()])
            bits ^= 1
            return
        index -= n
