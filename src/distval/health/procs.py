"""Facts about a rank's process read from outside it, and its ending: the /proc state letter and
CPU time, its scheduling (run-queue delay, its cgroup's throttling), the job's processes and the
host's busy time, its Python stack (py-spy), the frame it is in; SIGTERM then SIGKILL. The hang
watchdog (health/watchdog.py), the lost-time rule (health/lost.py), the node digests
(health/digest.py) and the launcher read them here."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from distval.health.pauses import user_frames

STACK_TIMEOUT_S = 10.0


def stat_fields(raw: bytes) -> list[bytes]:
    """The fields of a /proc/<pid>/stat after the command name (which may hold spaces and ')'):
    [0] the state letter, [1] the parent's pid, [11] utime and [12] stime in clock ticks."""
    return raw.rsplit(b")", 1)[1].split()


def process_state(pid: int) -> str:
    """R running, S sleeping, D disk wait, T stopped, t traced, Z zombie; "gone" if no process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return stat_fields(f.read())[0].decode()
    except (OSError, IndexError):
        return "gone"


def cpu_seconds(pid: int) -> float | None:
    ticks = cpu_ticks(pid)
    return None if ticks is None else ticks / os.sysconf("SC_CLK_TCK")


def read_state(fd: int) -> str:
    """The state letter of an open /proc/<pid>/stat ("" once the process is gone)."""
    try:
        return stat_fields(os.pread(fd, 512, 0))[0].decode()
    except (OSError, IndexError):
        return ""


def throttled_s(pid: int) -> float:
    """The cumulative time the CPU cgroup of `pid` was throttled by its quota, in seconds (cgroup
    v1 `cpu.stat` throttled_time, v2 throttled_usec; 0 in a cgroup without a quota or stats)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return 0.0
    stats = [(f"/sys/fs/cgroup/cpu{path}/cpu.stat", "throttled_time", 1e9) for _, controllers, path in lines
             if "cpu" in controllers.split(",")]  # v1
    stats += [(f"/sys/fs/cgroup{path}/cpu.stat", "throttled_usec", 1e6) for hid, controllers, path in lines
              if hid == "0" and not controllers]  # v2
    for stat, key, unit in stats:
        try:
            with open(stat) as f:
                values = dict(line.split() for line in f if line.strip())
            return int(values[key]) / unit
        except (OSError, ValueError, KeyError):
            continue
    return 0.0


def scheduled_s(pid: int) -> tuple[float, float] | None:
    """The time every thread of `pid` ran on a CPU and waited runnable in the run queue, summed,
    in seconds (None: gone, or a kernel without schedstat)."""
    ran = queued = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            ran, queued = ran + int(fields[0]), queued + int(fields[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
    return ran / 1e9, queued / 1e9


def host_busy_ticks() -> int | None:
    """The host's busy CPU time in ticks: user, nice, system, irq, softirq (not idle, iowait, steal)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return sum(int(fields[i]) for i in (1, 2, 3, 6, 7))
    except (OSError, ValueError, IndexError):
        return None


def cpu_ticks(pid: int) -> int | None:
    """A process's CPU time (utime + stime, every thread), in ticks; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = stat_fields(f.read())
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def job_family(pids: set[int]) -> set[int]:
    """The job on this host: the ranks' `pids`, their parents (an agent, a launcher) and every
    descendant of them or of this process (data loader workers, a fork server), from one scan of
    /proc."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    parent[int(name)] = int(stat_fields(f.read())[1])
            except (OSError, ValueError, IndexError):
                continue
    family = set(pids) | {parent[p] for p in pids if parent.get(p, 1) > 1} | {os.getpid()}
    grew = True
    while grew:
        more = {p for p, pp in parent.items() if pp in family and p not in family}
        family |= more
        grew = bool(more)
    return family


def py_spy() -> tuple[str | None, str]:
    """The py-spy binary, or None and why not."""
    path = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(path):
        return None, "py-spy is not installed (pip install py-spy)"
    return path, ""


def stack_of(pid: int, binary: str, tries: int = 3) -> tuple[str | None, str]:
    """The Python stack of every thread of `pid` (py-spy dump, without pausing the process). A
    read of a running process can race with it ("Failed to copy PyCodeObject", seen on a loaded
    host): tried again, up to `tries` times in all, but never past a missing permission."""
    for _ in range(tries):
        try:
            res = subprocess.run([binary, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True,
                                 text=True, timeout=STACK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"py-spy took over {STACK_TIMEOUT_S:g} s"
        if res.returncode == 0:
            return res.stdout, ""
        why = (res.stderr or res.stdout).strip().splitlines()
        reason = why[-1] if why else f"exit {res.returncode}"
        if "ermission" in reason or "ptrace" in reason.lower():
            return None, reason + " (py-spy needs the ptrace capability: run as root or with CAP_SYS_PTRACE)"
        if process_state(pid) in ("gone", "Z"):
            break
    return None, reason


def main_frames(stack: str) -> list[str]:
    """The frames of the main thread, innermost first ("fn (file:line)"): the thread py-spy names
    "MainThread", else (a read that raced with the process can lose the names) the one whose
    outermost frame is a script's `<module>`."""
    threads: list[tuple[bool, list[str]]] = []
    for line in stack.splitlines():
        if line.startswith("Thread "):
            threads.append(('"MainThread"' in line, []))
        elif threads and line.startswith("    ") and "(" in line:
            threads[-1][1].append(line.strip())
    named = [frames for main, frames in threads if main]
    return named[0] if named else script_thread([frames for _, frames in threads]) or []


def script_thread(threads: list[list[str]]) -> list[str] | None:
    """Of threads' frames ("fn (file:line)", innermost first), the thread running a script: its
    outermost frame is the script's `<module>`."""
    return next((frames for frames in threads if frames and frames[-1].startswith("<module> (")), None)


def where(stack: str | None) -> str:
    """The innermost frame of the main thread outside torch and the standard library: the line
    of the user's (or distval's) code the rank is in."""
    if not stack:
        return ""
    frames = main_frames(stack)
    own = user_frames(frames)
    return own[-1] if own else (frames[0] if frames else "")


def stop_pids(pids: list[int], grace_s: float = 2.0) -> None:
    """SIGTERM each (a rank's handler publishes its state and exits), then SIGKILL what is left
    (a rank blocked in a collective, or stopped)."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(process_state(p) not in ("gone", "Z") for p in pids):
        time.sleep(0.1)
    for pid in pids:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return
