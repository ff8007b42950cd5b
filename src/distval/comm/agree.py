"""Ranks agreeing on what happened to a step they all took.

A backend rejects an op/dtype combination it does not implement synchronously, on every rank,
before any data moves: that is a SKIP with the backend's own reason, and the group stays usable.
Anything else (a timeout, a closed connection, an error on only some ranks) is a real failure that
must end the job naming the rank, never a SKIP and never a silent desync. After each step every
rank contributes one small integer over the Gloo control group: its state and one flag (e.g.
"my result was wrong"), so all ranks also take the same next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch.distributed as dist

from distval.rank import PeerFailed, RankContext

_OK, _UNSUPPORTED, _FAILED = 0, 1, 2
_NOT_UNSUPPORTED = ("timed out", "timeout", "connection", "closed", "reset", "abort")


class Unsupported(Exception):
    """A combination distval itself declines, identically on every rank."""


def is_unsupported(error: BaseException) -> bool:
    """Does this error mean "the backend does not implement this", as opposed to a failure?"""
    if isinstance(error, Unsupported):
        return True
    if isinstance(error, getattr(dist, "DistBackendError", ())) or isinstance(error, PeerFailed):
        return False
    # c10 errors surface as RuntimeError, argument checks as ValueError; a TypeError, KeyError...
    # is a bug of ours and must never pass as a SKIP
    if not isinstance(error, (RuntimeError, ValueError, NotImplementedError)):
        return False
    return not any(word in str(error).lower() for word in _NOT_UNSUPPORTED)


@dataclass
class Agreed:
    result: Any
    skip_reason: str | None  # set when every rank's backend rejected the step
    any_flag: bool  # the flag was raised on at least one rank


def run_agreed(ctx: RankContext, step: Callable[[], Any], flag: Callable[[Any], bool] = lambda _: False) -> Agreed:
    result, error = None, None
    try:
        result = step()
    except Exception as e:  # classified below, re-raised unless every rank agrees it is a SKIP
        error = e
    state = _OK if error is None else (_UNSUPPORTED if is_unsupported(error) else _FAILED)
    mine = state * 2 + int(error is None and bool(flag(result)))
    try:
        everyone = ctx.exchange(mine)
    except Exception:
        # Peers are still inside the step's collectives and cannot answer: this rank's own
        # error is the cause, the failed exchange only its consequence.
        if error is not None:
            raise error from None
        raise
    states = [v // 2 for v in everyone]
    if any(st != _OK for st in states) and not all(st == _UNSUPPORTED for st in states):
        if error is not None:
            raise error
        failed = [r for r, st in enumerate(states) if st != _OK]
        raise PeerFailed(f"rank(s) {failed} failed while this rank did not")
    if error is not None:
        return Agreed(None, _one_line(error), False)
    return Agreed(result, None, any(v % 2 for v in everyone))


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]
