"""Job health: the heartbeat and the hang watchdog (heartbeat.py, hang.py), collective
fingerprints (fingerprints.py), the training health monitor (monitor.py), a script's steps and
its stragglers under `distval launch` (steps.py), naming the rank that broke a job (diagnose.py)
and the test/drill faults (faults.py)."""

from __future__ import annotations

from typing import Iterable


def ranks_text(ranks: Iterable[int]) -> str:
    """"rank 1" or "ranks 0, 2": how every health verdict names ranks."""
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
