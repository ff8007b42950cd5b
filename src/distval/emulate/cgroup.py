"""CPU limits for emulated nodes: one cgroup per limited node, with a CFS bandwidth quota.

A node limited to c cores runs its torchrun, and with it every worker (a child starts in its
parent's cgroup), in the cgroup dv-<pid>-n<i>, which may use c x 100 ms of CPU time per 100 ms
period, shared by all its processes: a node with `--cpu 0.25` computes as if it had a quarter of
a core, the one slow node that holds back every collective. Two kinds of hierarchy:

    cgroup v2  a cgroup2 mount (/sys/fs/cgroup) whose cgroup.controllers lists cpu:
               <mount>/dv-<pid>-n<i>/cpu.max = "QUOTA PERIOD"; the mount's cgroup.subtree_control
               must hold cpu for its children to have cpu.max (enabled here when it does not)
    cgroup v1  a `cgroup` mount with the cpu option (/sys/fs/cgroup/cpu or .../cpu,cpuacct):
               <mount>/dv-<pid>-n<i>/cpu.cfs_period_us and cpu.cfs_quota_us

v2 is used where it has the cpu controller; a hybrid host (cgroup2 at /sys/fs/cgroup/unified
with no controllers, the cpu controller bound to v1) uses v1.

Joining: the launcher opens the cgroup's cgroup.procs and hands the open file to the node; the
node's agent (agent.py) writes its own pid into it before it imports torch or starts a worker,
so nothing the node runs can fork outside the limit (the launcher writing the child's pid after
Popen would race the child). A file descriptor, not a path, because inside the node `ip netns
exec` has mounted a fresh /sys, without the cgroup hierarchies under /sys/fs/cgroup. Removal: what is still inside
is killed, then rmdir (the control files go with the folder), retried for a moment because a
killed process leaves its cgroup only when it has exited.

Reference: the kernel's Documentation/scheduler/sched-bwc.rst (v1 and v2 files) and
Documentation/admin-guide/cgroup-v2.rst ("cpu.max", "No Internal Process Constraint").
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from distval.results import CannotRun

MOUNTS = Path("/proc/self/mounts")
PERIOD_US = 100_000  # the kernel's default CFS period: 100 ms
MIN_QUOTA_US = 1_000  # the kernel refuses quotas under 1 ms


@dataclass(frozen=True)
class CpuController:
    version: int  # 1 or 2
    root: Path  # the hierarchy's mount point: the nodes' cgroups are made right under it

    @property
    def files(self) -> str:
        return "cpu.max" if self.version == 2 else "cpu.cfs_quota_us/cpu.cfs_period_us"

    def describe(self) -> str:
        return f"cgroup v{self.version} {self.files} under {self.root}"


def find_controller(mounts_text: str | None = None) -> CpuController | None:
    """The hierarchy that can limit CPU, from /proc/self/mounts (or `mounts_text`): the first
    cgroup2 mount whose cgroup.controllers lists cpu, else the first v1 mount with the cpu option,
    else None."""
    if mounts_text is None:
        try:
            mounts_text = MOUNTS.read_text()
        except OSError:
            return None
    mounts = [(_unescape(f[1]), f[2], f[3].split(",")) for f in (line.split() for line in mounts_text.splitlines())
              if len(f) >= 4]
    for point, fstype, _ in mounts:
        if fstype == "cgroup2" and "cpu" in _read(Path(point) / "cgroup.controllers").split():
            return CpuController(2, Path(point))
    for point, fstype, options in mounts:
        if fstype == "cgroup" and "cpu" in options:
            return CpuController(1, Path(point))
    return None


def require_controller() -> CpuController:
    """CannotRun (exit 3) when no hierarchy here can limit CPU."""
    ctl = find_controller()
    if ctl is None:
        raise CannotRun("--cpu needs the cgroup cpu controller, and this host has none mounted (no cgroup2 mount "
                        "listing cpu in cgroup.controllers, no cgroup v1 cpu hierarchy in /proc/self/mounts); "
                        "run without --cpu or mount it (mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu)")
    return ctl


def quota_us(cores: float) -> int:
    """CPU time per period for `cores` cores: 0.25 -> 25000 us per 100000 us."""
    return max(MIN_QUOTA_US, round(cores * PERIOD_US))


def create(ctl: CpuController, name: str, cores: float) -> Path:
    """The cgroup `name` under the controller's root, limited to `cores`; CannotRun (and nothing
    left behind) if the kernel refuses."""
    path = ctl.root / name
    if ctl.version == 2:
        _enable_cpu_for_children(ctl.root)
    try:
        path.mkdir()
    except OSError as e:
        raise CannotRun(f"cannot create the cgroup {path} ({ctl.describe()}): {e.strerror or e}") from None
    try:
        if ctl.version == 2:
            (path / "cpu.max").write_text(f"{quota_us(cores)} {PERIOD_US}\n")
        else:  # the period first: the quota is checked against it
            (path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (path / "cpu.cfs_quota_us").write_text(f"{quota_us(cores)}\n")
    except OSError as e:
        remove(path)
        raise CannotRun(f"cannot set a CPU quota in {path} ({ctl.describe()}): {e.strerror or e}") from None
    return path


def _enable_cpu_for_children(root: Path) -> None:
    control = root / "cgroup.subtree_control"
    if "cpu" in _read(control).split():
        return
    try:
        control.write_text("+cpu\n")
    except OSError as e:
        # EBUSY: v2's "no internal process" rule (a non-root cgroup with processes cannot hand
        # controllers to children), typical in a container whose processes sit in its root
        raise CannotRun(f"cgroup v2 at {root} has the cpu controller but cannot enable it for child cgroups "
                        f"(writing +cpu to {control}: {e.strerror or e}); run without --cpu, or on a host or "
                        f"container whose processes are not in {root} itself") from None


def open_procs(path: str | Path) -> int:
    """The cgroup's cgroup.procs, open for writing, as a descriptor a child can inherit
    (`pass_fds`) and join through (`join_fd`)."""
    return os.open(Path(path) / "cgroup.procs", os.O_WRONLY)


def join_fd(fd: int) -> None:
    """Move this process into the cgroup whose cgroup.procs `fd` is, and close it (the workers
    need not hold it); the children it starts from now on are in the cgroup too."""
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


def pids(path: str | Path) -> list[int]:
    return [int(p) for p in _read(Path(path) / "cgroup.procs").split()]


def children(ctl: CpuController, prefix: str) -> list[str]:
    """Names of the cgroups right under the controller's root that start with `prefix`."""
    try:
        return sorted(p.name for p in ctl.root.iterdir() if p.is_dir() and p.name.startswith(prefix))
    except OSError:
        return []


def remove(path: str | Path, wait_s: float = 5.0) -> None:
    """Kill what still runs in the cgroup and remove it. Never raises: cleaning must get as far
    as it can (a cgroup that will not go is left for `distval emulate --clean`)."""
    path = Path(path)
    deadline = time.monotonic() + wait_s
    while path.exists():
        for pid in pids(path):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:  # EBUSY: a killed process has not exited yet
                return
            time.sleep(0.05)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _unescape(field: str) -> str:
    """/proc/mounts writes spaces, tabs, newlines and backslashes in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
