"""Facts about a rank's process read from outside it, and its ending: the /proc state letter and
CPU time, its Python stack (py-spy), the frame it is in; SIGTERM then SIGKILL. The hang watchdog
(health/watchdog.py), the node digests (health/digest.py) and the launcher read them here."""

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
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = stat_fields(f.read())
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def py_spy() -> tuple[str | None, str]:
    """The py-spy binary, or None and why not."""
    path = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(path):
        return None, "py-spy is not installed (pip install py-spy)"
    return path, ""


def stack_of(pid: int, binary: str) -> tuple[str | None, str]:
    """The Python stack of every thread of `pid` (py-spy dump, without pausing the process)."""
    try:
        res = subprocess.run([binary, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True,
                             timeout=STACK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"py-spy took over {STACK_TIMEOUT_S:g} s"
    if res.returncode != 0:
        why = (res.stderr or res.stdout).strip().splitlines()
        reason = why[-1] if why else f"exit {res.returncode}"
        if "ermission" in reason or "ptrace" in reason.lower():
            reason += " (py-spy needs the ptrace capability: run as root or with CAP_SYS_PTRACE)"
        return None, reason
    return res.stdout, ""


def main_frames(stack: str) -> list[str]:
    """The frames of the main thread, innermost first ("fn (file:line)")."""
    frames, in_main = [], False
    for line in stack.splitlines():
        if line.startswith("Thread "):
            in_main = '"MainThread"' in line
        elif in_main and line.startswith("    ") and "(" in line:
            frames.append(line.strip())
    return frames


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
