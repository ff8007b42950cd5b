"""fsdp2: PyTorch's FSDP2, `fully_shard` on each transformer block and then on the root.

Each parameter becomes a DTensor sharded on dim 0 over the ranks (padded to a multiple of N);
FSDP2 all-gathers a block's parameters before its forward and again before its backward, frees
them after, and reduce-scatters the gradients. `--mixed-precision bf16` computes with bf16
parameters and reduces gradients in fp32 (MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32)). Gradient accumulation: set_requires_gradient_sync(False) on the first
K-1 micro-batches keeps unsharded gradients locally, the last one reduce-scatters. FSDP2's
all-gathers and reduce-scatters go through the layer (FSDPModule.set_custom_all_gather and
_reduce_scatter, torch >= 2.8): counted, timed and watched like distval's own; the gradient norm's
all_reduce (DTensor's) is torch's own and not counted.

Per rank (fp32 Adam): sharded parameters, gradients and Adam moments, 16Ψ/N (+ padding of each
tensor's first dimension).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import torch
from torch import nn

from distval.comm.layer import Comm, FSDPAllGather, FSDPReduceScatter
from distval.strategies.base import Strategy, StrategyConfig, host_flat, initial_adam_state, optimizer_state_like


class FSDP2(Strategy):
    name = "fsdp2"
    params_sharded = True
    grads_replicated = False
    fused_optimizer = False  # its parameters are DTensor shards: the foreach AdamW
    counts_all_comm = False
    plan_model = "fsdp"
    overlaps_backward = True
    # torch's FSDP2 overlaps by running its all-gathers and reduce-scatters on side CUDA streams; on CPU
    # (Gloo) each is a blocking call in the training thread (_fsdp_collectives.foreach_reduce, unshard)
    overlaps_only_with_streams = True
    # with one rank in its group FSDP2 leaves out its all-gather path (copy-in, the call, copy-out):
    # compare's one-rank step costs add that work timed on a local group of N (train/worldcost.py)
    skips_work_at_world_1 = True

    @classmethod
    def check_options(cls, cfg: StrategyConfig) -> None:
        from distval import device as devices

        if cfg.mixed_precision == "bf16" and devices.bf16_unsupported():
            raise ValueError("--mixed-precision bf16: this GPU has no bf16 support; use --mixed-precision fp16")

    def __init__(self, model: nn.Module, comm: Comm, cfg: StrategyConfig):
        super().__init__(model, comm, cfg)
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        device = next(model.parameters()).device.type
        self.mesh = DeviceMesh.from_group(comm.group or dist.group.WORLD, device)
        policy = (
            MixedPrecisionPolicy(
                param_dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[cfg.mixed_precision],
                reduce_dtype=torch.float32,
            )
            if cfg.mixed_precision != "none"
            else MixedPrecisionPolicy()
        )
        units = [*getattr(model, "blocks", []), model]
        for unit in units:
            fully_shard(unit, mesh=self.mesh, mp_policy=policy)
        self.counted = hasattr(model, "set_custom_all_gather")
        for unit in units if self.counted else ():
            unit.set_custom_all_gather(FSDPAllGather(comm))
            unit.set_custom_reduce_scatter(FSDPReduceScatter(comm))

    @contextlib.contextmanager
    def micro_batch(self, is_last: bool) -> Iterator[None]:
        self.model.set_requires_gradient_sync(is_last)
        yield

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def full_parameters(self) -> torch.Tensor:
        return host_flat(p.full_tensor().detach() for p in self.model.parameters())

    def expected_comm_bytes_per_step(self, grad_accum: int) -> int | None:
        """Per micro-batch each unit's all-gather before its forward and, for the blocks (resharded
        after forward; the root keeps its parameters), again before its backward; one reduce-scatter
        per unit at the last micro-batch. A unit's collective moves its padded shards times N, in
        the parameter dtype (all-gathers) and the reduce dtype (fp32, reduce-scatters)."""
        if not self.counted:
            return None  # torch's own: not counted by the layer
        gathered = 2 if self.cfg.mixed_precision != "none" else 4
        blocks = [self.unit_elements(b) for b in getattr(self.model, "blocks", [])]
        root = self.unit_elements(self.model) - sum(blocks)
        return grad_accum * gathered * (root + 2 * sum(blocks)) + 4 * (root + sum(blocks))

    def unit_elements(self, unit: nn.Module) -> int:
        """The elements a unit's collectives move: each parameter's shard, padded to equal size, times N."""
        n = self.world_size
        return sum(n * math.ceil(p.shape[0] / n) * (p.numel() // p.shape[0]) for p in unit.parameters())

    def expected_model_state_bytes(self, optimizer: torch.optim.Optimizer) -> int:
        n = self.world_size
        return 16 * sum(math.ceil(p.shape[0] / n) * (p.numel() // p.shape[0]) for p in self.model.parameters())

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        names = {id(p): n for n, p in self.model.named_parameters()}
        model = {n: p.full_tensor().detach().clone() for n, p in self.model.named_parameters()}
        optim = {names[id(p)]: {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                                for k, v in st.items()} for p, st in optimizer.state.items() if st}
        return {"model": model, "optim": optim}

    def sharded_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The DTensor parameters and Adam moments themselves (`dcp.load` writes into them)."""
        state: dict[str, Any] = {}
        for name, p in self.model.named_parameters():
            st = optimizer.state[p]
            if not st:
                st.update(initial_adam_state(optimizer, p))
            state.update(
                {
                    f"{name}/param": p.data,
                    f"{name}/exp_avg": st["exp_avg"],
                    f"{name}/exp_avg_sq": st["exp_avg_sq"],
                    f"{name}/step": st["step"],
                }
            )
        return state

    def load_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.tensor import distribute_tensor

        params = dict(self.model.named_parameters())
        device = self.mesh.device_type

        def shard(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            return distribute_tensor(full.detach().to(device), self.mesh, p.placements)

        with torch.no_grad():
            for name, p in params.items():
                p.to_local().copy_(shard(state["model"][name], p).to_local())
        optimizer.state.clear()
        for name, st in state["optim"].items():
            p = params[name]
            placed = optimizer_state_like(optimizer, p, {"step": st["step"]})
            optimizer.state[p] = {k: placed[k] if k == "step" else shard(v, p) for k, v in st.items()}
