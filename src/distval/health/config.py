"""What the training health monitor (health/monitor.py) is asked to watch: torch-free, so the
command line reads its flags without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from distval.knobs import knob


@dataclass(frozen=True)
class HealthConfig:
    window: int = 50  # steps the straggler and leak statistics look at (and a straggler must persist)
    # a rank's compute over its peers' median, as a window median: a straggler ...
    slow_ratio: float = knob(1.15, "--straggler-ratio", help="A rank whose compute time stays this many times its "
                             "peers' median (over a 50-step window) is a straggler (docs/health.md).")
    min_loss: float = 0.05  # ... that costs the job at least this share of its step time, for `window` steps
    spike: float = 5.0  # a gradient norm above this × its running median: a WARN
    every: int = knob(50, "--check-replicas-every", help="Compare every rank's parameters bit for bit every N "
                      "steps (0: never).")
    # a launched script's probe (health/probe.py); `distval train` checks every step's loss and norm
    nan_every: int = knob(10, "--check-nan-every", help="Check every gradient and parameter for NaN/Inf every N "
                          "optimizer steps (1: every step; 0: never), read one step late on a GPU.")
    imbalance: float = 0.25  # a rank's peak memory above the ranks' median by this share: a WARN
    on_nan: str = knob("warn", "--on-nan", help="warn: a non-finite loss or gradient is a FAIL in the report; "
                       "stop: stop every rank before the update, naming the rank (nothing non-finite is saved).")

    def __post_init__(self) -> None:
        if self.window < 4:
            raise ValueError(f"the health window must be at least 4 steps (got {self.window})")
        if self.slow_ratio <= 1.0:
            raise ValueError(f"--straggler-ratio must be above 1 (got {self.slow_ratio:g}), e.g. 1.1")
        if self.nan_every < 0:
            raise ValueError(f"--check-nan-every must be 0 (off) or more (got {self.nan_every})")
        if self.every < 0:
            raise ValueError(f"--check-replicas-every must be 0 (off) or more (got {self.every})")
        if self.on_nan not in ("warn", "stop"):
            raise ValueError(f"--on-nan must be warn or stop (got {self.on_nan!r})")
