"""Pauses: some ranks run outside any collective while the others wait in one.

From outside, that is what a hang looks like, and what nearly every healthy training script does
now and then: rank 0 alone evaluates (`if master_process: estimate_loss()`), saves a checkpoint
(`torch.save` of several GB), or reads a slow first shard, while its peers go on into the next
step's all_reduce and wait. A watchdog that ends a job on this evidence kills healthy jobs at
their first evaluation; one that never ends it lets a real infinite loop burn the allocation. So
the watchdog (hang.py) treats it as *uncertain*: it names the pause live (one stderr line within
the hang threshold, refreshed while it lasts), lets the job go on, and ends it only when the
evidence turns certain (the rank stops, dies, or starts waiting in another collective) or the
pause outlasts its kill limit: `--hang-kill-after` (10 min, the NCCL collective timeout's
default), raised for a call site where this job already survived a longer pause.

A pause's *site* is where its ranks were, as frames of their main thread outermost first: the
part every look at the pause shared (an evaluation loop's innermost frame moves from batch to
batch; the line that called `estimate_loss()` does not). A pause that ends is remembered by site
and length; the next one at the same site is expected: not announced until it lasts longer than
the longest one survived there. Without stacks (py-spy missing) every pause shares one site.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from distval.health import ranks_text

LOOK_EVERY_S = 3.0  # a pause in progress is diagnosed again (stacks included) this often
_SHIM = "distval/launch/shim.py"
_NOT_USER = ("torch/", "/lib/python3", "threading.py", "<frozen ", "runpy.py", _SHIM, "distval/comm/")


def user_frames(main_frames: list[str]) -> tuple[str, ...]:
    """The main thread's frames (innermost first, as py-spy prints them) that belong to the
    user's program (or distval's training loop) — not torch, not the standard library, not
    distval's launch shim or collective layer, nothing outside the shim (the launcher's fork
    server a script's rank was forked from) — outermost first."""
    frames = main_frames[::-1]
    shim = next((i for i, f in enumerate(frames) if _SHIM in f), 0)
    return tuple(f for f in frames[shim:] if not any(part in f for part in _NOT_USER))


def user_place(main_frames: list[str]) -> str:
    """The innermost frame of the user's program (`user_frames`) with its file by name:
    "estimate_loss (train.py:31)"; "" without one."""
    own = user_frames(main_frames)
    if not own:
        return ""
    fn, _, place = own[-1].rpartition(" (")
    return f"{fn} ({os.path.basename(place)}"


def _split(frame: str) -> tuple[str, str, str]:
    """"fn (file.py:12)" -> ("fn", "file.py", "12"); a site's line-less frame has line ""."""
    fn, _, place = frame.rpartition(" (")
    file, _, line = place.rstrip(")").rpartition(":")
    return (fn, file, line) if line.isdigit() else (fn, place.rstrip(")"), "")


def _same(site_frame: str, frame: str) -> bool:
    fn, file, line = _split(site_frame)
    other = _split(frame)
    return (fn, file) == other[:2] and (not line or line == other[2])


def site_of(samples: list[tuple[str, ...]]) -> tuple[str, ...]:
    """Where a pause is, from its looks: the frames of the program's own file (the outermost
    frame's) that every look shared, outermost first. The innermost of them is kept without its
    line (a loop's body moves from line to line between looks): `<module> (train.py:255)`,
    `estimate_loss (train.py)`. A lone frame keeps its line (the line that called
    `torch.save` is the site of a save)."""
    if not samples or not samples[0]:
        return ()
    own = _split(samples[0][0])[1]
    cut = [_own_prefix(s, own) for s in samples]
    site = cut[0]
    for s in cut[1:]:
        site = common_prefix(site, s)
    deeper = {_split(s[len(site)])[:2] for s in cut if len(s) > len(site)}
    if len(deeper) == 1 and all(len(s) > len(site) for s in cut):  # one function, at several lines
        fn, file = deeper.pop()
        return (*site, f"{fn} ({file})")
    if len(site) >= 2:
        fn, file, _ = _split(site[-1])
        return (*site[:-1], f"{fn} ({file})")
    return site


def _own_prefix(frames: tuple[str, ...], own: str) -> tuple[str, ...]:
    out = []
    for f in frames:
        if _split(f)[1] != own:
            break
        out.append(f)
    return tuple(out)


def in_site(frames: tuple[str, ...], site: tuple[str, ...]) -> bool:
    return len(frames) >= len(site) and all(_same(s, f) for s, f in zip(site, frames))


def common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


@dataclass
class Pause:
    culprits: list[int]
    waiting: str  # what the others wait in ("ranks 1, 2 wait in all_reduce #4 of group 0")
    started: float  # monotonic time of the last progress before it
    started_at: float  # the same instant, epoch seconds (for the report)
    where: str = ""  # the culprit's innermost frame of its own code at the last look, or its status
    samples: list[tuple[str, ...]] = field(default_factory=list)  # user frames at each look, outermost first
    length_s: float = 0.0
    expected_s: float | None = None  # the longest pause this job survived at this site
    announced_s: float = 0.0  # its length at the last live line (0: none yet)

    @property
    def site(self) -> tuple[str, ...]:
        return site_of(self.samples)

    def place(self) -> str:
        """Where the culprit is: its innermost frame, and the deepest stable frame around it
        ("MLP.forward (model.py:90), within estimate_loss (train.py)")."""
        around = [f for f in self.site if not (self.where and _same(f, self.where))]
        if self.where and around:
            return f"{self.where}, within {around[-1]}"
        return self.where or (self.site[-1] if self.site else "an unknown point")

    def line(self, stalled_s: float, kill_s: float) -> str:
        """The live line on stderr."""
        who = ranks_text(self.culprits)
        usual = f", longer than the {self.expected_s:.0f} s it took before there" if self.expected_s else ""
        return (f"distval: pause: {who} outside any collective for {stalled_s:.0f} s at {self.place()}{usual}; "
                f"{self.waiting}. Not a hang yet (an evaluation or a save on one rank looks like this): the job "
                f"goes on, and is ended at {_duration(kill_s)} (--hang-kill-after) or once the rank stops, dies or "
                f"waits in another collective")

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.culprits, "length_s": round(self.length_s, 1), "where": self.place(),
                "site": list(self.site), "waiting": self.waiting, "started_at": round(self.started_at, 3),
                "expected": self.expected_s is not None, "announced": self.announced_s > 0}


class Sites:
    """The pauses a job survived, by site: the longest at each, which makes the next pause there
    expected and raises its kill limit."""

    def __init__(self) -> None:
        self.longest: dict[tuple[str, ...], float] = {}

    def match(self, frames: tuple[str, ...]) -> tuple[str, ...] | None:
        """The remembered site `frames` lies in (the deepest that matches), or None."""
        found = [s for s in self.longest if in_site(frames, s)]
        return max(found, key=len) if found else None

    def survived(self, pause: Pause) -> None:
        known = self.match(pause.samples[0] if pause.samples else ())
        site = known if known is not None else pause.site
        self.longest[site] = max(self.longest.get(site, 0.0), pause.length_s)

    def expected(self, frames: tuple[str, ...]) -> float | None:
        site = self.match(frames)
        return None if site is None else self.longest[site]


def kill_limit(kill_after_s: float, expected_s: float | None) -> float:
    """A pause is ended past `--hang-kill-after`, or past twice the longest pause this job already
    survived at the same site, whichever is longer."""
    return max(kill_after_s, 2 * expected_s) if expected_s else kill_after_s


def due(pause: Pause, stalled_s: float) -> bool:
    """Whether the live line is due: at once, then from a minute on each time the pause has
    doubled (one line for an evaluation's pause; a few for a long one, not one a second); an
    expected pause only once it outlasts the longest survived at its site."""
    if pause.expected_s is not None and stalled_s <= pause.expected_s:
        return False
    return pause.announced_s == 0 or stalled_s >= max(60.0, 2 * pause.announced_s)


def check_rows(pauses: list[Pause]) -> tuple[str, dict[str, Any]]:
    """The summary and details of the report's WARN about the pauses a job survived."""
    longest = max(pauses, key=lambda p: p.length_s)
    more = f" ({len(pauses)} pauses, the longest above)" if len(pauses) > 1 else ""
    summary = (f"{ranks_text(longest.culprits)} ran outside any collective for {longest.length_s:.0f} s at "
               f"{longest.place()} while the others waited{more}; the job went on")
    return summary, {"pauses": [p.to_dict() for p in pauses]}


def _duration(seconds: float) -> str:
    if seconds >= 120 and seconds % 60 == 0:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
