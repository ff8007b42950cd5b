"""What the training health monitor (health/monitor.py) is asked to watch: torch-free, so the
command line reads its flags without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from distval.knobs import FieldError, knob
from distval.stats import percentile
from distval.units import parse_duration


@dataclass(frozen=True)
class HealthConfig:
    window: int = knob(50, "--health-window", help="Steps the straggler and memory-growth rules look at: a "
                       "straggler must persist this many steps (and 8 s), a leak hold over two such windows.")
    # a rank's compute over its peers' median, as a window median: a straggler ...
    slow_ratio: float = knob(1.15, "--straggler-ratio", help="A rank whose compute time stays this many times its "
                             "peers' median (over a 50-step window) is a straggler (docs/health.md).")
    min_loss: float = knob(0.05, "--straggler-min-loss", help="... and costs the job at least this share of its step "
                           "time over the window.")
    spike: float = knob(5.0, "--grad-spike", help="A gradient norm above this many times its running median is a WARN.")
    replicas_every: int = knob(50, "--check-replicas-every", help="Compare every rank's parameters bit for bit "
                               "every N steps (0: never).")
    # a launched script's probe (health/probe.py); `distval train` checks every step's loss and norm
    nan_every: int = knob(10, "--check-nan-every", help="Check every gradient and parameter for NaN/Inf every N "
                          "optimizer steps (1: every step; 0: never), read one step late on a GPU.")
    imbalance: float = knob(0.25, "--memory-imbalance", help="A rank whose peak memory is this share above the ranks' "
                            "median (and 64 MiB) is a WARN.")
    on_nan: str = knob("warn", help="warn: a non-finite loss or gradient is a FAIL in the report; "
                       "stop: stop every rank before the update, naming the rank (nothing non-finite is saved).")

    def __post_init__(self) -> None:
        if self.window < 4:
            raise FieldError("window", f"must be at least 4 steps (got {self.window})")
        if self.slow_ratio <= 1.0:
            raise FieldError("slow_ratio", f"must be above 1 (got {self.slow_ratio:g}), e.g. 1.1")
        if self.nan_every < 0:
            raise FieldError("nan_every", f"must be 0 (off) or more (got {self.nan_every})")
        if self.replicas_every < 0:
            raise FieldError("replicas_every", f"must be 0 (off) or more (got {self.replicas_every})")
        if self.on_nan not in ("warn", "stop"):
            raise FieldError("on_nan", f"must be warn or stop (got {self.on_nan!r})")
        if not 0 <= self.min_loss < 1:
            raise FieldError("min_loss", f"must be a share from 0 to below 1 (got {self.min_loss:g}), e.g. 0.05")
        if self.spike <= 1:
            raise FieldError("spike", f"must be above 1 (got {self.spike:g}), e.g. 5")
        if self.imbalance <= 0:
            raise FieldError("imbalance", f"must be positive (got {self.imbalance:g}), e.g. 0.25")


HANG_AFTER_HELP = (
    "Look for a hang when no rank progresses for this long (at least; learned from the gaps between progress, "
    "x10), then name the culprit with every rank's stack. A stopped or dead rank, a skipped or mismatched "
    "collective, every rank waiting: ended at once. Ranks running outside any collective while the others wait (an "
    "evaluation or a save on rank 0 looks the same): named live, ended only past --hang-kill-after. off: no "
    "watchdog (local workers).")
HANG_KILL_HELP = (
    "End a job whose ranks have run outside any collective while the others waited for this long (default 10m, "
    "NCCL's own collective timeout: a healthy job's evaluation or save on one rank must not be killed; raised where "
    "this job already survived a longer pause at the same line).")


def _duration_or_off(text: str, flag: str) -> float | None:
    return None if text == "off" else parse_duration(text, flag)


@dataclass(frozen=True)
class HangPolicy:
    floor_s: float = knob(8.0, "--hang-after", parse=_duration_or_off, text="8s",
                          help=HANG_AFTER_HELP)
    factor: float = knob(10.0, "--hang-factor", help="A hang is declared past this many times the 90th percentile of "
                         "the gaps between progress seen lately (at least --hang-after).")
    startup_s: float = knob(120.0, "--hang-startup", parse=parse_duration, text="2m", help="Before the first progress "
                            "(rendezvous, data loading, the first step's compile): the allowance.")
    busy_s: float = knob(600.0, "--hang-busy", parse=parse_duration, text="10m", help="While a rank declares a long "
                         "phase (a checkpoint save) or compiles (torch.compile): the allowance.")
    # a pause (ranks outside any collective while the others wait: health/pauses.py) is ended
    # past this (--hang-kill-after): NCCL's default collective timeout, after which the backend
    # would end the job anyway
    kill_after_s: float = knob(600.0, "--hang-kill-after", parse=parse_duration, text="10m", help=HANG_KILL_HELP)

    def __post_init__(self) -> None:
        if not self.floor_s > 0:
            raise FieldError("floor_s", f"must be positive (got {self.floor_s:g} s), e.g. 30s")
        if not self.kill_after_s >= self.floor_s:
            raise FieldError("kill_after_s", f"must be at least {{floor_s}} ({self.floor_s:g} s; got "
                             f"{self.kill_after_s:g} s), e.g. 10m")
        if self.factor < 1:
            raise FieldError("factor", f"must be at least 1 (got {self.factor:g}), e.g. 10")
        if not (self.startup_s > 0 and self.busy_s > 0):
            raise FieldError("startup_s", f"and {{busy_s}} must be positive (got {self.startup_s:g} s and "
                             f"{self.busy_s:g} s), e.g. 2m and 10m")

    @classmethod
    def from_knobs(cls, **values: float | None) -> HangPolicy | None:
        """The policy the flags ask for; None (no watchdog) for `--hang-after off`."""
        if "floor_s" in values and values["floor_s"] is None:
            return None
        return cls(**values)

    def threshold(self, gaps: list[float], busy: bool, slop_s: float = 1.0, running: bool = False) -> float:
        """`gaps`: seconds between progress seen lately, each up to `slop_s` longer than the real
        gap (progress is sampled: the heartbeat's and the watchdog's intervals). `running`: progress
        was seen with every rank's process group up, though no gap could be measured yet (the
        watchdog came late): the floor, not the start-up allowance."""
        if not gaps:
            limit = self.floor_s + slop_s if running else self.startup_s
        else:
            limit = max(self.floor_s, self.factor * max(0.0, percentile(gaps, 90) - slop_s)) + slop_s
        return max(limit, self.busy_s) if busy else limit
