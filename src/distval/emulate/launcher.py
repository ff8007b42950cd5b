"""Run a distval command on an emulated cluster: one torchrun per node, each in its namespace.

    node i:  ip netns exec dv-<pid>-n<i> unshare --uts -- sh -c 'hostname dv-<pid>-n<i>; exec ...'
             python -m distval.emulate.agent [--cgroup-fd FD]   (torchrun's main)
                 --nnodes N --nproc-per-node P --node-rank i
                 --rdzv-backend c10d --rdzv-endpoint 10.77.0.1:29400 --rdzv-id dv-<pid>
                 --local-addr 10.77.0.<i+1> [--rdzv-conf is_host=true on node 0] --max-restarts 0
                 -m distval.cli.node <the distval command>

c10d rendezvous orders nodes by their address, so global rank 0 runs on node 0, whose
`--local-addr` becomes every worker's MASTER_ADDR; GLOO_SOCKET_IFNAME=eth0 unless the run is the
decoy-NIC drill. A node with a CPU limit joins its cgroup dv-<pid>-n<i> before torchrun starts,
so its workers inherit the quota (agent.py, through FD: the cgroup's cgroup.procs, opened here
because `ip netns exec` mounts a fresh /sys without the cgroup hierarchies). Each node's output
is streamed with the node's name in front of every line.
Like `srun --kill-on-bad-exit`, the first node that fails ends the job on every node (unless
keep_going). Whatever happens (normal end, a failure, Ctrl-C, SIGTERM, SIGHUP) the namespaces and
everything in them (and the nodes' CPU cgroups) are removed before returning.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from distval import envvars
from distval.emulate import cgroup, netns
from distval.emulate.netns import Cluster, Topology

RDZV_PORT = 29400
# Variables of an outer launcher that must not leak into the nodes' torchrun (it sets its own).
_OUTER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
          "TORCHELASTIC_", "SLURM_", "OMPI_COMM_WORLD_", "PMI_")


@dataclass
class NodeRun:
    index: int
    proc: subprocess.Popen
    last_error: str = ""  # the node's last "distval: error:" line
    threads: list[threading.Thread] = field(default_factory=list)


def torchrun_argv(cluster: Cluster, i: int, inner: list[str], run_dir: str, cgroup_fd: int | None = None) -> list[str]:
    """The node's torchrun; its workers' log folders in `run_dir` (removed at the end: without
    --log-dir torchrun leaves a /tmp/torchelastic_* folder behind per node and run); `cgroup_fd`:
    the node's cgroup.procs, which the agent joins first."""
    topo = cluster.topo
    argv = [sys.executable, "-m", "distval.emulate.agent", *(["--cgroup-fd", str(cgroup_fd)] if cgroup_fd else []),
            "--nnodes", str(topo.num_nodes),  # torchrun, quieter
            "--nproc-per-node", str(topo.nproc_per_node), "--node-rank", str(i),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{cluster.address(0)}:{RDZV_PORT}",
            "--rdzv-id", cluster.tag, "--local-addr", cluster.address(i), "--max-restarts", "0",
            "--log-dir", os.path.join(run_dir, f"torchrun-n{i}")]
    if i == 0:
        argv += ["--rdzv-conf", "is_host=true"]
    return argv + ["-m", "distval.cli.node", *inner]


def node_env(cluster: Cluster, run_dir: str, latency_emulated: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OUTER)}
    env[envvars.EMULATED.name] = json.dumps(cluster.topo.meta(latency_emulated))
    env[envvars.EMULATE_DIR.name] = run_dir
    env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun and the local launcher do: workers share the cores
    if cluster.topo.decoy:
        env.pop("GLOO_SOCKET_IFNAME", None)  # the drill: let Gloo pick the interface itself
    else:
        env["GLOO_SOCKET_IFNAME"] = "eth0"
    return env


class _Stop(Exception):
    """SIGTERM or SIGHUP arrived: unwind through the finally blocks that clean up."""


def run(topo: Topology, inner: list[str], keep_going: bool = False, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    """Build the cluster, run `inner` (a distval command line) on it, remove the cluster; return
    the exit code of the rank that decided the outcome (see `_exit_code`)."""
    out, err = out or sys.stdout, err or sys.stderr
    netns.require_environment()
    cpu = cgroup.require_controller() if topo.cpu_cores else None
    cleaned = netns.clean_leftovers()
    if cleaned:
        print(f"distval: removed leftovers of a crashed emulate run: {', '.join(cleaned)}", file=err)
    latency_emulated = topo.latency_s > 0 and netns.netem_available()
    if topo.latency_s > 0 and not latency_emulated:
        print("distval: warning: --latency not emulated: this kernel has no netem qdisc (tbf has no delay); "
              "the links add only the few microseconds of a veth hop", file=err)
    cluster = Cluster(topo, with_delay=latency_emulated, cpu=cpu)
    run_dir = tempfile.mkdtemp(prefix="distval-emulate-")
    nodes: list[NodeRun] = []
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}

    def _raise_stop(signum: int, frame: Any) -> None:
        raise _Stop()

    for sig in saved:
        signal.signal(sig, _raise_stop)
    try:
        cluster.create()
        print(_startup_line(cluster, latency_emulated), file=out, flush=True)
        env = node_env(cluster, run_dir, latency_emulated)
        lock = threading.Lock()
        for i in range(topo.num_nodes):
            proc = _start_node(cluster, i, inner, run_dir, env)
            node = NodeRun(i, proc)
            node.threads = [_pump(node, proc.stdout, out, lock, False), _pump(node, proc.stderr, err, lock, True)]
            nodes.append(node)
        first_failed = _supervise(nodes, keep_going)
        for node in nodes:
            for t in node.threads:
                t.join(timeout=5)
        code, message = _exit_code(nodes, first_failed, run_dir, cluster, stopped=not keep_going and topo.num_nodes > 1)
        if message:
            print(f"distval: error: {message}", file=err, flush=True)
        return code
    except (KeyboardInterrupt, _Stop):
        print("distval: interrupted; stopping the nodes and removing the emulated cluster", file=err, flush=True)
        return 130
    finally:
        _stop(nodes)
        cluster.destroy()
        shutil.rmtree(run_dir, ignore_errors=True)
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _start_node(cluster: Cluster, i: int, inner: list[str], run_dir: str, env: dict[str, str]) -> subprocess.Popen:
    """Node i's torchrun, in its own session (so the whole node can be signalled). A node with a
    CPU limit inherits an open cgroup.procs of its cgroup: the agent writes its pid there before
    anything else, and the path would not resolve inside the node (`ip netns exec` remounts /sys)."""
    limit = cluster.cgroup_of(i)
    fd = cgroup.open_procs(limit) if limit else None
    try:
        return subprocess.Popen(cluster.node_argv(i, torchrun_argv(cluster, i, inner, run_dir, fd)), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", bufsize=1, start_new_session=True,
                                pass_fds=() if fd is None else (fd,))
    finally:
        if fd is not None:
            os.close(fd)  # the node holds its own copy


def _startup_line(cluster: Cluster, latency_emulated: bool) -> str:
    """What was built, in one line; per-node rates and CPU limits as comma lists when they differ."""
    topo, meta = cluster.topo, cluster.topo.meta(latency_emulated)
    bursts = meta["burst_bytes"]
    line = (f"distval emulate: {topo.num_nodes} node(s) x {topo.nproc_per_node} proc(s), {cluster.tag}-n0.."
            f"n{topo.num_nodes - 1} on {netns.SUBNET}.0/24, {meta['rate']} per direction "
            f"(tbf burst {bursts if isinstance(bursts, int) else ','.join(map(str, bursts))} B), "
            f"latency {meta['latency']}{'' if latency_emulated or topo.latency_s == 0 else ' (not emulated)'}")
    if topo.cpu_cores:
        line += f", cpu {topo.cpu_text()} core(s) per node ({cluster.cpu.describe()})"
    if topo.decoy:
        line += f", decoy NIC decoy0 on {netns.DECOY_SUBNET}.0/24"
    return line


def _pump(node: NodeRun, stream: TextIO, sink: TextIO, lock: threading.Lock, is_err: bool) -> threading.Thread:
    def loop() -> None:
        for line in stream:
            line = line.rstrip("\n")
            if "distval: error:" in line:  # the node's own one-line error (torchrun's chatter is not kept)
                node.last_error = line.strip()
            with lock:
                print(f"n{node.index} | {line}", file=sink, flush=True)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def _supervise(nodes: list[NodeRun], keep_going: bool) -> NodeRun | None:
    """Wait for every node; the first that fails stops the others unless keep_going."""
    first_failed = None
    while True:
        running = [n for n in nodes if n.proc.poll() is None]
        for n in nodes:
            if first_failed is None and n.proc.returncode not in (None, 0):
                first_failed = n
                if not keep_going:
                    _stop(running)
        if not running:
            return first_failed
        time.sleep(0.05)


def _stop(nodes: list[NodeRun], grace_s: float = 5.0) -> None:
    """SIGTERM to each node's process group (torchrun's agent stops its workers), SIGKILL after
    the grace period."""
    alive = [n for n in nodes if n.proc.poll() is None]
    for n in alive:
        _signal_group(n.proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for n in alive:
        try:
            n.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(n.proc, signal.SIGKILL)
            n.proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return


def _exit_code(nodes: list[NodeRun], first_failed: NodeRun | None, run_dir: str, cluster: Cluster,
               stopped: bool) -> tuple[int, str]:
    """(exit code, error line or ""). All nodes fine: rank 0's code. Otherwise the code of the first
    node that failed, from its ranks' notes (a rank that left none died or was killed: 3); an error
    line names that node unless it is rank 0 reporting a FAIL (the report says it)."""
    notes = []
    for name in os.listdir(run_dir):
        if name.startswith("exit.") and name.endswith(".json"):
            try:
                with open(os.path.join(run_dir, name)) as f:
                    notes.append(json.load(f))
            except (OSError, ValueError):
                continue
    rank0 = next((n["code"] for n in notes if n.get("rank") == 0), None)
    if first_failed is None:
        return (rank0 if rank0 is not None else 0), ""
    mine = [n for n in notes if n.get("host") == cluster.node(first_failed.index)]  # hostname = node name
    codes = [n["code"] for n in mine if n.get("code")]
    code = max(codes) if codes else 3
    if first_failed.index == 0 and rank0 == 1:
        return 1, ""
    how = (f"exit code {code}" if codes else f"torchrun exit code {first_failed.proc.returncode}, no rank note")
    detail = first_failed.last_error.split("distval: error: ", 1)[-1]
    return code, (f"emulated node n{first_failed.index} failed first ({how})"
                  + (f": {detail}" if detail else f"; see the lines of n{first_failed.index} above")
                  + ("; the other nodes were stopped" if stopped else ""))
