"""Gradient buckets, shared by bucket_ddp_async, zero1 and zero2 (and sized as torch's DDP does).

`--bucket-mb` is in MiB everywhere, as torch's `bucket_cap_mb`: the cap in bytes is
int(bucket_mb × 2^20), converted once (`StrategyConfig.bucket_bytes`), so the same flag gives our
strategies and pytorch_ddp the same cap and the planner models that cap.
"""

from __future__ import annotations

from torch import nn


def plan_buckets(params: list[nn.Parameter], cap_bytes: int) -> list[list[nn.Parameter]]:
    """Reverse registration order (the order backward produces gradients, as DDP assumes), a new
    bucket when the next parameter would pass the cap (a parameter larger than the cap gets a
    bucket of its own)."""
    buckets: list[list[nn.Parameter]] = []
    size = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if not buckets or size + nbytes > cap_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets
