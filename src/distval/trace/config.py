"""What `--trace SKIP:N` asks for (no torch here: the command line builds it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TraceConfig:
    skip: int = 0
    active: int = 0
    dir: str | None = None  # the run's folder: rank_<r>.json.gz in it

    @property
    def enabled(self) -> bool:
        return self.active > 0 and self.dir is not None

    @staticmethod
    def parse(text: str, steps: int) -> tuple[int, int]:
        """'5:3' (skip 5 steps, record 3) or '3' (record the first 3)."""
        parts = text.split(":")
        try:
            skip, active = (0, int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
        except ValueError:
            raise ValueError(f"--trace {text!r}: give SKIP:N (e.g. 5:3, skip 5 steps then record 3) or N") from None
        if len(parts) > 2 or skip < 0 or active < 1:
            raise ValueError(f"--trace {text!r}: give SKIP:N with SKIP >= 0 and N >= 1")
        if skip + active > steps:
            raise ValueError(f"--trace {text!r}: records up to step {skip + active}, but the run has {steps} steps "
                             f"(raise --steps or lower SKIP:N)")
        return skip, active
