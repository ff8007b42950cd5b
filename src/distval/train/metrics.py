"""Metrics sinks: one `log(metrics, step)` interface, written by rank 0 as training goes.

JSONL: one JSON object per step, appended and flushed (a crash keeps every finished step).
TensorBoard: scalar event files through torch.utils.tensorboard (needs the optional
`tensorboard` package; asking for it without the package is a one-line error before any worker
starts). (The console's live view reads rank 0's steps from the rank channel: train/progress.py.)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distval.knobs import FieldError, knob

READBACKS = ("auto", "now", "late")  # readback.py


@dataclass(frozen=True)
class MetricsConfig:
    log_jsonl: str | None = knob(None, help="Append one JSON line per step (rank 0).")
    tensorboard: str | None = knob(None, help="Write TensorBoard scalars to this folder.")
    readback: str = knob("auto", "--metrics-readback", help="When a step's loss, gradient norm and times reach the "
                         "host: late (one step on, so nothing in a step waits for the GPU), now (every step: a host "
                         "sync on a GPU), auto (late on a GPU, now on CPU).")

    def __post_init__(self) -> None:
        if self.readback not in READBACKS:
            raise FieldError("readback", f"must be auto, now or late (got {self.readback!r})")
        if self.tensorboard:
            try:
                import tensorboard  # noqa: F401
            except ImportError:
                raise FieldError("tensorboard", "needs the tensorboard package: pip install tensorboard") from None

    def resolved(self) -> MetricsConfig:
        """The paths made absolute: the workers may start in another folder."""
        paths = {k: getattr(self, k) for k in ("log_jsonl", "tensorboard")}
        return dataclasses.replace(self, **{k: str(Path(v).resolve()) for k, v in paths.items() if v})


class MetricsLogger:
    """Rank 0 logs into the sinks `cfg` names; every other rank (cfg None) into none."""

    def __init__(self, cfg: MetricsConfig | None):
        cfg = cfg or MetricsConfig()
        self._jsonl = open(cfg.log_jsonl, "a", encoding="utf-8") if cfg.log_jsonl else None
        self._tb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            Path(cfg.tensorboard).mkdir(parents=True, exist_ok=True)
            self._tb = SummaryWriter(log_dir=cfg.tensorboard)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._jsonl:
            self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
            self._jsonl.flush()
        if self._tb:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb:
            self._tb.flush()
            self._tb.close()
