"""What a job is given (`LaunchOptions`) and what it returns to the reporting process (`JobResult`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from distval import device as devices
from distval.health.hang import HangPolicy
from distval.rank import RankContext


@dataclass
class LaunchOptions:
    nproc: int | None = None  # local mode only; None = number of GPUs, else 2
    backend: str = "auto"
    expect_world: int | None = None
    timeout_s: float = 60.0  # each collective, and rendezvous
    deadline_s: float | None = None  # the whole local job; None = no limit beyond timeouts
    max_restarts: int = 0  # local mode: the elastic agent restarts all workers up to N times after a failure
    # local mode: the elastic agent's run id (workers see it as TORCHELASTIC_RUN_ID; it names the run
    # journal). Under torchrun/Slurm the outer launcher's (--rdzv-id) is used instead.
    run_id: str = field(default_factory=lambda: f"distval-{uuid.uuid4().hex[:12]}")
    # local mode: the hang watchdog's rule (health/hang.py); None: no watchdog
    hang: HangPolicy | None = field(default_factory=HangPolicy)
    # `distval launch` across nodes (torchrun's --nnodes, --rdzv-endpoint): one launcher per node,
    # meeting at the endpoint by c10d rendezvous under `run_id` (the same on every node)
    nnodes: int = 1
    rdzv_endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.nproc is not None and self.nproc < 1:
            raise ValueError(f"--nproc must be at least 1 (got {self.nproc})")
        if self.expect_world is not None and self.expect_world < 1:
            raise ValueError(f"--expect-world must be at least 1 (got {self.expect_world})")
        if self.timeout_s <= 0:
            raise ValueError(f"--timeout must be positive (got {self.timeout_s:g})")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"--deadline must be positive (got {self.deadline_s:g})")
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts must be 0 or more (got {self.max_restarts})")
        if self.nnodes < 1:
            raise ValueError(f"--nnodes must be at least 1 (got {self.nnodes})")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT, the same on every node "
                             f"(the first node's address and a free port)")
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"--rdzv-endpoint must be HOST:PORT (got {self.rdzv_endpoint!r}), e.g. node1:29400")
        self.backend = devices.check_backend(self.backend)


RankFn = Callable[[RankContext, Any], Any]


@dataclass
class JobResult:
    """What rank 0 gathered: every rank's return value and facts about it, in rank order."""

    mode: str
    backend: str
    world_size: int
    results: list[Any]
    ranks: list[dict[str, Any]]

    @property
    def hosts(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for info in self.ranks:
            out.setdefault(info["host"], []).append(info["rank"])
        return out
