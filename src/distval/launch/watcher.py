"""The per-node watchdog of a distval job started by an outer launcher (torchrun, Slurm): a
process of its own, not a thread inside a rank, so that it outlives a stopped or dying rank.

Local rank 0 of each node starts it (`start`, from launch/worker.py) in a session of its own (the
outer launcher stopping the workers does not stop it). Every 0.5 s it is the node's `NodeAgent`
(health/digest.py): its ranks' heartbeats and statuses from the job's store, their process
states from /proc, one digest back to the store. Node 0's also runs the leader: the same
`Watchdog` as local mode over every node's digest, which publishes its verdict. Each node's
watcher, once it reads a verdict, prints it and stops its own ranks (SIGTERM, then SIGKILL), so
the outer launcher sees the job fail. It exits then, or once no rank of its node runs (the job
ended).

    python -m distval.launch.watcher '<json: plan()'s spec>'
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

from distval.health import digest, ranks_text
from distval.health.config import HangPolicy
from distval.health.hang import Hang, summary
from distval.health.procs import process_state, stop_pids
from distval.health.watchdog import Watchdog
from distval.launch import channel
from distval.protocol import Kind

TICK_S = 0.5
STORE_TIMEOUT_S = 2.0


def plan(env: dict[str, str], policy: HangPolicy) -> dict[str, Any] | None:
    """What this node's watcher watches, from the outer launcher's variables; None where this
    process is not its node's local rank 0, or its node's ranks are not known. A node's ranks are
    RANK - LOCAL_RANK on, contiguous (torchrun's assignment, and srun's default block
    distribution); its size is LOCAL_WORLD_SIZE (torchrun) or SLURM_STEP_TASKS_PER_NODE where every
    node has the same; its index GROUP_RANK (torchrun) or SLURM_NODEID."""
    per_node = env.get("LOCAL_WORLD_SIZE") or _same_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""))
    if env.get("LOCAL_RANK", "0") != "0" or not per_node or not env.get("MASTER_ADDR"):
        return None
    rank, local_world, world = int(env["RANK"]), int(per_node), int(env["WORLD_SIZE"])
    if world % local_world:
        return None
    return {"store": f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
            "node": int(env.get("GROUP_RANK") or env.get("SLURM_NODEID") or rank // local_world),
            "nodes": world // local_world, "ranks": list(range(rank, rank + local_world)), "world_size": world,
            "floor_s": policy.floor_s, "kill_after_s": policy.kill_after_s,
            "attempt": int(env.get("TORCHELASTIC_RESTART_COUNT", "0")), "parent": os.getpid()}


def _same_tasks_per_node(text: str) -> str | None:
    """"8(x4)" or "8": 8; "8,4(x2)" (nodes of different sizes): None."""
    return text.split("(")[0] if text and "," not in text else None


def start(spec: dict[str, Any]) -> subprocess.Popen:
    """The node's watcher, in a session of its own; its lines go to this process's stderr."""
    return subprocess.Popen([sys.executable, "-m", "distval.launch.watcher", json.dumps(spec)],
                            start_new_session=True, stdin=subprocess.DEVNULL, stdout=2)


def run(spec: dict[str, Any]) -> Hang | dict[str, Any] | None:
    """The watcher's loop; returns the leader's hang (node 0), the verdict read (other nodes), or
    None when the job ended without one."""
    # a short timeout: once the job ends the store's host (torchrun's agent) goes, and a client
    # retries a request for the whole timeout before it gives up
    try:
        store = channel.connect(spec["store"], timeout_s=STORE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 (the job ended before this process was up)
        return None
    reader = channel.ChannelReader(store)

    def put(kind: str, index: int, payload: dict[str, Any]) -> None:
        # a store whose host is gone: the job is ending, and the loop ends once its ranks have
        with contextlib.suppress(Exception):
            channel.put(store, kind, index, payload)

    # the ranks publish to the job's store: it is this node's store (the leader reads a mismatch's
    # fingerprints there) and the central one
    node = digest.NodeAgent(spec["node"], spec["ranks"], reader, reader,
                            lambda kind, payload: put(kind, spec["node"], payload), store=spec["store"])
    found: list[Hang] = []

    def declared(hang: Hang) -> None:
        found.append(hang)
        put(Kind.VERDICT, 0, {**digest.verdict(hang), "attempt": spec["attempt"]})

    leader = None
    if spec["node"] == 0:
        policy = HangPolicy(floor_s=spec["floor_s"], kill_after_s=spec["kill_after_s"])
        leader = Watchdog(spec["world_size"], policy, declared, every_s=TICK_S)
    digests = digest.DigestReader(reader, spec["nodes"], channel.ChannelReader)
    gc.freeze()  # torch's objects out of the collector's full passes: ~100 ms each, 1 tick in 50 at 4,096 ranks
    while True:
        # the job ended once no rank of this node runs (an earlier attempt's heartbeats name
        # processes long gone; before any heartbeat, the rank that started this watcher counts)
        pids = [pid for pid in (node.last or {}).get("pids", []) if pid]
        if all(process_state(pid) in ("gone", "Z") for pid in [*pids, spec["parent"]]):
            return None
        verdict = node.tick()
        if verdict and verdict.get("attempt") != spec["attempt"]:
            verdict = None  # an earlier attempt's, before torchrun restarted the workers
        if leader is not None and not found:
            leader.tick(digests)
        if found or verdict:
            hang = found[0] if found else None
            text = summary(hang) if hang else verdict["verdict"]
            print(f"distval: node {spec['node']} watchdog: {text}; stopping "
                  f"{ranks_text(spec['ranks'])} on this node", file=sys.stderr, flush=True)
            stop_pids([pid for pid in node.last["pids"] if pid])  # type: ignore[index]
            return hang or verdict
        time.sleep(TICK_S)


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
