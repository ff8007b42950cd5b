"""A launched script's numerics, replicas and memory, seen from its optimizer steps (rank side; the
launcher's rules are health/script.py's).

The shim (launch/shim.py) gives the step clock (health/steps.py) a `Probe`; at each `step()` of
the script's first optimizer it notes, on the training thread:
  memory    the device's current and peak allocation (host RSS on CPU): two counters, every step,
            carried in the clock's step rows
  numerics  every `nan_every` steps, whether a gradient or a parameter of the optimizer is
            non-finite: one L2 norm per tensor (a fused foreach kernel), NaN and Inf kept by it,
            copied to the host in stream order and read one step later on a GPU (no host sync in
            the step, readback.py); the first non-finite tensor named as the script's model names it
  replicas  every `replicas_every` steps, an exact checksum of each parameter (health/monitor.py
            `replica_checksums`, the one `distval train` compares), read back the same way
No collective is added: the step clock's publisher thread puts what was noted on the rank channel
(kinds `probe` and, once, `probe_names`) and the launcher compares the ranks.

The model is found once, at the first step (`find_model`), and a parameter is named by its key in
the state_dict of the outermost module the user built, without the prefixes wrappers add: of the
live modules holding the most of the optimizer's parameters, the one no other of them contains,
descended while it is a library's wrapper (DDP, DataParallel, FSDP1, torch.compile, activation
checkpointing, Lightning, Fabric, accelerate, DeepSpeed: `wrapped_child`), whose attribute is
also left out of a name wherever a wrapper sits deeper (a compiled or checkpointed block).
Its replica `layout` says what may be compared: `ddp` (a DDP holds every parameter: replicas by
construction), `plain` (replicas if equal at the first check), `sharded` (FSDP2 DTensors: the ranks
holding the same shard coordinates; FSDP1's flat shards: none).
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import threading
import warnings
import zlib
from typing import Any, NamedTuple

import torch

from distval import device as devices
from distval import envvars
from distval.health.monitor import replica_checksums
from distval.readback import Readback, lag_for, to_host

ENV = envvars.PROBE.name  # "NAN_EVERY:REPLICAS_EVERY" (0: off), set by `distval launch` for every worker
CHECKS_KEPT = 4  # replica checksums kept per publication: ranks publish at their own pace


def from_env() -> tuple[int, int]:
    """(nan_every, replicas_every) as `distval launch` asked; (0, 0) outside it."""
    nan, _, replicas = os.environ.get(ENV, "0:0").partition(":")
    return int(nan or 0), int(replicas or 0)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard on this rank


# Where the classes of wrappers come from: a module of one of these (and of nothing else: FSDP2
# turns a user's `Net` into `FSDPNet`, made in torch.distributed) that holds its parameters under
# one child is a wrapper, whose attribute is no part of the user's names.
WRAPPER_PACKAGES = ("torch.nn.parallel", "torch.distributed", "torch._dynamo", "lightning", "pytorch_lightning",
                    "lightning_fabric", "accelerate", "deepspeed")


class Model(NamedTuple):
    """The script's model as `find_model` found it."""
    module: Any  # the outermost module the user built holding the optimizer's parameters (None: none does)
    names: dict[int, str]  # each parameter's key in its state_dict (wrappers' attributes left out), by id
    holders: list[Any]  # every live module holding as many: the module, its wrappers, the modules inside it


def _from_wrapper_package(cls: type) -> bool:
    return any(cls.__module__ == p or cls.__module__.startswith(p + ".") for p in WRAPPER_PACKAGES)


def wrapped_child(module: Any) -> str | None:
    """The attribute under which `module` wraps the user's module, or None when it is no wrapper:
    its class, and every module class it derives from, come from a wrapper package, it has no
    parameter of its own and one child holds all of its parameters (Fabric's `_forward_module`
    and `_original_module` both do: the first)."""
    mro = [c for c in type(module).__mro__ if issubclass(c, torch.nn.Module) and c is not torch.nn.Module]
    if not mro or not all(map(_from_wrapper_package, mro)):
        return None
    if any(p is not None for p in module._parameters.values()):
        return None
    held = {id(p) for p in module.parameters()}
    return next((name for name, child in module._modules.items()
                 if held and child is not None and {id(p) for p in child.parameters()} == held), None)


def unwrap(module: Any) -> Any:
    """`module` descended through the wrappers around it (DDP(Lightning's wrapper(LitModel)): the
    LitModel)."""
    seen = set()
    while (child := wrapped_child(module)) is not None and id(module) not in seen:
        seen.add(id(module))
        module = module._modules[child]
    return module


def param_names(module: Any) -> dict[int, str]:
    """Each parameter's key in `module`'s state_dict, by id, in `named_parameters()` order (a shared
    one named where first met), a wrapper's attribute left out wherever one sits (torch does so
    itself for a checkpointed block's state_dict). An FSDP1 flat parameter is named by the keys it
    holds: `net.0.weight .. net.2.bias`."""
    names: dict[int, str] = {}
    seen: set[int] = set()
    stack = [(module, "")]
    while stack:
        m, prefix = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        child = wrapped_child(m)
        if child is not None:
            stack.append((m._modules[child], prefix))
            continue
        for name, p in m._parameters.items():
            if p is not None and id(p) not in names:
                names[id(p)] = _key(prefix, name, p)
        stack.extend(reversed([(c, f"{prefix}{n}.") for n, c in m._modules.items() if c is not None]))
    return names


def _key(prefix: str, name: str, p: torch.Tensor) -> str:
    fqns = getattr(p, "_fqns", None) if getattr(p, "_is_flat_param", False) else None
    if not fqns:
        return prefix + name
    return prefix + fqns[0] if len(fqns) == 1 else f"{prefix}{fqns[0]} .. {prefix}{fqns[-1]}"  # FSDP1 flat


def find_model(params: list[torch.Tensor]) -> Model:
    """The script's model: of the live modules holding the most of `params` (the holders), the
    outermost (inside no other holder), descended through its wrappers, and its names; with
    several such, the one naming `params` shortest. Garbage is collected first, so a module no
    longer referenced (a rebuilt DDP, a temporary container left in a reference cycle) is none."""
    ids = {id(p) for p in params}
    gc.collect()
    with warnings.catch_warnings():  # isinstance on a deprecated module object warns (torch's reduce_op)
        warnings.simplefilter("ignore")
        modules = [obj for obj in gc.get_objects() if isinstance(obj, torch.nn.Module)]
    held = []
    for obj in modules:
        try:
            held.append((obj, sum(id(p) in ids for p in obj.parameters())))
        except Exception:  # noqa: BLE001 (a half-built or exotic module: not the model)
            continue
    most = max((n for _, n in held), default=0)
    if not most:
        return Model(None, {}, [])
    holders = [m for m, n in held if n == most]
    inside = {id(sub) for h in holders for sub in itertools.islice(h.modules(), 1, None)}
    roots = [h for h in holders if id(h) not in inside] or holders  # none: holders inside each other
    found = [(m, param_names(m)) for m in {id(m): m for m in map(unwrap, roots)}.values()]
    module, names = min(found, key=lambda f: sum(len(n) for i, n in f[1].items() if i in ids))
    return Model(module, names, holders)


def layout_of(model: Model, params: list[torch.Tensor]) -> tuple[str, list[int]]:
    """(`ddp` | `plain` | `sharded`, the shard coordinates of this rank: ranks with equal ones hold
    replicas). FSDP2 shards DTensors over mesh dimensions; the coordinates on the Shard ones pick
    the replica group (HSDP: the ranks across the replicate dimension)."""
    from torch.nn.parallel import DistributedDataParallel

    dtensor = next((p for p in params if hasattr(p, "device_mesh") and hasattr(p, "placements")), None)
    if dtensor is not None:
        coords = dtensor.device_mesh.get_coordinate() or []
        return "sharded", [c for c, pl in zip(coords, dtensor.placements) if pl.is_shard()]
    if any(getattr(p, "_is_flat_param", False) for p in params):  # FSDP1: every rank a different flat shard
        return "sharded", [int(os.environ.get("RANK", "0"))]
    ids = {id(p) for p in params}  # a DDP over part of them leaves the rest free to differ
    ddp = any(isinstance(m, DistributedDataParallel) and ids <= {id(p) for p in m.parameters()} for m in model.holders)
    return ("ddp" if ddp else "plain"), []


class Probe:
    """Noted in the optimizer-step hook (`stepped`), published by the step clock's thread
    (`payload`)."""

    def __init__(self, nan_every: int, replicas_every: int):
        self.nan_every, self.replicas_every = nan_every, replicas_every
        self.checks: collections.deque[dict[str, Any]] = collections.deque(maxlen=CHECKS_KEPT)
        self.nonfinite: dict[str, Any] | None = None  # the first one this rank saw
        self.checked = -1  # the last step whose NaN check was read back
        self.names: list[str] = []
        self.layout: tuple[str, list[int]] = ("plain", [])
        self.params: list[torch.Tensor] = []
        self.device = torch.device("cpu")
        self._readback: Readback[tuple[int, list[tuple[str, Any, Any]]]] | None = None
        self._version = 0
        self._lock = threading.Lock()  # noted on the training thread, read by the clock's publisher

    def start(self, optimizer: Any) -> None:
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        model = find_model(self.params)
        self.names = [model.names.get(id(p), f"optimizer parameter {i}") for i, p in enumerate(self.params)]
        self.layout = layout_of(model, self.params)
        self.device = _local(self.params[0]).device if self.params else torch.device("cpu")
        self._readback = Readback(lag_for("auto", self.device), self._finish)

    def stepped(self, step: int, optimizer: Any) -> tuple[int, int]:
        """The hook, on the training thread: nothing here waits for the device. Returns the
        memory held now and at peak (bytes: the device's allocator, or host RSS on CPU)."""
        if self._readback is None:
            self.start(optimizer)
        assert self._readback is not None
        noted = []  # read back one step later on a GPU (lag 1), at once on the host
        if self.nan_every and self.nonfinite is None and step % self.nan_every == 0:
            flags, where = self._nonfinite_flags()
            noted.append(("nan", to_host(flags), where))
        if self.replicas_every and step % self.replicas_every == 0:
            _, sums = replica_checksums(((n, _local(p)) for n, p in zip(self.names, self.params)), host=False)
            noted.append(("replicas", to_host(sums), None))
        self._readback.push((step, noted))
        current = devices.current_memory_bytes(self.device)
        return current, max(current, devices.peak_memory_bytes(self.device))  # RSS's peak is sampled apart

    def close(self) -> None:
        if self._readback is not None:
            self._readback.flush()

    def _nonfinite_flags(self) -> tuple[torch.Tensor, list[tuple[str, int]]]:
        """Per tensor (each gradient, then each parameter): its L2 norm, non-finite when an element
        is (or when the norm overflows: elements near 1e19, an exploded gradient all the same), and
        which (`gradient` | `parameter`, index in the optimizer) each one is."""
        where = [("gradient", i) for i, p in enumerate(self.params) if p.grad is not None] + \
            [("parameter", i) for i in range(len(self.params))]
        tensors = [_local(self.params[i].grad if kind == "gradient" else self.params[i]).detach() for kind, i in where]
        kept = [k for k, t in enumerate(tensors) if t.numel()]
        tensors, where = [tensors[k] for k in kept], [where[k] for k in kept]
        if not tensors:
            return torch.zeros(0), []
        try:  # the fused L2 norm: 16x faster than max-abs on a CPU; NaN and Inf carry through it
            norms = torch._foreach_norm(tensors)
        except (RuntimeError, TypeError, AttributeError):  # an older torch, or tensors on several devices
            norms = [torch.linalg.vector_norm(t) for t in tensors]
        return torch.stack([n.float().to(self.device) for n in norms]), where

    def _finish(self, pending: tuple[int, list[tuple[str, Any, Any]]]) -> None:
        step, noted = pending
        for what, host, where in noted:
            if what == "replicas":
                with self._lock:
                    self.checks.append({"step": step, "sums": [int(v) for v in host.tolist()]})
                    self._version += 1
                continue
            with self._lock:
                self.checked = step
                self._version += 1
            bad = (~torch.isfinite(host)).nonzero()
            if self.nonfinite is None and len(bad):
                first = int(bad[0])
                kind, index = where[first]
                with self._lock:
                    self.nonfinite = {"step": step, "what": kind, "param": self.names[index],
                                      "value": float(host[first])}
                    self._version += 1

    def names_payload(self) -> dict[str, Any]:
        """The parameters' names in checksum order (kind `probe_names`, published once)."""
        return {"names": self.names}

    def payload(self) -> tuple[int, dict[str, Any]]:
        """(a version that changes with what was noted, the payload of kind `probe`)."""
        with self._lock:
            return self._version, self._payload()

    def _payload(self) -> dict[str, Any]:
        return {
            "layout": self.layout[0], "shard": self.layout[1], "names_key": zlib.crc32("\n".join(self.names).encode()),
            "nonfinite": self.nonfinite, "checked": self.checked, "replicas": list(self.checks),
            "nan_every": self.nan_every, "replicas_every": self.replicas_every}
