"""amd-smi and rocm-smi, read into one model of an AMD host: its GPUs (`AmdGpu`) and the links
between them (`AmdTopology`). Torch-free, and tested on real outputs (tests/data/rocm/README.md).

Two tools, several formats. `amd-smi` (ROCm 6+) prints JSON with `--json`: `static` (product,
VRAM, driver, bus, NUMA), `metric` (clocks, usage, power, ECC), `topology` (link type, hops and
weight between GPUs keyed by PCI address). `rocm-smi` (older, being retired) prints sections of
`GPU[i] : key: value` lines, and matrices for `--showtopo`:

    ================= Weight between two GPUs =================
           GPU0   GPU1 ...                 (0 on the diagonal; 15 per xGMI hop, more over PCIe)
    ================= Hops between two GPUs ===================
    ================= Link Type between two GPUs ==============
           GPU0   GPU1 ...                 XGMI or PCIE; XXXX between partitions of one GPU
    ======================== Numa Nodes =======================
    GPU[0]   : (Topology) Numa Node: 0

Link type and weight, not hops, say what a pair is connected by: hops is 1 for any xGMI pair.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

_SECTION = re.compile(r"^=+\s*(.*?)\s*=+\s*$")
_GPU_LINE = re.compile(r"^GPU\[(\d+)\]\s*:\s?(.*)$")
_MHZ = re.compile(r"(\d+(?:\.\d+)?)\s*Mhz", re.IGNORECASE)
LINK_TYPES = ("XGMI", "PCIE")


@dataclass
class AmdGpu:
    """One GPU (or partition) as the tools report it; None where a tool does not say."""

    index: int
    product: str | None = None  # "AMD Instinct MI300X OAM", "Aqua Vanjaram [Instinct MI300A]"
    arch: str | None = None  # gfx942
    bus_id: str | None = None  # 0000:05:00.0
    vram_bytes: int | None = None
    numa_node: int | None = None
    driver: str | None = None
    partition: str | None = None  # "SPX", "CPX/NPS4", ...
    sclk_mhz: float | None = None  # graphics clock now
    sclk_max_mhz: float | None = None  # its highest level
    busy_pct: float | None = None
    power_w: float | None = None
    power_cap_w: float | None = None
    temp_c: float | None = None
    ecc_correctable: int | None = None
    ecc_uncorrectable: int | None = None
    throttled: list[str] = field(default_factory=list)  # throttle reasons active now, where the tool says

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class AmdTopology:
    """GPU-to-GPU links: `link_type[(a, b)]` XGMI / PCIE / SAME (partitions of one GPU), with
    hops and weight where the tool gives them; names GPU0, GPU1, ... by the tool's index."""

    gpus: list[str]
    link_type: dict[tuple[str, str], str]
    hops: dict[tuple[str, str], int] = field(default_factory=dict)
    weight: dict[tuple[str, str], int] = field(default_factory=dict)
    numa: dict[str, int] = field(default_factory=dict)
    source: str = ""
    bus_ids: dict[str, str] = field(default_factory=dict)  # GPU0 -> 0000:0c:00.0 where the tool says

    def gpu_for_bus(self, bus: str) -> str | None:
        """The GPU of a bus id as NCCL/RCCL logs print it ("c000", "200000": the PCI address's hex
        digits, 0000:0c:00.0 -> c000), or None."""
        try:
            wanted = int(bus, 16)
        except ValueError:
            return None
        return next((g for g, bdf in self.bus_ids.items()
                     if int(re.sub(r"[^0-9a-fA-F]", "", bdf) or "-1", 16) == wanted), None)

    def link(self, a: str, b: str) -> str:
        return self.link_type.get((a, b)) or self.link_type.get((b, a)) or "?"

    def crosses_socket(self, a: str, b: str) -> bool:
        """A PCIe path between GPUs on different NUMA nodes (through both sockets): the AMD twin
        of nvidia-smi's SYS. xGMI links GPUs directly whatever their NUMA nodes."""
        na, nb = self.numa.get(a), self.numa.get(b)
        return self.link(a, b) == "PCIE" and na is not None and nb is not None and na != nb

    def gpu_pairs(self) -> list[tuple[str, str, str]]:
        return [(a, b, self.link(a, b)) for i, a in enumerate(self.gpus) for b in self.gpus[i + 1:]]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "vendor": "amd", "devices": self.gpus, "bus_ids": self.bus_ids,
                "matrix": {a: {b: ("X" if a == b else self.link(a, b)) for b in self.gpus} for a in self.gpus},
                "hops": {f"{a}-{b}": h for (a, b), h in self.hops.items() if a < b},
                "weight": {f"{a}-{b}": w for (a, b), w in self.weight.items() if a < b}, "numa": self.numa}


# -- rocm-smi text ---------------------------------------------------------------------------------


def rocm_smi_sections(text: str) -> dict[str, list[str]]:
    """Section title -> its lines (the banner and end lines dropped); a title seen twice (rocm-smi
    prints OverDrive Level twice) keeps every line."""
    sections: dict[str, list[str]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _SECTION.match(line)
        if m:
            title = m.group(1)
            current = None if title in ("", "ROCm System Management Interface", "End of ROCm SMI Log") else title
            if current is not None:
                sections.setdefault(current, [])
            continue
        if current is not None and line.strip() and not set(line.strip()) <= {"-"}:
            sections[current].append(line)
    return sections


def gpu_values(lines: list[str]) -> dict[int, list[tuple[str, str]]]:
    """`GPU[i] : key: value` lines -> i -> [(key, value)] (a line without `key:` gets key "")."""
    out: dict[int, list[tuple[str, str]]] = {}
    for line in lines:
        m = _GPU_LINE.match(line.strip())
        if not m:
            continue
        key, sep, value = m.group(2).partition(":")
        out.setdefault(int(m.group(1)), []).append((key.strip(), value.strip()) if sep else ("", key.strip()))
    return out


def _matrix(lines: list[str]) -> dict[tuple[str, str], str]:
    header: list[str] | None = None
    cells: dict[tuple[str, str], str] = {}
    for line in lines:
        tokens = line.split()
        if not tokens:
            continue
        if header is None:
            if all(re.fullmatch(r"GPU\d+", t) for t in tokens):
                header = tokens
            continue
        if re.fullmatch(r"GPU\d+", tokens[0]) and len(tokens) == len(header) + 1:
            for col, cell in zip(header, tokens[1:]):
                cells[(tokens[0], col)] = cell
    return cells


def parse_rocm_smi_topo(text: str, source: str = "rocm-smi --showtopo") -> AmdTopology:
    """`rocm-smi --showtopo`; ValueError when it holds no link-type matrix."""
    sections = rocm_smi_sections(text)
    types = _matrix(sections.get("Link Type between two GPUs", []))
    if not types:  # some releases print the link types under another title (rocm_smi_lib issue in README)
        types = next((m for lines in sections.values() if (m := _matrix(lines))
                      and all(not c.isdigit() for (a, b), c in m.items() if a != b)), {})
    if not types:
        raise ValueError(f"{source}: no 'Link Type between two GPUs' matrix (is this `rocm-smi --showtopo` output?)")
    gpus = sorted({a for a, _ in types}, key=lambda g: int(g[3:]))
    links: dict[tuple[str, str], str] = {}
    for (a, b), cell in types.items():
        if a == b:
            continue
        kind = cell.upper()
        if kind not in (*LINK_TYPES, "XXXX"):
            raise ValueError(f"{source}: {a}/{b} is {cell!r}, not a link type (XGMI, PCIE)")
        links[(a, b)] = "SAME" if kind == "XXXX" else kind
    hops = {(a, b): int(v) for (a, b), v in _matrix(sections.get("Hops between two GPUs", [])).items()
            if v.isdigit() and a != b}
    weight = {(a, b): int(v) for (a, b), v in _matrix(sections.get("Weight between two GPUs", [])).items()
              if v.isdigit() and a != b}
    numa = {}
    for index, pairs in gpu_values(sections.get("Numa Nodes", [])).items():
        for key, value in pairs:
            if key.endswith("Numa Node") and re.fullmatch(r"-?\d+", value):
                numa[f"GPU{index}"] = int(value)
    return AmdTopology(gpus, links, hops, weight, numa, source)


def _first(pairs: list[tuple[str, str]], *keys: str) -> str | None:
    wanted = {k.lower() for k in keys}
    return next((v for k, v in pairs if k.lower() in wanted and v not in ("", "N/A")), None)


def _number(text: str | None) -> float | None:
    m = re.search(r"-?\d+(?:\.\d+)?", text or "")
    return float(m.group()) if m else None


def parse_rocm_smi(text: str, source: str = "rocm-smi") -> list[AmdGpu]:
    """The GPUs of `rocm-smi --showallinfo` (or any subset of its sections: --showproductname,
    --showmeminfo vram, --showuse, --showclocks, --showbus, --showmaxpower, ...)."""
    sections = rocm_smi_sections(text)
    gpus: dict[int, AmdGpu] = {}
    driver = None
    for title, lines in sections.items():
        for line in lines:
            m = re.match(r"^Driver version:\s*(\S+)", line.strip())
            if m:
                driver = m.group(1)
        values = gpu_values(lines)
        for index, pairs in values.items():
            gpu = gpus.setdefault(index, AmdGpu(index))
            _read_rocm_smi(gpu, title, pairs)
    if not gpus:
        raise ValueError(f"{source}: no `GPU[i] : ...` lines (is this rocm-smi output?)")
    for gpu in gpus.values():
        gpu.driver = gpu.driver or driver
    return [gpus[i] for i in sorted(gpus)]


def _read_rocm_smi(gpu: AmdGpu, title: str, pairs: list[tuple[str, str]]) -> None:
    product = _first(pairs, "Card series", "Card Series")
    if product:
        gpu.product = product
    if arch := _first(pairs, "GFX Version"):
        gpu.arch = arch
    if total := _first(pairs, "VRAM Total Memory (B)"):
        gpu.vram_bytes = int(_number(total) or 0) or None
    if bus := _first(pairs, "PCI Bus"):
        gpu.bus_id = bus
    if busy := _first(pairs, "GPU use (%)"):
        gpu.busy_pct = _number(busy)
    if cap := _first(pairs, "Max Graphics Package Power (W)"):
        gpu.power_cap_w = _number(cap)
    if power := _first(pairs, "Current Socket Graphics Package Power (W)", "Average Graphics Package Power (W)"):
        gpu.power_w = _number(power)
    if temp := _first(pairs, "Temperature (Sensor junction) (C)"):
        gpu.temp_c = _number(temp)
    if numa := _first(pairs, "(Topology) Numa Node"):
        gpu.numa_node = int(_number(numa) or 0)
    if title == "Current clock frequencies":
        sclk = _first(pairs, "sclk clock level")
        if sclk and (m := _MHZ.search(sclk)):
            gpu.sclk_mhz = float(m.group(1))
    if sclk_range := _first(pairs, "Valid sclk range"):
        found = _MHZ.findall(sclk_range)
        if found:
            gpu.sclk_max_mhz = max(float(f) for f in found)
    if title == "Supported clock frequencies":  # levels per clock; the sclk block's highest is the max
        block = None
        for key, value in pairs:
            if value.startswith("Supported ") or key.startswith("Supported "):
                block = (value or key).split()[1]
            elif block == "sclk" and (m := _MHZ.search(value)):
                gpu.sclk_max_mhz = max(gpu.sclk_max_mhz or 0.0, float(m.group(1)))


# -- amd-smi -----------------------------------------------------------------------------------------


def run_tool(*args: str, timeout_s: float = 30.0) -> str | None:
    """A tool's stdout, or None when it is not installed, fails or hangs."""
    if shutil.which(args[0]) is None:
        return None
    try:
        out = subprocess.run(list(args), check=False, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 and out.stdout.strip() else None


def load_json(text: str, source: str) -> Any:
    """amd-smi's JSON; ValueError naming the source when it is not JSON. Some versions print
    warnings before the document: read from the first `[` or `{`."""
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError(f"{source}: no JSON in the output")
    try:
        return json.loads(text[start:])
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not valid JSON ({e.msg} at line {e.lineno})") from None


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_")


def _amd_smi_text(text: str) -> list[dict[str, Any]]:
    """amd-smi's text form (`GPU: 0` then indented `KEY: value` lines, a key with no value opening
    a nested block) as the JSON form's dicts, keys lower-cased."""
    gpus: list[dict[str, Any]] = []
    stack: list[tuple[int, dict[str, Any]]] = []
    for raw in text.splitlines():
        if not raw.strip() or raw.strip() in ("...", "[output truncated]") or ":" not in raw:
            continue
        indent = len(raw) - len(raw.lstrip())
        key, _, value = raw.strip().partition(":")
        if indent == 0:
            stack = []
            if _key(key) == "gpu" and value.strip().isdigit():
                gpus.append({"gpu": int(value)})
                stack = [(-1, gpus[-1])]
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        node = stack[-1][1]
        if value.strip():
            node[_key(key)] = value.strip()
        else:
            node[_key(key)] = child = {}
            stack.append((indent, child))
    return gpus


def amd_smi_gpus(text: str, source: str) -> list[dict[str, Any]]:
    """The per-GPU documents of an amd-smi command, JSON (a list, or {"gpu_data": [...]}) or text."""
    if text.lstrip()[:1] in ("[", "{"):
        doc = load_json(text, source)
        if isinstance(doc, dict):
            doc = doc.get("gpu_data", [doc])
        if not isinstance(doc, list) or not all(isinstance(d, dict) and "gpu" in d for d in doc):
            raise ValueError(f"{source}: not amd-smi's per-GPU JSON (a list of objects with a 'gpu' key)")
        return doc
    gpus = _amd_smi_text(text)
    if not gpus:
        raise ValueError(f"{source}: no 'GPU: N' blocks (is this amd-smi output?)")
    return gpus


def _at(node: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _quantity(node: Any) -> float | None:
    """{"value": 113, "unit": "MHz"}, "113 MHz", 113 -> 113.0; "N/A" -> None."""
    if isinstance(node, dict):
        node = node.get("value")
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return float(node)
    return _number(node) if isinstance(node, str) and node.strip().upper() != "N/A" else None


def _text(node: Any) -> str | None:
    return node.strip() if isinstance(node, str) and node.strip() and node.strip().upper() != "N/A" else None


def parse_amd_smi(static: str | None = None, metric: str | None = None, source: str = "amd-smi") -> list[AmdGpu]:
    """GPUs from `amd-smi static` and `amd-smi metric` (JSON or text; either may be missing)."""
    gpus: dict[int, AmdGpu] = {}
    for doc in amd_smi_gpus(static, f"{source} static") if static else []:
        gpu = gpus.setdefault(int(doc["gpu"]), AmdGpu(int(doc["gpu"])))
        gpu.product = _text(_at(doc, "asic", "market_name")) or _text(_at(doc, "board", "product_name"))
        gpu.arch = _text(_at(doc, "asic", "target_graphics_version"))
        gpu.bus_id = _text(_at(doc, "bus", "bdf")) or _text(doc.get("bdf"))
        size = _quantity(_at(doc, "vram", "size"))  # amd-smi's "MB" are MiB (MI300X: 196592)
        gpu.vram_bytes = int(size * 2**20) if size else None
        numa = _quantity(_at(doc, "numa", "node"))
        gpu.numa_node = int(numa) if numa is not None else None
        gpu.driver = _text(_at(doc, "driver", "version"))
        parts = [_text(_at(doc, "partition", k)) for k in ("compute_partition", "memory_partition")]
        gpu.partition = "/".join(p for p in parts if p) or None
        gpu.power_cap_w = _quantity(_at(doc, "limit", "socket_power")) or _quantity(_at(doc, "limit", "max_power"))
    for doc in amd_smi_gpus(metric, f"{source} metric") if metric else []:
        gpu = gpus.setdefault(int(doc["gpu"]), AmdGpu(int(doc["gpu"])))
        gpu.busy_pct = _quantity(_at(doc, "usage", "gfx_activity"))
        gpu.power_w = _quantity(_at(doc, "power", "socket_power"))
        gpu.power_cap_w = _quantity(_at(doc, "power", "power_cap")) or gpu.power_cap_w
        gpu.temp_c = _quantity(_at(doc, "temperature", "hotspot"))
        status = _text(_at(doc, "power", "throttle_status"))
        if status and status.upper() not in ("UNTHROTTLED", "DISABLED"):
            gpu.throttled.append(f"throttle_status {status}")
        clocks = [c for k, c in (_at(doc, "clock") or {}).items() if re.fullmatch(r"gfx(_\d+)?", k)]
        now = [v for c in clocks if (v := _quantity(_at(c, "clk"))) is not None]
        top = [v for c in clocks if (v := _quantity(_at(c, "max_clk"))) is not None]
        if now:
            gpu.sclk_mhz = sum(now) / len(now)  # the mean over the XCDs (MI300X has 8)
        if top:
            gpu.sclk_max_mhz = max(top)
        for field_name, key in (("ecc_correctable", "total_correctable_count"),
                                ("ecc_uncorrectable", "total_uncorrectable_count")):
            count = _quantity(_at(doc, "ecc", key))
            if count is not None:
                setattr(gpu, field_name, int(count))
    return [gpus[i] for i in sorted(gpus)]


_AMD_TABLE = re.compile(r"^([A-Z][A-Z ]+) TABLE:\s*$")


def parse_amd_smi_topology(text: str, source: str = "amd-smi topology") -> AmdTopology:
    """`amd-smi topology`: JSON (a `links` list per GPU, or the older per-key dicts `link_type`,
    `hops`, `weight` keyed gpu_N) or text (ACCESS/WEIGHT/HOPS/LINK TYPE tables by PCI address,
    in GPU order). SELF is the diagonal."""
    link_type: dict[tuple[str, str], str] = {}
    hops: dict[tuple[str, str], int] = {}
    weight: dict[tuple[str, str], int] = {}
    bus_ids: dict[str, str] = {}
    if text.lstrip()[:1] in ("[", "{"):
        for doc in amd_smi_gpus(text, source):
            a = f"GPU{int(doc['gpu'])}"
            if _text(doc.get("bdf")):
                bus_ids[a] = doc["bdf"]
            if isinstance(doc.get("links"), list):
                for link in doc["links"]:
                    b = f"GPU{int(link['gpu'])}"
                    _put(link_type, hops, weight, a, b, link.get("link_type"), link.get("num_hops", link.get("hops")),
                         link.get("weight"))
            else:
                for key, kind in (doc.get("link_type") or {}).items():
                    b = "GPU" + key.rsplit("_", 1)[-1]
                    _put(link_type, hops, weight, a, b, kind, _at(doc, "hops", key), _at(doc, "weight", key))
    else:
        tables: dict[str, tuple[list[str], dict[tuple[str, str], str]]] = {}
        title = None
        lines: list[str] = []
        for raw in [*text.splitlines(), "END TABLE:"]:
            m = _AMD_TABLE.match(raw.strip())
            if m:
                if title:
                    tables[title] = _bdf_matrix(lines)
                title, lines = m.group(1).strip(), []
            elif title:
                lines.append(raw)
        header, types = tables.get("LINK TYPE", ([], {}))
        bus_ids = {f"GPU{i}": bdf for i, bdf in enumerate(header)}
        for (a, b), kind in types.items():
            _put(link_type, hops, weight, a, b, kind, tables.get("HOPS", ([], {}))[1].get((a, b)),
                 tables.get("WEIGHT", ([], {}))[1].get((a, b)))
    if not link_type:
        raise ValueError(f"{source}: no link types between GPUs (is this `amd-smi topology` output?)")
    gpus = sorted({a for a, _ in link_type} | {b for _, b in link_type}, key=lambda g: int(g[3:]))
    return AmdTopology(gpus, link_type, hops, weight, {}, source, {g: b for g, b in bus_ids.items() if g in gpus})


def _put(link_type: dict, hops: dict, weight: dict, a: str, b: str, kind: Any, hop: Any, w: Any) -> None:
    kind = str(kind or "").upper()
    if a == b or kind in ("SELF", ""):
        return
    if kind not in LINK_TYPES:
        raise ValueError(f"amd-smi topology: {a}/{b} is {kind!r}, not a link type (XGMI, PCIE)")
    link_type[(a, b)] = kind
    if (n := _quantity(hop)) is not None:
        hops[(a, b)] = int(n)
    if (n := _quantity(w)) is not None:
        weight[(a, b)] = int(n)


def _bdf_matrix(lines: list[str]) -> tuple[list[str], dict[tuple[str, str], str]]:
    """A table whose header and rows are PCI addresses: (the addresses, the cells by GPU0.. in
    header order)."""
    rows = [line.split() for line in lines if line.strip()]
    if not rows:
        return [], {}
    header = rows[0]
    names = {bdf: f"GPU{i}" for i, bdf in enumerate(header)}
    cells = {}
    for tokens in rows[1:]:
        if tokens[0] in names and len(tokens) == len(header) + 1:
            for col, cell in zip(header, tokens[1:]):
                cells[(names[tokens[0]], names[col])] = cell
    return header, cells
