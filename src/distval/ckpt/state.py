"""What a checkpoint holds besides tensors: per-rank RNG states (JSON, never pickled) and the
config fingerprint a resume has to match.

Fingerprint fields (must be equal to resume; a mismatch names each differing field): everything
that decides the numbers of the run — model, task, data, seed, the global batch (not how it is
split over ranks and micro-batches: the data position is global), and the LR schedule and
optimizer (lr, warmup, min LR ratio, weight decay, clip, total steps, precision). Recorded but
free to change: strategy and its options, world size, micro-batch, grad accumulation (the
portable full-form state loads into any of them; only the same ones resume bitwise)."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from typing import Any

import numpy as np
import torch

from distval import device as devices

# What a checkpoint must agree on to be resumed (the optimizer's fields by their own names, as
# checkpoints have always recorded them).
RUN_FIELDS = ("model", "task", "data", "seed", "steps", "precision")
OPTIM_FIELDS = ("lr", "warmup_steps", "min_lr_ratio", "weight_decay", "clip")


def fingerprint_fields(cfg: Any, world_size: int) -> dict[str, Any]:
    """`cfg`: a TrainConfig (its optimizer part in `cfg.optim`)."""
    values = {name: getattr(cfg, name) for name in RUN_FIELDS}
    values.update({name: getattr(cfg.optim, name) for name in OPTIM_FIELDS})
    values["global_batch"] = cfg.global_batch_for(world_size)
    return values


def fingerprint(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'lr 0.003 (checkpoint) vs 0.001 (this run)' for every field that differs."""
    return [f"{k} {saved.get(k)!r} (checkpoint) vs {current.get(k)!r} (this run)"
            for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode()


def _tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def rng_state(device: torch.device) -> dict[str, Any]:
    """Python, NumPy, torch CPU (and this rank's CUDA device) generator states, as JSON values."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    out: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
    }
    cuda = devices.rng_state(device)
    if cuda is not None:
        out["cuda"] = _b64(cuda)
    return out


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_tensor(state["torch"]))
    if "cuda" in state:
        devices.set_rng_state(_tensor(state["cuda"]), device)
