"""Presets the planner (and the training harness) share: model architectures, links, devices.

Models are architecture facts only (no weights, nothing downloaded): the published config of each
model (Hugging Face `config.json`: `n_layer`/`num_hidden_layers`, `n_embd`/`hidden_size`,
`n_head`/`num_attention_heads`, `num_key_value_heads`, `intermediate_size`, `vocab_size`,
`tie_word_embeddings`). Parameter counts are computed from the shapes, not stored; the tests check
them against the published totals (GPT-2 124,439,808; SmolLM2-135M 134,515,008; Llama-2-7B
6,738,415,616; Llama-2-70B 68,976,648,192).

distval's own workload presets (the Llama-style decoder of the training harness: RMSNorm, RoPE,
SwiGLU, grouped-query attention, tied embeddings, no biases, no dropout):
  tiny   2 layers, hidden 64, 4 heads, 2 kv heads, seq 64, vocab 256, ffn 192
  small  6 layers, hidden 384, 6 heads, 2 kv heads, seq 256, vocab 8192, ffn 1024 (12.6M params)
with the SwiGLU width from Llama's rule `swiglu_ffn(hidden)`: 8/3·hidden rounded up to a
multiple of 64.

Links: the per-rank, per-direction data rate in decimal GB/s (1e9 B/s) and an assumed per-message
latency α. Rates are line rates (Ethernet/IB/RoCE: Gbit/s ÷ 8; PCIe x16: 16 or 32 GT/s × 16 lanes
× 128/130 ÷ 8; NVLink3 600 GB/s and NVLink4 900 GB/s bidirectional per GPU → 300 and 450 per
direction; MI300X xGMI 7 links × 64 GB/s = 448). The planner multiplies the rate by an efficiency
(default 0.85, the usual back-of-envelope "~85% effective"). The latencies are typical orders of magnitude (TCP
through the kernel ~30-50 µs; RDMA ~5 µs; NVLink/xGMI/PCIe a few µs), not facts: calibrate them
with `distval comm bench` and `plan --calibration`.

Devices: dense bf16 tensor peak (TFLOP/s, datasheet, no sparsity) and memory per device (GiB as
marketed). RTX 4070: 58.3 TFLOP/s is the bf16 rate with fp32 accumulation, half of GeForce's
fp16-accumulate rate (116.6), since training accumulates in fp32. `cpu` has no datasheet: its
peak is measured (an fp32 matmul on this host) and its memory is this host's RAM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 2**30


def swiglu_ffn(hidden_size: int, multiple_of: int = 64) -> int:
    """Llama's SwiGLU width: int(8/3·hidden) rounded up to a multiple of `multiple_of`."""
    width = int(8 * hidden_size / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape. `mlp` is "swiglu" (gate, up, down: 3 matrices) or
    "gelu" (fc, proj: 2); `norm` "rmsnorm" (weight) or "layernorm" (weight and bias);
    `max_positions` set means learned position embeddings (GPT-2), None means RoPE."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    seq_len: int
    vocab_size: int
    ffn_hidden_size: int
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    bias: bool = False
    tied_embeddings: bool = True
    max_positions: int | None = None
    dropout: bool = False

    def __post_init__(self) -> None:
        for flag, value in (("--layers", self.num_layers), ("--hidden", self.hidden_size), ("--heads", self.num_heads),
                            ("--kv-heads", self.num_kv_heads), ("--seq", self.seq_len), ("--vocab", self.vocab_size),
                            ("ffn width", self.ffn_hidden_size)):
            if value < 1:
                raise ValueError(f"{flag} must be at least 1 (got {value})")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"--heads {self.num_heads} does not divide --hidden {self.hidden_size}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"--kv-heads {self.num_kv_heads} does not divide --heads {self.num_heads}")
        if self.max_positions is not None and self.seq_len > self.max_positions:
            raise ValueError(f"--seq {self.seq_len} exceeds {self.name}'s {self.max_positions} learned positions")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def matrices(self) -> list[tuple[int, int, int]]:
        """(rows, cols, how many) of every weight matrix: per layer q, k, v, o and the MLP, then
        the token embedding and, untied, the output head."""
        h, kv, f, n = self.hidden_size, self.kv_size, self.ffn_hidden_size, self.num_layers
        out = [(h, h, 2 * n), (h, kv, 2 * n), (h, f, (3 if self.mlp == "swiglu" else 2) * n), (self.vocab_size, h, 1)]
        if not self.tied_embeddings:
            out.append((self.vocab_size, h, 1))
        if self.max_positions:
            out.append((self.max_positions, h, 1))
        return out

    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def layer_params(self) -> int:
        h, kv, f = self.hidden_size, self.kv_size, self.ffn_hidden_size
        attn = 2 * h * h + 2 * h * kv + ((2 * h + 2 * kv) if self.bias else 0)
        if self.mlp == "swiglu":
            mlp = 3 * h * f + ((2 * f + h) if self.bias else 0)
        else:
            mlp = 2 * h * f + ((f + h) if self.bias else 0)
        return attn + mlp + 2 * self.norm_params()

    def root_params(self) -> int:
        """Everything outside the layers: embeddings (token, learned positions), final norm,
        untied head. ZeRO-3/FSDP shard it as one more unit."""
        emb = self.vocab_size * self.hidden_size + (self.max_positions or 0) * self.hidden_size
        head = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return emb + self.norm_params() + head

    def num_params(self) -> int:
        return self.num_layers * self.layer_params() + self.root_params()

    def attention_flops_per_token(self, seq_len: int | None = None) -> int:
        """The 12·L·H·Q·T term of the training FLOPs per token (docs/plan.md "Compute", PaLM convention)."""
        return 12 * self.num_layers * self.hidden_size * (seq_len or self.seq_len)

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token: 6·N + 12·L·H·Q·T."""
        return 6 * self.flop_params() + self.attention_flops_per_token(seq_len)

    def flop_params(self) -> int:
        """N of the 6·N FLOPs per token (PaLM / nanoGPT convention): the parameters that take part
        in matmuls, i.e. the layers, the final norm and the output projection V·h (the tied token
        embedding counts once, as the head); input embedding lookups and positions do not."""
        return self.num_layers * self.layer_params() + self.norm_params() + self.vocab_size * self.hidden_size


def _llama(
    name: str, layers: int, hidden: int, heads: int, kv: int, seq: int, vocab: int, ffn: int, tied: bool
) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv, seq, vocab, ffn, tied_embeddings=tied)


def _gpt2(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, heads, 1024, 50257, 4 * hidden, mlp="gelu", norm="layernorm",
                     bias=True, tied_embeddings=True, max_positions=1024, dropout=True)


MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    _llama("tiny", 2, 64, 4, 2, 64, 256, swiglu_ffn(64), True),
    _llama("small", 6, 384, 6, 2, 256, 8192, swiglu_ffn(384), True),
    _gpt2("gpt2", 12, 768, 12),
    _gpt2("gpt2-medium", 24, 1024, 16),
    _gpt2("gpt2-large", 36, 1280, 20),
    _gpt2("gpt2-xl", 48, 1600, 25),
    # SmolLM2: trained at 2048 tokens (later configs extend max_position_embeddings to 8192).
    _llama("smollm2-135m", 30, 576, 9, 3, 2048, 49152, 1536, True),
    _llama("smollm2-360m", 32, 960, 15, 5, 2048, 49152, 2560, True),
    _llama("smollm2-1.7b", 24, 2048, 32, 32, 2048, 49152, 8192, True),
    # Llama-2 shapes (LLaMA-1 7B is the same with a 2048 context; there is no LLaMA-1 70B).
    _llama("llama-7b", 32, 4096, 32, 32, 4096, 32000, 11008, False),
    _llama("llama-70b", 80, 8192, 64, 8, 4096, 32000, 28672, False),
)}


@dataclass(frozen=True)
class LinkSpec:
    name: str
    gbps: float  # per rank, per direction, decimal GB/s, line rate (a mesh: over all its links)
    latency_us: float  # assumed per-message latency α
    kind: str
    mesh_links: int = 0  # a fully connected mesh (AMD's xGMI): links per device, one per peer; 0: a switch

    def rate_gbps(self, peers: int | None) -> float:
        """What one device can send to `peers` others at once: through a switch (NVSwitch, a NIC)
        the whole rate, in a mesh only the links to those peers (4 of 8 MI300X reach 3 of their 7)."""
        if not self.mesh_links or peers is None:
            return self.gbps
        return self.gbps * min(max(peers, 1), self.mesh_links) / self.mesh_links


LINKS: dict[str, LinkSpec] = {s.name: s for s in (
    LinkSpec("1GbE", 0.125, 50.0, "ethernet"),
    LinkSpec("2.5GbE", 0.3125, 50.0, "ethernet"),
    LinkSpec("10GbE", 1.25, 30.0, "ethernet"),
    LinkSpec("25GbE", 3.125, 20.0, "ethernet"),
    LinkSpec("100G-RoCE", 12.5, 5.0, "roce"),
    LinkSpec("100G-IB", 12.5, 5.0, "infiniband"),
    LinkSpec("200G-RoCE", 25.0, 5.0, "roce"),
    LinkSpec("200G-IB", 25.0, 5.0, "infiniband"),
    LinkSpec("400G-RoCE", 50.0, 5.0, "roce"),
    LinkSpec("400G-IB", 50.0, 5.0, "infiniband"),
    LinkSpec("PCIe4", 31.5, 3.0, "pcie"),
    LinkSpec("PCIe5", 63.0, 3.0, "pcie"),
    LinkSpec("NVLink3", 300.0, 2.0, "nvlink"),
    LinkSpec("NVLink4", 450.0, 2.0, "nvlink"),
    LinkSpec("xGMI", 448.0, 2.0, "xgmi", mesh_links=7),  # MI300X/MI325X: 7 links x 64 GB/s per direction
    LinkSpec("xGMI-MI355X", 535.5, 2.0, "xgmi", mesh_links=7),  # MI355X: 7 links x 153 GB/s both ways (76.5 each)
)}


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    peak_tflops: float | None  # dense bf16; None: measure (cpu)
    memory_bytes: int | None  # per device; None: this host's RAM (cpu)
    fabric: str | None = None  # the link preset between the devices of one node (the plan's default intra link)
    fp8_tflops: float | None = None  # dense fp8, where the datasheet gives it
    memory_tbps: float | None = None  # peak memory bandwidth, TB/s


DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (
    DeviceSpec("RTX-4070", 58.3, 12 * GIB, "PCIe4"),
    DeviceSpec("L4", 121.0, 24 * GIB, "PCIe4"),
    DeviceSpec("A100", 312.0, 80 * GIB, "NVLink3"),
    DeviceSpec("H100", 989.0, 80 * GIB, "NVLink4"),
    DeviceSpec("H200", 989.0, 141 * GIB, "NVLink4"),
    # AMD Instinct (docs/plan.md cites each figure): an 8-GPU node is a fully connected xGMI mesh
    DeviceSpec("MI300X", 1307.4, 192 * GIB, "xGMI", fp8_tflops=2614.9, memory_tbps=5.3),
    DeviceSpec("MI325X", 1307.4, 256 * GIB, "xGMI", fp8_tflops=2614.9, memory_tbps=6.0),
    DeviceSpec("MI355X", 2516.6, 288 * GIB, "xGMI-MI355X", fp8_tflops=5033.2, memory_tbps=8.0),
    DeviceSpec("cpu", None, None),
)}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())


def lookup(table: dict, name: str, what: str):
    """A preset by name, ignoring case and separators ("RTX 4070", "rtx-4070", "400g_roce");
    ValueError listing the known names otherwise."""
    found = {_key(k): v for k, v in table.items()}.get(_key(name))
    if found is None:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(table)}")
    return found


def model(name: str) -> ModelSpec:
    return lookup(MODELS, name, "model preset (--model)")


def link(name: str, flag: str = "--link") -> LinkSpec:
    return lookup(LINKS, name, f"link preset ({flag})")


def device(name: str) -> DeviceSpec:
    return lookup(DEVICES, name, "device preset (--device)")


def device_named(reported: str) -> str | None:
    """The device preset a GPU's reported name is (torch.cuda.get_device_name: "NVIDIA H100 80GB
    HBM3" is H100), or None when no preset is in its name. The longest preset name that matches
    wins, so "H200" is never read as a shorter preset it contains."""
    words = reported.upper().replace("-", " ")
    found = [name for name in DEVICES if name != "cpu" and name.upper().replace("-", " ") in words]
    return max(found, key=len) if found else None


def preset_for(identity: dict | None) -> str | None:
    """The device preset of a GPU from `device.gpu_identity`: by its reported name, else (ROCm) by
    gfx target, compute units and memory where they single out one product; None when unknown."""
    if identity is None:
        return None
    found = device_named(identity["name"])
    if found is None and identity.get("arch"):
        from distval.rocm import platform

        product = platform.identify(identity["name"], identity["arch"], identity.get("compute_units"),
                                    identity.get("memory_bytes"))
        found = device_named(product) if product else None
    return found
