"""CUDA's device rule, enforced on a CPU-only machine: run strategy code with the model on the
`meta` device under `DevicePlacement("meta")` and every op that mixes devices raises, exactly where
it would raise on a GPU ("Expected all tensors to be on the same device ... cuda:0 and cpu!").

The rule (as CUDA's TensorIterator applies it): an op's tensors share one device, except that a
0-dim host tensor may join an op on the device (a CPU scalar). Copies between devices (`copy_`,
`.to()`) are explicit and allowed. Gloo's collectives on meta tensors are no-ops, so a real
multi-rank job can drive a strategy through its steps with no data at all."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_TRANSFERS = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default, torch.ops.aten._copy_from.default,
              torch.ops.aten._copy_from_and_resize.default}


class DevicePlacementError(RuntimeError):
    """An op mixed devices: where a GPU run would fail with the same message."""


class DevicePlacement(TorchDispatchMode):
    """Raise on any op whose tensors live on different devices (0-dim host tensors excepted).
    `ops` counts the ops checked, so a test can tell that the mode saw the work."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _TRANSFERS:
            tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
            if len(devices) > 1:
                raise DevicePlacementError(f"Expected all tensors to be on the same device, but found at least two "
                                           f"devices, {', '.join(sorted(map(str, devices)))}! ({func})")
            self.ops += 1
        return func(*args, **kwargs)
