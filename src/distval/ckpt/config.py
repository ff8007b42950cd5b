"""What the user asked of checkpoints; validates itself, and `resolved()` is a new value with the
paths made absolute (the workers may start in another folder). torch-free."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from distval.knobs import FieldError, knob


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str | None = knob(None, "--ckpt-dir", help="Save checkpoints in this folder, created if missing "
                           "(docs/checkpointing.md).")  # None: no checkpoints
    every: int = knob(10, "--ckpt-every", help="Save every N steps, and after the last.")
    keep: int = knob(3, "--ckpt-keep", help="Keep the newest K checkpoints.")
    async_save: bool = knob(True, "--ckpt-async/--no-ckpt-async", help="Write checkpoints in a background thread.")
    resume: str | None = knob(None, help="auto (newest valid checkpoint in --ckpt-dir, none: step 0) or "
                              "a checkpoint folder.")

    def __post_init__(self) -> None:
        for name in ("every", "keep"):
            if getattr(self, name) < 1:
                raise FieldError(name, f"must be at least 1 (got {getattr(self, name)})")
        if self.resume == "auto" and not self.dir:
            raise FieldError("resume", "auto needs {dir} (where to look for checkpoints)")

    @property
    def enabled(self) -> bool:
        """The loop needs a checkpointer: to save, or to load."""
        return bool(self.dir or self.resume)

    def due(self, done: int, steps: int) -> bool:
        """A save after `done` optimizer steps of `steps`."""
        return bool(self.dir) and (done % self.every == 0 or done == steps)

    def journal_path(self, run_id: str) -> Path | None:
        """Where rank 0 keeps the journal of the run `run_id` (all its restart attempts)."""
        return Path(self.dir) / "runs" / f"{run_id}.json" if self.dir else None

    def resolved(self) -> CheckpointConfig:
        resume = self.resume if self.resume in (None, "auto") else str(Path(self.resume).resolve())
        return dataclasses.replace(self, dir=str(Path(self.dir).resolve()) if self.dir else None, resume=resume)
