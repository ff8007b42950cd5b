"""The decoder distval trains: a Llama-style transformer in plain PyTorch, built from a ModelSpec.

One class covers every preset in `distval.plan.presets`, so the planner's numbers and the trained
model describe the same shapes:

    Llama / SmolLM2 / tiny / small   RMSNorm, RoPE, SwiGLU MLP, grouped-query attention, no biases
    GPT-2                             LayerNorm, learned positions, GELU MLP, biases

Pre-norm residual blocks (x + attn(norm(x)), x + mlp(norm(x))), a final norm, and an output
projection that is the token embedding itself when `spec.tied_embeddings` (the same Parameter, so
it is counted, synchronized and sharded once). Attention is `scaled_dot_product_attention` with
`is_causal=True`; grouped-query attention lets each of the `num_kv_heads` key/value heads serve
`num_heads // num_kv_heads` query heads (`enable_gqa`). No dropout: every strategy must compute the
same thing as one process, so nothing random happens after initialization.

Initialization is deterministic and independent of the global RNG: modules are created on the meta
device (nothing is drawn), then every parameter is filled, in `named_parameters()` order, from a
local `torch.Generator` seeded with `seed`: weights N(0, 0.02), the residual output projections
N(0, 0.02/sqrt(2·layers)) (GPT-2's scaling), biases 0, norm weights 1.

With `num_classes` the model is a sequence classifier (HF `*ForSequenceClassification` layout):
the output projection is replaced by a bias-free `classifier` of shape [num_classes, hidden] that
reads the final hidden state of the last token ("last") or the mean over non-pad tokens ("mean").
The data module left-pads classification samples and ends each with EOS, so "last" always reads a
real token that has attended to the whole text.

Numerics under `torch.autocast(..., dtype=torch.bfloat16)`: the residual stream stays fp32
(embeddings are not autocast), norms compute in fp32, matmuls and attention run in bf16, and the
loss is taken on fp32 logits.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from distval.plan.presets import ModelSpec

INIT_STD = 0.02
ROPE_THETA = 10000.0
NORM_EPS = 1e-5
POOLINGS = ("last", "mean")


class Norm(nn.Module):
    """RMSNorm (weight only) or LayerNorm (weight and bias), computed in fp32 and cast back."""

    def __init__(self, size: int, kind: str) -> None:
        super().__init__()
        if kind not in ("rmsnorm", "layernorm"):
            raise ValueError(f"unknown norm {kind!r}; choose rmsnorm or layernorm")
        self.kind = kind
        self.weight = nn.Parameter(torch.empty(size))
        self.bias = nn.Parameter(torch.empty(size)) if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        if self.kind == "layernorm":
            out = F.layer_norm(h, h.shape[-1:], self.weight.float(), self.bias.float(), NORM_EPS)
        else:
            out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight.float()
        return out.type_as(x)


def rope_cos_sin(seq_len: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq_len, head_dim] for rotary embeddings in the "rotate half" layout
    (Hugging Face Llama): dimension i and i + head_dim/2 form one rotating pair."""
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, heads, T, head_dim] by position (fp32 math, result in x's dtype)."""
    h = x.float()
    half = h.shape[-1] // 2
    rotated = torch.cat([-h[..., half:], h[..., :half]], dim=-1)
    return (h * cos + rotated * sin).type_as(x)


class Embedding(nn.Embedding):
    """nn.Embedding without its own random init: `Decoder.init_weights` fills it (and on the meta
    device, nn.Embedding's normal_ would pull in torch's reference-op machinery, ~1 s)."""

    def reset_parameters(self) -> None:
        """Deliberately empty: `Decoder.init_weights` initialises the weights from its own generator."""


class Attention(nn.Module):
    """Causal multi-head attention with `num_kv_heads` key/value heads (grouped-query when fewer
    than `num_heads`); RoPE on q and k unless the model uses learned positions."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.use_rope = spec.max_positions is None
        h, kv = spec.hidden_size, spec.kv_size
        self.q_proj = nn.Linear(h, h, bias=spec.bias)
        self.k_proj = nn.Linear(h, kv, bias=spec.bias)
        self.v_proj = nn.Linear(h, kv, bias=spec.bias)
        self.o_proj = nn.Linear(h, h, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.use_rope:
            cos, sin = rope_cos_sin(seq, self.head_dim, x.device)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=self.num_kv_heads != self.num_heads)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class MLP(nn.Module):
    """SwiGLU (down(silu(gate(x)) * up(x)), Llama) or GELU (proj(gelu(fc(x))), GPT-2's tanh form)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.mlp not in ("swiglu", "gelu"):
            raise ValueError(f"unknown mlp {spec.mlp!r}; choose swiglu or gelu")
        self.kind = spec.mlp
        h, f = spec.hidden_size, spec.ffn_hidden_size
        if self.kind == "swiglu":
            self.gate_proj = nn.Linear(h, f, bias=spec.bias)
            self.up_proj = nn.Linear(h, f, bias=spec.bias)
        else:
            self.up_proj = nn.Linear(h, f, bias=spec.bias)
        self.down_proj = nn.Linear(f, h, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))


class Block(nn.Module):
    """One pre-norm transformer block: the unit FSDP / ZeRO-3 shard and gather."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.attn_norm = Norm(spec.hidden_size, spec.norm)
        self.attn = Attention(spec)
        self.mlp_norm = Norm(spec.hidden_size, spec.norm)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """Token embedding (+ learned positions), `blocks`, final norm, then the tied or untied output
    projection (language model) or a `classifier` head (sequence classification)."""

    def __init__(self, spec: ModelSpec, num_classes: int | None = None, pooling: str = "last",
                 pad_id: int | None = None) -> None:
        super().__init__()
        if num_classes is not None and num_classes < 2:
            raise ValueError(f"num_classes must be at least 2 (got {num_classes})")
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; choose {' or '.join(POOLINGS)}")
        if pooling == "mean" and pad_id is None:
            raise ValueError("mean pooling needs the pad_id to leave out")
        self.spec, self.num_classes, self.pooling, self.pad_id = spec, num_classes, pooling, pad_id
        self.tok_emb = Embedding(spec.vocab_size, spec.hidden_size)
        self.pos_emb = Embedding(spec.max_positions, spec.hidden_size) if spec.max_positions else None
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.num_layers))
        self.norm = Norm(spec.hidden_size, spec.norm)
        # Only heads that are used exist: an unused Parameter never gets a gradient, which breaks
        # DDP (unused-parameter error) and hangs hook-based strategies waiting for it.
        self.lm_head = (nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
                        if num_classes is None and not spec.tied_embeddings else None)
        self.classifier = nn.Linear(spec.hidden_size, num_classes, bias=False) if num_classes else None

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states [B, T, hidden] of tokens [B, T]."""
        seq = tokens.shape[1]
        if self.pos_emb is not None and seq > self.pos_emb.num_embeddings:
            raise ValueError(f"sequence of {seq} tokens exceeds {self.spec.name}'s {self.spec.max_positions} positions")
        x = self.tok_emb(tokens)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(seq, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] for a language model, [B, num_classes] for a classifier."""
        x = self.hidden_states(tokens)
        if self.classifier is not None:
            return self.classifier(self._pool(x, tokens))
        weight = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, weight)

    def _pool(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        if self.pooling == "last":
            return x[:, -1]
        keep = (tokens != self.pad_id).unsqueeze(-1).to(x.dtype)
        return (x * keep).sum(1) / keep.sum(1).clamp(min=1)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean cross-entropy of one micro-batch (fp32 scalar): next-token prediction over the
        T-1 shifted positions of `tokens`, or the class of each sample from `labels`. Every
        micro-batch has the same number of targets, so the mean over micro-batches of these means
        is the mean over the global batch (accumulation and data parallelism agree with one
        process)."""
        tokens = batch["tokens"]
        logits = self(tokens)
        if self.classifier is not None:
            if "labels" not in batch:
                raise ValueError("a classification model needs batch['labels']")
            return F.cross_entropy(logits.float(), batch["labels"])
        return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten())

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Fill every parameter from a local generator (the global RNG is neither read nor
        advanced); the same spec, head and seed give the same values on any machine."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        residual_std = INIT_STD / math.sqrt(2 * self.spec.num_layers)
        for name, param in self.named_parameters():
            if isinstance(self._owner(name), Norm):
                param.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else INIT_STD
                values = torch.empty(param.shape, dtype=param.dtype, device="cpu").normal_(0.0, std, generator=gen)
                param.copy_(values)

    def _owner(self, param_name: str) -> nn.Module:
        return self.get_submodule(param_name.rpartition(".")[0])


def build_model(spec: ModelSpec, seed: int = 0, num_classes: int | None = None, pooling: str = "last",
                pad_id: int | None = None, device: str | torch.device = "cpu") -> Decoder:
    """The decoder for `spec`, initialized from `seed` (see the module docstring). With
    device="meta" the model is returned uninitialized (for sharded initialization: `to_empty`,
    then `init_weights`)."""
    with torch.device("meta"):
        model = Decoder(spec, num_classes=num_classes, pooling=pooling, pad_id=pad_id)
    if torch.device(device).type == "meta":
        return model
    model.to_empty(device=device)
    model.init_weights(seed)
    return model


def count_params(model: nn.Module, non_embedding: bool = False) -> int:
    """Parameters of `model`, each shared Parameter once (a tied embedding counts once).

    For a language-model Decoder this equals `spec.num_params()`; with `non_embedding=True` it
    leaves out the lookup-only tables (learned positions, and the token embedding when untied,
    since then it does no matmul) and equals `spec.flop_params()`, the N of MFU's 6·N.
    """
    total = sum(p.numel() for p in model.parameters())
    if non_embedding and isinstance(model, Decoder):
        if model.pos_emb is not None:
            total -= model.pos_emb.weight.numel()
        if model.lm_head is not None or model.classifier is not None:
            total -= model.tok_emb.weight.numel()
    return total
