"""`--trace SKIP:N`: record N training steps after SKIP with torch.profiler and write one Kineto
trace per rank, `<dir>/rank_<r>.json.gz`, atomically (a reader never sees half a file).

Each step is marked twice: the profiler's own `ProfilerStep#N` (so HTA and every other tool
reads our traces) and `distval:step`, the exact region the harness times, which `trace
analyze` prefers when present so its step time is the harness's. The phases (`distval:data`,
`distval:forward`, `distval:backward`, `distval:grad_sync`, `distval:optimizer`,
`distval:checkpoint`) are record_function ranges; the model's FLOPs per step and the peak go
into the trace's metadata (key `distval`), so the analysis can give MFU.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from distval import envvars
from distval.trace.config import TraceConfig


def phase(name: str) -> Any:
    """A record_function range named distval:<name> (about a microsecond when not profiling)."""
    return record_function(f"distval:{name}")


class Tracer:
    """The profiler of one rank for one run: `step()` after every training step."""

    def __init__(self, cfg: TraceConfig, rank: int, device: torch.device, meta: dict[str, Any]):
        self.path = Path(cfg.dir) / f"rank_{rank}.json.gz"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        wait, warmup = (cfg.skip - 1, 1) if cfg.skip else (0, 0)
        with warnings.catch_warnings():  # no warm-up step when recording from the first: torch warns
            warnings.simplefilter("ignore")
            self.prof = profile(activities=activities, record_shapes=True,
                                schedule=schedule(wait=wait, warmup=warmup, active=cfg.active, repeat=1),
                                on_trace_ready=self._write)
            self.prof.preset_metadata_json("distval", json.dumps(meta))  # written when the profiler starts
            self.prof.start()

    def _write(self, prof: profile) -> None:
        tmp = self.path.with_name(f".tmp-{os.getpid()}-{self.path.name}")  # keeps .json.gz: written gzipped
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """The region the harness times as the step."""
        with record_function("distval:step"):
            yield

    def step(self) -> None:
        self.prof.step()

    def close(self) -> None:
        self.prof.stop()  # a recording cut short (the script ended early) is still written

    def follow_optimizer(self) -> Any:
        """For a script of the user's: a step is one `step()` of the first optimizer that steps
        (health/steps.py); returns the hook's handle."""
        from distval.health.steps import follow_first_optimizer

        return follow_first_optimizer(lambda optimizer: self.step())


ENV = envvars.TRACE.name  # `distval launch --trace`: SKIP:N:DIR for the shim of every worker


def from_env(rank: int) -> Tracer | None:
    """The profiler `distval launch --trace` asks the shim for, stepping with the script's optimizer."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    skip, active, folder = spec.split(":", 2)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tracer = Tracer(TraceConfig(int(skip), int(active), folder), rank, device,
                    {"world_size": int(os.environ.get("WORLD_SIZE", "1")), "steps": "optimizer"})
    tracer.follow_optimizer()
    return tracer
