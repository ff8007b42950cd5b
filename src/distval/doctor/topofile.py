"""`--topo-file`: a topology in any of the forms distval reads, NVIDIA's (`nvidia-smi topo -m`,
doctor/topo.py) or AMD's (`rocm-smi --showtopo`, `amd-smi topology`, text or JSON: doctor/amd.py).
Above both, so neither imports the other."""

from __future__ import annotations

from pathlib import Path

from distval.doctor.amd import load_topology_file
from distval.doctor.topo import Topo, parse_topo
from distval.rocm.smi import AmdTopology


def load_topo(path: str | Path) -> "Topo | AmdTopology":
    """--topo-file: `nvidia-smi topo -m`, `rocm-smi --showtopo` or `amd-smi topology` (text or JSON)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(
            f"--topo-file {str(p)!r} does not exist" if not p.exists() else f"--topo-file {str(p)!r} is not a file"
        )
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--topo-file {str(p)!r} cannot be read as text ({e})") from None
    source = f"--topo-file {str(p)!r}"
    return load_topology_file(text, source) or parse_topo(text, source)
