"""Metrics sinks: one `log(metrics, step)` interface, written by rank 0 as training goes.

JSONL: one JSON object per step, appended and flushed (a crash keeps every finished step).
TensorBoard: scalar event files through torch.utils.tensorboard (needs the optional
`tensorboard` package; asking for it without the package is a one-line error before any worker
starts). (The console's live view reads rank 0's steps from the rank channel: train/progress.py.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distval.train.config import MetricsConfig


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
