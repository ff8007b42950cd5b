"""The ROCm platform's names and numbers: which AMD Instinct a device is, which ROCm runs, and
which GPUs the three visible-devices variables leave to a process.

A device is named by torch (`get_device_name`: "AMD Instinct MI300X"; some ROCm releases say only
"AMD Radeon Graphics") and by its gfx architecture (`gcnArchName`: "gfx942:sramecc+:xnack-").
When the name carries no product, the architecture with the compute-unit count and the memory
picks it, but only where that is unambiguous: MI300X and MI325X share gfx942 and 304 CUs and differ
in memory; MI350X and MI355X share everything torch reports (they differ in clocks and power), so
a gfx950 device without its name stays unidentified and its MFU is measured, not looked up.

Visibility (ROCm's "GPU isolation techniques" page; torch/cuda/__init__.py `_parse_visible_devices`
in torch 2.13): ROCR_VISIBLE_DEVICES is applied first, by the ROCr runtime; HIP_VISIBLE_DEVICES
then indexes what ROCr left (0..k-1), and HIP (and torch on ROCm) reads CUDA_VISIBLE_DEVICES only
when HIP_VISIBLE_DEVICES is unset. Each takes indices or UUIDs (`GPU-...`); a repeated entry
gives the empty set, and torch stops reading the list at the first entry it cannot parse.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

VISIBLE_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Product:
    """An AMD Instinct as torch sees it: one device per GCD (an MI250 is two devices)."""

    name: str
    arch: str  # the gfx target
    compute_units: int  # per device
    memory_gb: int  # per device, decimal GB as marketed


# ROCm's "GPU hardware specifications" table (rocm.docs.amd.com, reference/gpu-arch-specs) and
# the product pages cited in docs/rocm.md.
PRODUCTS: tuple[Product, ...] = (
    Product("MI100", "gfx908", 120, 32),
    Product("MI210", "gfx90a", 104, 64),
    Product("MI250", "gfx90a", 104, 64),
    Product("MI250X", "gfx90a", 110, 64),
    Product("MI300A", "gfx942", 228, 128),
    Product("MI300X", "gfx942", 304, 192),
    Product("MI308X", "gfx942", 80, 192),
    Product("MI325X", "gfx942", 304, 256),
    Product("MI350X", "gfx950", 256, 288),
    Product("MI355X", "gfx950", 256, 288),
)
_ARCH = re.compile(r"\b(gfx[0-9a-f]{3,4})\b", re.IGNORECASE)
_HIP_VERSION = re.compile(r"^(\d+)\.(\d+)")


def gfx_arch(gcn_arch_name: str | None) -> str | None:
    """"gfx942:sramecc+:xnack-" -> "gfx942"; None when there is no gfx target in it."""
    m = _ARCH.search(gcn_arch_name or "")
    return m.group(1).lower() if m else None


def rocm_version(hip: str | None) -> str | None:
    """torch.version.hip ("6.2.41133-dd7f95766") -> "6.2"; None on a CUDA or CPU build."""
    m = _HIP_VERSION.match(hip or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def version_tuple(version: str | None) -> tuple[int, ...]:
    """"6.2" or "6.4.1" -> (6, 2) / (6, 4, 1); () when there is none."""
    return tuple(int(p) for p in re.findall(r"\d+", version or "")[:3])


def product_named(text: str | None) -> str | None:
    """The product a reported name carries ("AMD Instinct MI300X" -> "MI300X"); the longest
    match wins, so "MI300X" is never read as "MI300A"'s neighbour or "MI250X" as "MI250"."""
    words = re.sub(r"[^A-Z0-9]", " ", (text or "").upper()).split()
    found = [p.name for p in PRODUCTS if p.name in words]
    return max(found, key=len) if found else None


def identify(name: str | None, arch: str | None = None, compute_units: int | None = None,
             memory_bytes: int | None = None) -> str | None:
    """The product: by its reported name, else by architecture, compute units and memory when
    exactly one product fits (memory within 15% of the marketed size: torch reports GiB of usable
    memory, a little under the decimal GB sold); None when it is not known or not unique."""
    named = product_named(name)
    if named or arch is None:
        return named
    fits = [p for p in PRODUCTS
            if p.arch == gfx_arch(arch) and (compute_units is None or p.compute_units == compute_units)]
    if memory_bytes is not None and len(fits) > 1:
        fits = [p for p in fits if abs(memory_bytes / 1e9 - p.memory_gb) <= 0.15 * p.memory_gb]
    names = {p.name for p in fits}  # several: identical to torch (MI210 and an MI250 GCD; MI350X and MI355X)
    return names.pop() if len(names) == 1 else None


def products_of(arch: str | None) -> list[str]:
    return [p.name for p in PRODUCTS if p.arch == gfx_arch(arch)]


@dataclass
class Visibility:
    """Which GPUs a process started with this environment sees: `physical` the host's indices
    (or the UUIDs given) in the order the process numbers them, None when it cannot be worked
    out; `problems` one sentence each, with what to do."""

    variables: dict[str, str]
    physical: list[str] | None
    problems: list[str]
    ignored: list[str]  # variables set but overridden (CUDA_VISIBLE_DEVICES under HIP_VISIBLE_DEVICES)


def _entries(var: str, value: str, problems: list[str]) -> list[str] | None:
    items = [v.strip() for v in value.split(",")]
    if value.strip() == "":
        problems.append(f"{var} is set but empty: the process sees no GPU (unset it to see every GPU)")
        return []
    bad = [v for v in items if not (v.isdigit() or re.match(r"^GPU-[0-9A-Za-z-]+$", v))]
    if bad:
        problems.append(f"{var}={value}: {bad[0]!r} is neither a device index nor a GPU UUID (GPU-...); torch stops "
                        "reading the list there")
        return None
    repeated = sorted({v for v in items if items.count(v) > 1})
    if repeated:
        problems.append(f"{var}={value} repeats {', '.join(repeated)}: a repeated entry hides every GPU")
        return None
    return items


def visibility(env: Mapping[str, str], gpu_count: int | None) -> Visibility:
    """Apply ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES) to the
    host's `gpu_count` GPUs (None: count unknown, indices are not range-checked at the first level)."""
    variables = {v: env[v] for v in VISIBLE_VARS if v in env}
    problems: list[str] = []
    ignored: list[str] = []
    visible: list[str] | None = [str(i) for i in range(gpu_count)] if gpu_count is not None else None
    rocr = variables.get("ROCR_VISIBLE_DEVICES")
    hip, cuda = variables.get("HIP_VISIBLE_DEVICES"), variables.get("CUDA_VISIBLE_DEVICES")
    if rocr is not None:
        entries = _entries("ROCR_VISIBLE_DEVICES", rocr, problems)
        if entries is not None:
            out_of_range = [e for e in entries if e.isdigit() and gpu_count is not None and int(e) >= gpu_count]
            if out_of_range:
                problems.append(f"ROCR_VISIBLE_DEVICES={rocr} names GPU {out_of_range[0]} but this host has "
                                f"{gpu_count} (0-{gpu_count - 1})")
                entries = None
        visible = entries
    second_var, second = ("HIP_VISIBLE_DEVICES", hip) if hip is not None else ("CUDA_VISIBLE_DEVICES", cuda)
    if hip is not None and cuda is not None and hip.replace(" ", "") != cuda.replace(" ", ""):
        ignored.append("CUDA_VISIBLE_DEVICES")
        problems.append(f"HIP_VISIBLE_DEVICES={hip} and CUDA_VISIBLE_DEVICES={cuda} disagree: HIP and torch on ROCm "
                        "use HIP_VISIBLE_DEVICES and ignore CUDA_VISIBLE_DEVICES, so whatever set CUDA_VISIBLE_DEVICES "
                        "(a scheduler, Ray, a launcher) does not get the GPUs it chose; set one of them, or both alike")
    if second is not None:
        entries = _entries(second_var, second, problems)
        if entries is not None and visible is not None:
            limit = len(visible)
            out_of_range = [e for e in entries if e.isdigit() and int(e) >= limit]
            if out_of_range:
                base = (f"ROCR_VISIBLE_DEVICES={rocr} leaves {limit} GPU(s), numbered 0-{limit - 1} from there"
                        if rocr is not None else f"this host has {limit} GPU(s) (0-{limit - 1})")
                problems.append(f"{second_var}={second} names GPU {out_of_range[0]} but {base}"
                                + ("; with both set, give HIP_VISIBLE_DEVICES indices into ROCR's list (or set only "
                                   "one of them)" if rocr is not None else ""))
                entries = None
            else:
                entries = [visible[int(e)] if e.isdigit() else e for e in entries]
        visible = entries
    return Visibility(variables, visible, problems, ignored)
