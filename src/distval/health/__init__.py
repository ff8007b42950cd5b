"""Job health: the heartbeat and the hang watchdog (heartbeat.py, hang.py), pauses (pauses.py),
collective fingerprints (fingerprints.py), the plane at 1,000+ ranks: node digests and the leader
(digest.py), the training health monitor (monitor.py, config.py; its straggler rule stragglers.py,
the finding every detector reports findings.py) and its report (report.py), a script's steps and
probe under `distval launch` (steps.py, probe.py) and the launcher's monitor over them (script.py),
ranks slowed from outside (lost.py samples, slowed.py's rule judges), live OpenMetrics (metrics.py),
naming the rank that broke a job (diagnose.py), the same post mortem from Flight Recorder dumps
(frdump.py, postmortem.py) or torch.distributed.debug's stacks (debugstacks.py), and the test/drill
faults (faults.py)."""

from __future__ import annotations

from typing import Iterable


def ranks_text(ranks: Iterable[int]) -> str:
    """"rank 1" or "ranks 0, 2": how every health verdict names ranks."""
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def spans(ranks: Iterable[int]) -> str:
    """"0-2, 5, 7-1023": ranks as runs of consecutive numbers."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
