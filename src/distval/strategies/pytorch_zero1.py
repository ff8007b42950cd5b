"""pytorch_zero1: torch's ZeroRedundancyOptimizer over DistributedDataParallel.

DDP all-reduces the full gradients (through distval's comm hook, so those bytes are counted, see
pytorch_ddp); ZeroRedundancyOptimizer partitions the optimizer state by handing whole parameter
tensors to ranks (a greedy balance by size, so shards are only as even as the tensor sizes allow)
and after its local step broadcasts each parameter from its owner. Those broadcasts are torch's
own collectives and bypass the layer: the counted traffic is DDP's all-reduce only.

Per rank (fp32 Adam): parameters 4Ψ + gradients 4Ψ + Adam 8·(the parameters this rank owns),
8Ψ/N when the partition is even.
"""

from typing import Any, Iterator

import torch

from distval.strategies.base import optimizer_state_like
from distval.strategies.pytorch_ddp import PytorchDDP


class PytorchZero1(PytorchDDP):
    name = "pytorch_zero1"
    counts_all_comm = False  # the owners' parameter broadcasts bypass the layer
    plan_model = "zero1"

    def build_optimizer(self, optimizer_class: type[torch.optim.Optimizer], **kwargs: Any) -> torch.optim.Optimizer:
        from torch.distributed.optim import ZeroRedundancyOptimizer  # 0.8 s of imports: only when used

        self.zero = ZeroRedundancyOptimizer(self.model.parameters(), optimizer_class=optimizer_class,
                                            process_group=self.comm.group, **kwargs)
        return self.zero

    def _owned_state(self) -> dict[torch.Tensor, dict[str, torch.Tensor]]:
        return self.zero.optim.state

    def model_state_tensors(self, optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
        """Parameters, gradients, and the Adam state of the parameters this rank owns (held by
        the wrapped local optimizer, not the ZeroRedundancyOptimizer itself)."""
        return super().model_state_tensors(self.zero.optim)

    def expected_model_state_bytes(self, optimizer: torch.optim.Optimizer) -> int:
        psi = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        return 8 * psi + 8 * psi // self.world_size

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Each parameter's Adam moments are broadcast from the rank that owns it."""
        local = self._owned_state()
        device = next(self.model.parameters()).device  # where the collectives run (NCCL: the GPU)
        step = next((st["step"] for st in local.values() if st), torch.zeros(()))
        step = step.detach().to(device=device, dtype=torch.float32, copy=True).reshape(1)
        self.comm.all_reduce(step, "max")  # ranks that own nothing learn the step; 0: nobody has stepped
        optim = {}
        if float(step) > 0:
            for name, p in self.model.named_parameters():
                st = local.get(p)
                moments = {k: st[k].clone() if st else torch.empty_like(p) for k in ("exp_avg", "exp_avg_sq")}
                for t in moments.values():
                    self.comm.broadcast(t, src=self.zero._param_to_rank[p])
                optim[name] = {"step": step.reshape(()).to("cpu", copy=True), **moments}
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()}, "optim": optim}

    def load_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        params = dict(self.model.named_parameters())
        local = self._owned_state()
        local.clear()
        for name, st in state["optim"].items():
            p = params[name]
            if self.zero._param_to_rank[p] == self.comm.rank:
                local[p] = optimizer_state_like(self.zero.optim, p, st)
