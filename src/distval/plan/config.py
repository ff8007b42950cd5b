"""The planner's inputs: one typed dataclass that validates itself (FieldError naming the field,
and the flag on the command line).

Sizes: a `--model` preset, optionally overridden field by field (`--seq 512`), or an explicit
architecture (all of `--layers --hidden --heads --seq --vocab`; the shape is distval's Llama-style
decoder: SwiGLU ffn `swiglu_ffn(hidden)`, RMSNorm, tied embeddings, `--kv-heads` defaulting to
`--heads`), or `--params N` alone. With `--params` alone the communication and the model-state
memory are exact, compute needs `--seq` (6·N·tokens without the attention term) and activations
need the architecture; what cannot be computed is reported as such, never guessed. `--params`
next to a known architecture may correct its count by up to 10% (biases, extra norms); more is a
contradiction.

Batch: global batch = micro-batch × world size × gradient-accumulation steps; any two of them
(with the world size) determine the third, and all three must agree.

World: `--world N` is a flat network (every rank on the link given by `--link`/`--bandwidth`);
`--nodes M --devices-per-node D` is two-level (`--intra-link` inside a node, `--inter-link`
between nodes; `--link` sets both).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

from distval.knobs import FieldError, knob, normalise
from distval.plan import presets
from distval.plan.presets import ModelSpec

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
COMM_HOOKS = ("none", "bf16", "fp16", "powersgd")
DEFAULT_MFU = 0.4
_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_COUNT_MULT = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def dtype_name(text: str, flag: str) -> str:
    key = text.lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ValueError(f"{flag}: unknown dtype {text!r}; choose fp32, bf16 or fp16")
    return key


def parse_count(text: str, flag: str = "--params") -> float:
    """'760e6', '760M', '1.5B', '7b' -> a parameter count (decimal suffixes K, M, B, T)."""
    m = _COUNT.match(str(text))
    if not m:
        raise ValueError(f"{flag} {text!r} does not parse as a count; use e.g. 760e6, 760M or 1.5B")
    value = float(m.group(1)) * _COUNT_MULT[m.group(2).lower()]
    if value < 1:
        raise ValueError(f"{flag} must be at least 1 (got {text})")
    return value


@dataclass(frozen=True)
class ModelInfo:
    """What the model is, as far as the inputs say: `spec` None means only a count is known."""

    name: str
    num_params: int
    flop_params: int
    seq_len: int | None
    spec: ModelSpec | None


@dataclass(frozen=True)
class PlanConfig:
    """The planner's inputs. Each knob is a flag of `distval plan` (cli/flags.py)."""

    model: str | None = knob(None, help="Model preset: gpt2, gpt2-medium, gpt2-large, gpt2-xl, "
                             "smollm2-135m, smollm2-360m, smollm2-1.7b, llama-7b, llama-70b, tiny, small.")
    params: float | None = knob(None, parse=parse_count, help="Parameter count, e.g. 760e6, 760M, "
                                "1.5B (alone, or correcting a preset by up to 10%).")
    num_layers: int | None = knob(None, "--layers", help="Transformer blocks.")
    hidden_size: int | None = knob(None, "--hidden", help="Hidden size.")
    num_heads: int | None = knob(None, "--heads", help="Attention heads.")
    num_kv_heads: int | None = knob(None, "--kv-heads", help="Key/value heads (grouped-query attention; default "
                                    "--heads).")
    seq_len: int | None = knob(None, "--seq", help="Sequence length in tokens.")
    vocab_size: int | None = knob(None, "--vocab", help="Vocabulary size.")
    micro_batch: int | None = knob(None, help="Sequences per rank per micro-batch (default 1).")
    global_batch: int | None = knob(None, help="Sequences per optimizer step over all ranks.")
    grad_accum: int | None = knob(None, help="Micro-batches per rank per optimizer step.")
    param_dtype: str = knob("fp32", help="fp32, bf16 or fp16 (16-bit: mixed precision with an "
                            "fp32 master copy).")
    grad_dtype: str | None = knob(None, help="Gradient dtype (default: as the params).")
    optim_dtype: str = knob("fp32", help="Dtype of Adam's moments.")
    world_size: int | None = knob(None, "--world", help="Ranks on one flat network.")
    num_nodes: int | None = knob(None, "--nodes", help="Nodes (two-level: with --devices-per-node).")
    devices_per_node: int | None = knob(None, help="Ranks per node.")
    nics_per_node: int | None = knob(None,  # None: one NIC per device (rail-optimised)
                                     help="NICs per node (default one per device).")
    link: str | None = knob(None, help="Link preset between ranks: 1GbE, 2.5GbE, 10GbE, 25GbE, "
                            "100G/200G/400G-IB or -RoCE, PCIe4, PCIe5, NVLink3, NVLink4, xGMI.")
    intra_link: str | None = knob(None, help="Link preset inside a node.")
    inter_link: str | None = knob(None, help="Link preset between nodes (per rank's NIC).")
    bandwidth_gbps: float | None = knob(None, "--bandwidth", help="Link rate per rank and direction, GB/s (1e9 "
                                        "B/s), instead of --link.")
    latency_us: float | None = knob(None, "--latency", help="Per-message latency of --bandwidth's link, µs "
                                    "(default 0).")
    efficiency: float = knob(0.85, help="Share of the link rate collectives reach.")
    device: str = knob("cpu", help="Device preset: RTX-4070, L4, A100, H100, H200, MI300X, cpu "
                       "(measured).")
    peak_tflops: float | None = knob(None, help="Peak TFLOP/s per device instead of the preset's.")
    device_memory_gb: float | None = knob(None, "--device-memory", help="Memory per device, GiB, instead of the "
                                          "preset's.")
    mfu: float = knob(DEFAULT_MFU, help="Achieved fraction of peak on the executed FLOPs (default 0.4, or "
                      "the one measured in --calibration's step costs).")
    strategy: str = knob("ddp", help="ddp, zero1, zero2, zero3 or fsdp.")
    bucket_mb: float = knob(25.0, help="DDP bucket (and ZeRO bucket) size, MiB.")
    overlap: bool = knob(True, "--overlap/--no-overlap", help="Overlap communication with backward (and prefetch "
                         "for ZeRO-3).")
    activation_checkpointing: bool = knob(False, help="Recompute each block's "
                                          "activations in backward.")
    attention: str = knob("flash", help="flash (no T×T scores kept) or eager.")
    comm_hook: str = knob("none", help="Gradient compression: none, bf16, fp16, powersgd (ddp).")
    powersgd_rank: int = knob(4, help="PowerSGD matrix approximation rank.")
    comm_target: float = knob(0.1, help="Comm share of the step the levers aim under.")
    calibration: str | None = knob(None, help="A `distval comm bench --json` file: use its "
                                   "measured α and β per collective.")

    def __post_init__(self) -> None:
        param = dtype_name(self.param_dtype, "--param-dtype")
        normalise(self, param_dtype=param, optim_dtype=dtype_name(self.optim_dtype, "--optim-dtype"),
                  grad_dtype=dtype_name(self.grad_dtype, "--grad-dtype") if self.grad_dtype else param)
        self._check_numbers()
        self._check_choices()
        self._check_links()
        if self.model_info().spec is None and self.comm_hook == "powersgd":
            raise FieldError("comm_hook", "powersgd needs the matrix shapes: give {model} or {num_layers} "
                             "{hidden_size} {num_heads} {seq_len} {vocab_size}")
        self.batch()

    @classmethod
    def from_dict(cls, values: dict) -> "PlanConfig":
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown plan setting(s): {', '.join(sorted(unknown))}")
        return cls(**values)

    def _check_numbers(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "seq_len", "vocab_size", "micro_batch",
                     "global_batch", "grad_accum", "world_size", "num_nodes", "devices_per_node", "nics_per_node",
                     "powersgd_rank"):
            if (value := getattr(self, name)) is not None and value < 1:
                raise FieldError(name, f"must be at least 1 (got {value})")
        for name in ("params", "bandwidth_gbps", "peak_tflops", "device_memory_gb", "bucket_mb"):
            if (value := getattr(self, name)) is not None and not (value > 0 and math.isfinite(value)):
                raise FieldError(name, f"must be positive (got {value:g})")
        if self.latency_us is not None and not (self.latency_us >= 0 and math.isfinite(self.latency_us)):
            raise FieldError("latency_us", f"must not be negative (got {self.latency_us:g})")
        for name in ("efficiency", "mfu"):
            if not 0 < (value := getattr(self, name)) <= 1:
                raise FieldError(name, f"must be in (0, 1] (got {value:g})")
        if not 0 < self.comm_target < 1:
            raise FieldError("comm_target", f"must be in (0, 1) (got {self.comm_target:g})")

    def _check_choices(self) -> None:
        if self.strategy not in STRATEGIES:
            raise FieldError("strategy", f"unknown strategy {self.strategy!r} ({{strategy}}); known: "
                             f"{', '.join(STRATEGIES)}")
        if self.attention not in ("flash", "eager"):
            raise FieldError("attention", f"must be flash or eager (got {self.attention!r})")
        if self.comm_hook not in COMM_HOOKS:
            raise FieldError("comm_hook", f"unknown {{comm_hook}} {self.comm_hook!r}; known: {', '.join(COMM_HOOKS)}")
        if self.comm_hook == "powersgd" and self.strategy != "ddp":
            raise FieldError("comm_hook", f"powersgd is a DDP communication hook; it does not apply to {{strategy}} "
                             f"{self.strategy}")
        if self.model is not None:
            presets.model(self.model)
        presets.device(self.device)
        if self.calibration is not None and not Path(self.calibration).is_file():
            raise FieldError("calibration", f"{self.calibration!r}: no such file")

    def _check_links(self) -> None:
        if self.link is not None and self.bandwidth_gbps is not None:
            raise FieldError("link", "and {bandwidth_gbps} both give the link; use one")
        if self.latency_us is not None and self.bandwidth_gbps is None:
            raise FieldError("latency_us", "needs {bandwidth_gbps} (a preset {link} has its own latency)")
        for flag, name in (("--link", self.link), ("--intra-link", self.intra_link), ("--inter-link", self.inter_link)):
            if name is not None:
                presets.link(name, flag)
        if self.world_size is not None and (self.num_nodes is not None or self.devices_per_node is not None):
            nodes, per_node = self.num_nodes or 1, self.devices_per_node or 1
            if nodes * per_node != self.world_size:
                raise FieldError("world_size", f"{self.world_size} contradicts {{num_nodes}} {nodes} × "
                                 f"{{devices_per_node}} {per_node}")

    # -- resolution ---------------------------------------------------------------------------

    def topology(self) -> tuple[int, int, bool]:
        """(nodes, devices per node, two_level). `--world N` alone is flat: N ranks, one link."""
        if self.num_nodes is None and self.devices_per_node is None:
            return (self.world_size or 1), 1, False
        nodes, per_node = self.num_nodes or 1, self.devices_per_node or 1
        return nodes, per_node, True

    @property
    def world(self) -> int:
        nodes, per_node, _ = self.topology()
        return nodes * per_node

    def batch(self) -> tuple[int, int]:
        """(micro-batch, accumulation steps) per rank; the global batch is their product × world."""
        world, m, k, g = self.world, self.micro_batch, self.grad_accum, self.global_batch
        if g is None:
            return m or 1, k or 1
        if m is None and k is None:
            m = 1
        if k is None:
            if g % (m * world):
                raise FieldError("global_batch", f"{g} is not divisible by {{micro_batch}} {m} × world size {world}")
            k = g // (m * world)
        if m is None:
            if g % (k * world):
                raise FieldError("global_batch", f"{g} is not divisible by {{grad_accum}} {k} × world size {world}")
            m = g // (k * world)
        if m * world * k != g:
            raise FieldError("global_batch", f"{g} contradicts {{micro_batch}} {m} × world size {world} × "
                             f"{{grad_accum}} {k} = {m * world * k}")
        return m, k

    def model_info(self) -> ModelInfo:
        spec = self._spec()
        if spec is None:
            if self.params is None:
                raise FieldError("model", "give {model} NAME, {params} N, or the architecture: {num_layers} "
                                 "{hidden_size} {num_heads} {seq_len} {vocab_size}")
            n = int(self.params)
            return ModelInfo(f"{n / 1e6:.0f}M params", n, n, self.seq_len, None)
        count = spec.num_params()
        if self.params is not None and abs(self.params - count) > 0.1 * count:
            raise FieldError("params", f"{self.params:.4g} contradicts the architecture of {spec.name} "
                             f"({count:,} parameters); drop one or fix the sizes")
        n = int(self.params) if self.params is not None else count
        return ModelInfo(spec.name, n, spec.flop_params() + (n - count), spec.seq_len, spec)

    def _spec(self) -> ModelSpec | None:
        given = {"num_layers": self.num_layers, "hidden_size": self.hidden_size, "num_heads": self.num_heads,
                 "num_kv_heads": self.num_kv_heads, "seq_len": self.seq_len, "vocab_size": self.vocab_size}
        given = {k: v for k, v in given.items() if v is not None}
        if self.model is not None:
            base = presets.model(self.model)
            if "hidden_size" in given:
                given["ffn_hidden_size"] = swiglu_or_gelu(base, given["hidden_size"])
            if "num_heads" in given and "num_kv_heads" not in given and base.num_kv_heads == base.num_heads:
                given["num_kv_heads"] = given["num_heads"]
            return dataclasses.replace(base, **given) if given else base
        shape = ("num_layers", "hidden_size", "num_heads", "vocab_size")
        if not set(shape) & set(given):
            return None  # a count, maybe with --seq
        missing = [name for name in (*shape, "seq_len") if name not in given]
        if missing:
            named = " ".join("{" + name + "}" for name in missing)
            raise FieldError(missing[0], "missing sizes: an explicit architecture needs {num_layers} {hidden_size} "
                             "{num_heads} {seq_len} {vocab_size} (missing " + named + ")")
        return ModelSpec("custom", given["num_layers"], given["hidden_size"], given["num_heads"],
                         given.get("num_kv_heads", given["num_heads"]), given["seq_len"], given["vocab_size"],
                         presets.swiglu_ffn(given["hidden_size"]))


def swiglu_or_gelu(base: ModelSpec, hidden: int) -> int:
    return presets.swiglu_ffn(hidden) if base.mlp == "swiglu" else 4 * hidden
