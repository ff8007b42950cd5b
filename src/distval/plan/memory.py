"""Memory per rank, per strategy: model states, activations, communication buffers.

Model states (ZeRO, Rajbhandari et al. 2020, §3 and §5.1; docs/plan.md).
Ψ parameters, N ranks, p and g bytes per parameter and gradient element, K bytes of optimizer
state per parameter: Adam's two moments in the optimizer dtype (2·o) plus an fp32 master copy of
the parameters when they are held in 16 bits (4):

    ddp           (p + g + K)·Ψ
    zero1         (p + g)·Ψ + K·Ψ/N          optimizer state sharded
    zero2         p·Ψ + (g + K)·Ψ/N          and gradients
    zero3, fsdp   (p + g + K)·Ψ/N            and parameters

    mixed-precision Adam (p = g = 2, K = 4 + 2·4 = 12):  16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N
    fp32 Adam            (p = g = 4, K = 2·4 = 8):       16Ψ, 8Ψ + 8Ψ/N,  4Ψ + 12Ψ/N, 16Ψ/N

Activations of one micro-batch (accumulation runs micro-batches one after another), per token,
e bytes per activation (2 under 16-bit params/autocast, else 4), following Korthikanti et al.
2022 §4 ("Reducing Activation Recomputation in Large Transformer Models") for a block with h
hidden, kv = kv-heads × head dim, a heads, f ffn width, T tokens of context:

    saved for backward   norm inputs 2h, qkv input h, Q h, K and V 2kv, attention output h,
                         MLP: input h + 2f (GELU: fc output, GELU output) or + 3f (SwiGLU: gate,
                         up, their product)                              → e·(5h + 2kv + mlp)
    attention            eager: softmax probabilities e·a·T; flash: only the fp32 log-sum-exp 4a
    dropout (GPT-2)      dropped probabilities e·a·T, masks a·T + 2h (1 byte each)
    head and loss        final norm input e·h, logits e·V, fp32 log-softmax 4·V

For GPT-2 (kv = h, f = 4h, eager, dropout, e = 2) the block is 34·h + 5·a·T bytes per token,
Korthikanti's 34sbh + 5as²b. Full activation checkpointing keeps each block's input (e·h per
layer) and rebuilds one block at a time in backward: L·e·h + one block + head.

Buffers (transient, per rank): DDP copies gradients into its bucket buffers (PyTorch's default
gradient_as_bucket_view=False: a second Ψ·g), PowerSGD adds an error-feedback copy (Ψ·g);
ZeRO-1/2 stage two buckets for the reduce-scatter; ZeRO-3 holds two units unsharded (the one
computing and the prefetched one) and one unit's unsharded gradient; FSDP also keeps the root.
Not modelled: allocator fragmentation and caching, CUDA context (~0.5-1 GB), temporaries inside
kernels, framework state. So a rank *fits* when its total is at most 90% of the device memory
(`USABLE_FRACTION`; TorchTitan's estimator recommends a 10-20% margin).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distval.plan.config import STRATEGIES
from distval.plan.presets import ModelSpec
from distval.plan.steps import MIB, units

if TYPE_CHECKING:
    from distval.plan.model import Inputs

MASTER_COPY_BYTES = 4
USABLE_FRACTION = 0.9


def fits(total_bytes: float, device_bytes: float) -> bool:
    return total_bytes <= USABLE_FRACTION * device_bytes


def optimizer_bytes_per_param(param_bytes: int, optim_bytes: int) -> int:
    """Adam: two moments, plus an fp32 master copy when the parameters are 16-bit."""
    return 2 * optim_bytes + (MASTER_COPY_BYTES if param_bytes < 4 else 0)


def model_states(strategy: str, num_params: int, world_size: int, p: int, g: int, k: int) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per rank."""
    n, psi = world_size, num_params
    sharded = {"ddp": (False, False, False), "zero1": (False, False, True), "zero2": (False, True, True),
               "zero3": (True, True, True), "fsdp": (True, True, True)}[strategy]
    return tuple(psi * b / (n if s else 1) for b, s in zip((p, g, k), sharded))  # type: ignore[return-value]


def block_bytes_per_token(spec: ModelSpec, seq_len: int, e: int, attention: str) -> float:
    h, kv, a, f = spec.hidden_size, spec.kv_size, spec.num_heads, spec.ffn_hidden_size
    mlp = h + (3 * f if spec.mlp == "swiglu" else 2 * f)
    out = e * (5 * h + 2 * kv + mlp)
    out += e * a * seq_len if attention == "eager" else 4 * a
    if spec.dropout:
        out += (e * a * seq_len + a * seq_len if attention == "eager" else 0) + 2 * h
    return out


def head_bytes_per_token(spec: ModelSpec, e: int) -> float:
    return e * spec.hidden_size + e * spec.vocab_size + 4 * spec.vocab_size


def activations(spec: ModelSpec, seq_len: int, micro_batch: int, e: int, attention: str, checkpointed: bool) -> float:
    block = block_bytes_per_token(spec, seq_len, e, attention)
    layers = spec.num_layers * (e * spec.hidden_size if checkpointed else block) + (block if checkpointed else 0)
    return micro_batch * seq_len * (layers + head_bytes_per_token(spec, e))


def buffers(inp: "Inputs", strategy: str) -> float:
    psi, p, g, n = inp.model.num_params, inp.param_bytes, inp.grad_bytes, inp.world_size
    if n == 1:
        return 0.0
    if strategy == "ddp":
        return psi * g * (2 if inp.cfg.comm_hook == "powersgd" else 1)
    if strategy in ("zero1", "zero2"):
        return 2 * min(inp.cfg.bucket_mb * MIB, psi * g)
    counts = [c for _, c, _ in units(inp)]
    if strategy == "fsdp" and inp.model.spec is not None and len(counts) > 1:
        root, block = counts[0], max(counts[1:])  # the root stays unsharded between forward and backward
        return root * p + 2 * block * p + block * g
    largest = max(counts)
    return 2 * largest * p + largest * g


def memory_rows(inp: "Inputs") -> list[dict]:
    """One row per strategy with every figure of the `memory` table (None where unknown)."""
    spec, seq = inp.model.spec, inp.model.seq_len
    e = 2 if inp.param_bytes == 2 else 4
    k = optimizer_bytes_per_param(inp.param_bytes, inp.optim_bytes)
    act = {ckpt: activations(spec, seq, inp.micro_batch, e, inp.cfg.attention, ckpt) if spec is not None else None
           for ckpt in (False, True)}
    rows = []
    for strategy in STRATEGIES:
        params, grads, optim = model_states(
            strategy, inp.model.num_params, inp.world_size, inp.param_bytes, inp.grad_bytes, k
        )
        chosen_act = act[inp.cfg.activation_checkpointing]
        buf = buffers(inp, strategy)
        total = params + grads + optim + buf + (chosen_act or 0.0)
        rows.append({"strategy": strategy, "params_bytes": params, "grads_bytes": grads, "optimizer_bytes": optim,
                     "model_state_bytes": params + grads + optim, "activations_bytes": chosen_act,
                     "activations_no_ckpt_bytes": act[False], "activations_ckpt_bytes": act[True], "buffers_bytes": buf,
                     "total_bytes": total, "device_bytes": inp.memory_bytes, "fits": fits(total, inp.memory_bytes),
                     "chosen": strategy == inp.cfg.strategy})
    return rows
