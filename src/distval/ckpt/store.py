"""The checkpoint directory and its atomic commit protocol.

Layout of `--ckpt-dir DIR`:

    DIR/step-00000010/          one checkpoint: 10 optimizer steps done, the resumed run starts at step 10
        model.safetensors       rank 0: the strategy's portable full form {"model": ..., "optim": ...},
                                flattened to "model/<name>", "optim/<param>/<exp_avg|...>" keys
                                (safetensors layout: JSON header and raw bytes, nothing pickled)
        trainer.json            rank 0: step, LR schedule position, config fingerprint, per-step metrics so far
        rank-0.json, rank-1.json, ...   each rank: RNG states (JSON) and data-loader position
        manifest.json           written LAST: format, step, fingerprint, SHA-256 and size of every file
    DIR/latest                  "step-00000010": moved atomically after each commit (for people and tools)
    DIR/runs/<run id>.json      the run journal: attempts, the step each resumed from, saves, warnings
    DIR/.tmp-step-...           a save in progress (or one killed mid-way): never loaded, removed on start

Commit: every rank writes its files into the same temporary directory (each file fsynced); the
ranks agree that all files are written; rank 0 writes the manifest, fsyncs the directory, renames
it to `step-N`, fsyncs DIR, then replaces `latest` (write-temp-fsync-rename) and deletes all but
the newest K checkpoints. A crash at any point leaves either the complete checkpoint or none.

Load: newest `step-N` first; a checkpoint without a manifest, with a missing file, or a file whose
size or SHA-256 differs from the manifest is skipped with a warning naming the file, and the
next older one is tried.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distval.results import atomic_write_text

FORMAT = "distval.ckpt/1"
MANIFEST = "manifest.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


class CorruptCheckpoint(Exception):
    """A checkpoint directory that fails verification; the message names the file."""


@dataclass
class Found:
    path: Path
    step: int
    manifest: dict[str, Any]


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def tmp_path(ckpt_dir: Path, step: int, tag: str) -> Path:
    return ckpt_dir / f".tmp-{step_name(step)}-{tag}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(directory: Path, name: str, data: bytes | memoryview) -> dict[str, Any]:
    """Write, flush and fsync one file; return what the manifest records about it."""
    with open(directory / name, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


# safetensors' dtype codes; the file layout is safetensors' (8-byte little-endian header length,
# JSON header {key: {dtype, shape, data_offsets}}, raw bytes), readable by that library too.
_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def write_tensors(directory: Path, name: str, tensors: dict[str, Any], midway: Any = None) -> dict[str, Any]:
    """Write host tensors straight from their memory (no serialized copy), hashing as it goes;
    hashing and writing release the GIL, so a background save barely touches the training thread.
    Widest elements first, header padded to 8 bytes: every tensor is aligned for its dtype."""
    import torch

    codes = {getattr(torch, v): k for k, v in _DTYPES.items()}
    header: dict[str, Any] = {}
    views, offset = [], 0
    for key, t in sorted(tensors.items(), key=lambda kv: -kv[1].element_size()):
        flat = t.detach().contiguous().reshape(-1)
        nbytes = flat.numel() * flat.element_size()
        header[key] = {"dtype": codes[flat.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        views.append(memoryview(flat.view(torch.uint8).numpy()) if nbytes else memoryview(b""))
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    digest = hashlib.sha256()
    with open(directory / name, "wb") as f:
        for i, chunk in enumerate([len(text).to_bytes(8, "little"), text, *views]):
            if midway is not None and i == 2 + len(views) // 2:
                f.flush()
                os.fsync(f.fileno())
                midway()
            f.write(chunk)
            digest.update(chunk)
        f.flush()
        os.fsync(f.fileno())
    return {"sha256": digest.hexdigest(), "bytes": 8 + len(text) + offset}


def read_tensors(path: Path) -> dict[str, Any]:
    """The tensors of a file written by write_tensors: parsed from JSON and raw bytes, never unpickled."""
    import torch

    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    raw = (
        torch.frombuffer(data, dtype=torch.uint8)[8 + size :]
        if len(data) > 8 + size
        else torch.empty(0, dtype=torch.uint8)
    )
    out = {}
    for key, meta in header.items():
        begin, end = meta["data_offsets"]
        out[key] = raw[begin:end].view(getattr(torch, _DTYPES[meta["dtype"]])).reshape(meta["shape"])
    return out


def flatten(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {name: t}, "optim": {name: {"exp_avg": t}}} -> {"model/name": t, "optim/name/exp_avg": t}"""
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in flat.items():
        *parents, leaf = key.split("/")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def json_bytes(obj: Any) -> bytes:
    from distval.results import json_safe

    return json.dumps(json_safe(obj), allow_nan=False).encode()


def describe_files(directory: Path, sub: str) -> dict[str, dict[str, Any]]:
    """Manifest entries for every file under directory/sub (files other writers produced)."""
    out = {}
    for p in sorted((directory / sub).rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            out[str(p.relative_to(directory))] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    return out


def commit(tmp: Path, ckpt_dir: Path, step: int, files: dict[str, dict[str, Any]], info: dict[str, Any]) -> Path:
    """Rank 0, once every rank's files are in `tmp`: manifest last, then rename into place."""
    manifest = {"format": FORMAT, "step": step, **info, "files": files}
    write_file(tmp, MANIFEST, json.dumps(manifest, indent=1).encode())
    fsync_dir(tmp)
    final = ckpt_dir / step_name(step)
    if final.exists():  # the same step saved again (a resumed run): same content, replace it whole
        trash = ckpt_dir / f".trash-{step_name(step)}-{os.getpid()}"
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp, final)
    fsync_dir(ckpt_dir)
    with contextlib.suppress(OSError):  # the checkpoint is committed; `latest` is a convenience (loading scans step-N)
        atomic_write_text(ckpt_dir / LATEST, step_name(step) + "\n")
    return final


def prune(ckpt_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` committed checkpoints (those with a manifest)."""
    committed = [p for p in candidates(ckpt_dir) if (p / MANIFEST).exists()]
    removed = committed[keep:]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def clean_temporary(ckpt_dir: Path) -> list[str]:
    """Remove what interrupted saves left (never loadable: no rename happened)."""
    gone = []
    for p in ckpt_dir.glob(".tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
        gone.append(p.name)
    for p in ckpt_dir.glob(".trash-*"):
        shutil.rmtree(p, ignore_errors=True)
    return gone


def candidates(ckpt_dir: Path) -> list[Path]:
    """step-N directories, newest first."""
    found = []
    for p in Path(ckpt_dir).iterdir() if Path(ckpt_dir).is_dir() else []:
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found, reverse=True)]


def verify(path: Path) -> dict[str, Any]:
    """The manifest of a complete, intact checkpoint, or CorruptCheckpoint naming what is wrong."""
    mpath = path / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{mpath} is missing (an unfinished save)") from None
    except (OSError, ValueError) as e:
        raise CorruptCheckpoint(f"{mpath} is unreadable ({e})") from None
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != FORMAT
        or not isinstance(manifest.get("files"), dict)
    ):
        raise CorruptCheckpoint(f"{mpath} is not a {FORMAT} manifest")
    for name, meta in manifest["files"].items():
        fpath = path / name
        try:
            data = fpath.read_bytes()
        except OSError as e:
            raise CorruptCheckpoint(f"{fpath} is missing or unreadable ({e.strerror})") from None
        if len(data) != meta["bytes"]:
            raise CorruptCheckpoint(
                f"{fpath} has {len(data)} bytes, the manifest says {meta['bytes']} (truncated or corrupt)"
            )
        if hashlib.sha256(data).hexdigest() != meta["sha256"]:
            raise CorruptCheckpoint(f"{fpath} does not match its SHA-256 in the manifest (corrupt)")
    return manifest


def find_latest(ckpt_dir: Path, warnings: list[str]) -> Found | None:
    """The newest checkpoint that verifies; each one skipped on the way adds a warning that
    names the bad file and the checkpoint used instead."""
    skipped: list[tuple[str, str]] = []
    for path in candidates(ckpt_dir):
        try:
            manifest = verify(path)
        except CorruptCheckpoint as e:
            skipped.append((path.name, str(e)))
            continue
        warnings.extend(
            f"skipped checkpoint {name}: {why}; using the previous valid one, {path.name}" for name, why in skipped
        )
        return Found(path, int(manifest["step"]), manifest)
    warnings.extend(
        f"skipped checkpoint {name}: {why}; no older valid checkpoint, starting at step 0" for name, why in skipped
    )
    return None


def load_found(path: Path) -> Found:
    """--resume PATH: that checkpoint, verified (a bad one is a usage error, not skipped)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"--resume {str(path)!r} is not a checkpoint directory")
    try:
        manifest = verify(path)
    except CorruptCheckpoint as e:
        raise ValueError(f"--resume {str(path)!r}: {e}") from None
    return Found(path, int(manifest["step"]), manifest)


def load_tensors(path: Path, name: str) -> dict[str, Any]:
    return unflatten(read_tensors(path / name))
