"""What a job is given: `LaunchOptions`, each knob a flag of the commands that launch ranks
(`LAUNCH`: the ones every such command takes). torch-free: the command line reads its flags."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from distval.health.config import HangPolicy
from distval.knobs import FieldError, knob, normalise
from distval.units import parse_duration


def _nnodes(text: str, flag: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{flag} must be a whole number of nodes (got {text!r}); elastic MIN:MAX ranges are "
                         f"not supported")
    return int(text)


@dataclass(frozen=True)
class LaunchOptions:
    """How a job's ranks are started and watched. Each knob is a flag of the commands that launch
    (cli/flags.py); `LAUNCH` are the ones every such command takes."""

    nproc: int | None = knob(None, help="Local workers to start (default: number of GPUs, else 2; "
                             "`doctor` starts none unless given, to probe the rendezvous and compare ranks). "
                             "Ignored under torchrun/Slurm.")
    backend: str = knob("auto", help="auto (nccl on CUDA, else gloo), gloo, nccl or mpi.")
    expect_world: int | None = knob(None, help="Fail fast unless the world has exactly N ranks "
                                    "(catches every process running alone).")
    timeout_s: float = knob(60.0, help="Per-collective and rendezvous timeout, e.g. 60s.",
                            parse=parse_duration, text="60s")
    deadline_s: float | None = knob(None, help="Stop the whole local job after this long, naming "
                                    "each rank's last status, e.g. 10m.", parse=parse_duration)
    max_restarts: int = knob(0, help="Restart every worker up to N times after a failure, each "
                             "time from the latest valid checkpoint where the job saves one (local; under torchrun "
                             "give it to torchrun); a hang ends the job.")
    # local mode: the elastic agent's run id (workers see it as TORCHELASTIC_RUN_ID; it names the run
    # journal). Under torchrun/Slurm the outer launcher's (--rdzv-id) is used instead.
    run_id: str = field(default_factory=lambda: f"distval-{uuid.uuid4().hex[:12]}")
    # local mode: the hang watchdog's rule (health/hang.py); None: no watchdog
    hang: HangPolicy | None = field(default_factory=HangPolicy)
    # `distval launch` across nodes (torchrun's --nnodes, --rdzv-endpoint): one launcher per node,
    # meeting at the endpoint by c10d rendezvous under `run_id` (the same on every node)
    nnodes: int = knob(1, help="Nodes of the job (as torchrun's): start one `distval launch` on each.",
                       parse=_nnodes, text="1")
    rdzv_endpoint: str | None = knob(None, help="HOST:PORT every node meets at (as torchrun's; "
                                     "--nnodes > 1).")
    fr_dumps: str | None = knob(None, help="On a hang verdict, keep every rank's Flight Recorder "
                                "dump in this folder, for `distval diagnose` (default with --json: beside the report, "
                                "as <report>.frdumps).")
    metrics_port: int | None = knob(None, help="Serve live OpenMetrics (Prometheus) from the "
                                    "launcher on this port (0: any free one): per-rank step time, wait, memory, "
                                    "heartbeat age, findings (docs/health.md).")

    def __post_init__(self) -> None:
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise FieldError("metrics_port", f"must be a TCP port, 0-65535 (got {self.metrics_port})")
        if self.nproc is not None and self.nproc < 1:
            raise FieldError("nproc", f"must be at least 1 (got {self.nproc})")
        if self.expect_world is not None and self.expect_world < 1:
            raise FieldError("expect_world", f"must be at least 1 (got {self.expect_world})")
        if self.timeout_s <= 0:
            raise FieldError("timeout_s", f"must be positive (got {self.timeout_s:g})")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise FieldError("deadline_s", f"must be positive (got {self.deadline_s:g})")
        if self.max_restarts < 0:
            raise FieldError("max_restarts", f"must be 0 or more (got {self.max_restarts})")
        if self.nnodes < 1:
            raise FieldError("nnodes", f"must be at least 1 (got {self.nnodes})")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise FieldError("nnodes", f"{self.nnodes} needs {{rdzv_endpoint}} HOST:PORT, the same on every node "
                             f"(the first node's address and a free port)")
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise FieldError("rdzv_endpoint", f"must be HOST:PORT (got {self.rdzv_endpoint!r}), e.g. node1:29400")
        from distval import device as devices  # torch: only once a job is asked for, not for --help

        normalise(self, backend=devices.check_backend(self.backend))


# the knobs every command that launches ranks takes (train adds --max-restarts, launch its own)
LAUNCH = ("nproc", "backend", "expect_world", "timeout_s", "deadline_s", "hang.floor_s", "hang.kill_after_s",
          "hang.factor", "hang.startup_s", "hang.busy_s", "metrics_port")
