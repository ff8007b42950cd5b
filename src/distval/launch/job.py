"""What a job's rank function is (`RankFn`); what a job returns to the reporting process is a
`JobResult` (results.py, below the collective layer and the launcher, which both type against it).
What it is given: launch/config.py's `LaunchOptions`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from distval.results import JobResult  # noqa: F401 (re-exported: what run() returns)

if TYPE_CHECKING:
    from distval.rank import RankContext


RankFn = Callable[["RankContext", Any], Any]
