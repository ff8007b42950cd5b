"""The health plane's stores at 64 to 4,096 simulated ranks, flat against node digests.

Simulated ranks (8 a node) publish a heartbeat and a status of the real size every 0.5 s; the
real watchdog code watches them, and a fault is injected into the live ranks after a steady
window; every process is real, every store a real c10d TCPStore (libuv, as torch's rendezvous
serves it), the central one in its own process:

  per rank   (the first design) the ranks publish to the central store; 4 watchdog processes
             (one per node in the real job) each read every rank's heartbeat with a check and a
             get per rank.
  batched    the same, each read one check and one multi_get (`ChannelReader.all`).
  digests    (health/digest.py) the ranks publish to their node's store; each node's `NodeAgent`
             reads its 8 ranks there, publishes one digest to the central store and checks for
             the leader's verdict; one leader `Watchdog` reads every digest through `DigestReader`.
             Each of the 4 host processes serves one store for all of its nodes (creating 512
             TCPStore servers on one machine takes minutes): every node still reads only its own
             ranks' keys, so the requests are those 512 node stores would serve between them.

Per row: requests per second to the central store (flat: scaled to one watchdog per 8-rank
node; digests: every node and the leader simulated, counted), a rank's publish (set) latency
p50/p99, a watchdog's (or the leader's) tick p50/p99, the central store process's CPU, and the
seconds from the fault to the verdict for a stopped rank, a skipped collective and a mismatched
one (the culprit is rank world/3; `pause` where the watchdog took it for ranks outside any
collective: a stopped rank on another host looks so without its node's /proc state).

    python benchmarks/health_plane_scale.py [--ranks 64,256,1024,4096] [--designs ...] [--faults ...]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d's warning per client socket without a host name

from distval.health.procs import cpu_seconds  # noqa: E402 (after the path)
from distval.protocol import Kind
from distval.stats import percentile  # noqa: E402

PERIOD_S = 0.5  # the heartbeat's interval_s, the watchdog's every_s, a simulated step
PER_NODE = 8
STEADY_S = 8.0  # the steady window, measured, before the fault
NAMED_WITHIN_S = 20.0  # how long after the fault a verdict is waited for
HOSTS = 4  # processes simulating the nodes
WATCHDOGS = 4  # flat: watchdog processes (the real job has one per node: the reads are scaled)
FAULTS = ("stopped", "skipped", "mismatch")


def beat(rank: int, step: int, fault: str | None = None, culprit: int = -1) -> dict:
    """Rank `rank`'s heartbeat (health/heartbeat.py's payload) at `step`: 12 collectives a step on
    group 0 and 3 on group 1; after a fault (`fault`), frozen: every rank waits in group 0's next
    all_reduce except the culprit, which skipped it (waits in group 1's next broadcast) or waits
    with other sizes (mismatch). A stopped culprit publishes nothing more."""
    g0, g1 = 12 * step, 3 * step
    groups, pending = {"0": [g0, g0], "1": [g1, g1]}, []
    if fault is not None:
        groups["0"] = [g0 + 1, g0]
        pending = [{"pg": "0", "seq": g0 + 1, "op": "allreduce", "sizes": [[1024]], "dtypes": ["Float"]}]
        if rank == culprit and fault == "skipped":
            groups = {"0": [g0, g0], "1": [g1 + 1, g1]}
            pending = [{"pg": "1", "seq": g1 + 1, "op": "broadcast", "sizes": [[4]], "dtypes": ["Int"]}]
        elif rank == culprit and fault == "mismatch":
            pending[0]["sizes"] = [[1000]]
    return {"pid": 100000 + rank, "host": f"node{rank // PER_NODE:04d}", "status": f"train zero2 step {step}",
            "busy": False, "step": step, "groups": groups, "pending": pending,
            "windows": {"0": {str(g0 // 64): f"{g0 // 64:016x}"}, "1": {str(g1 // 64): f"{g1 // 64:016x}"}},
            "cpu_s": 12.5 + step, "time": time.time()}


def decide_ms(world: int) -> tuple[float, list[int], str]:
    """The watchdog's verdict logic (health/hang.py `decide`) on `world` ranks' heartbeats where
    rank world//3 skipped a collective. Returns (median ms of 5, culprits, kind)."""
    from distval.health.hang import decide

    beats = {r: beat(r, 10, "skipped", world // 3) for r in range(world)}
    times = []
    for _ in range(5):
        t = time.perf_counter()
        culprits, kind, _ = decide(beats, {})
        times.append(time.perf_counter() - t)
    return sorted(times)[2] * 1e3, culprits, kind


class Counting:
    """A store client that counts its requests."""

    def __init__(self, store):
        self.store, self.requests = store, 0

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def counted(*args, **kwargs):
            self.requests += 1
            return method(*args, **kwargs)
        return counted


def server(stop=None, ports=None):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True,
                          timeout=datetime.timedelta(seconds=60))
    if ports is None:
        return store
    ports.put((store.port, os.getpid()))
    stop.wait()


def client(port: int):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))


def clients(port: int, n: int) -> list:
    """n clients of one store, connected side by side (one at a time takes ~0.2 s each)."""
    with ThreadPoolExecutor(32) as pool:
        return list(pool.map(lambda _: client(port), range(n)))


def wait_start(start) -> float:
    while start.value == 0.0:
        time.sleep(0.01)
    while time.time() < start.value:
        time.sleep(0.005)
    return start.value


def host(design: str, port: int, nodes: range, world: int, fault: str | None, ready, start, done, out) -> None:
    """Simulates `nodes`: their ranks publish every PERIOD_S (to the central store, or to this
    process's node store under `digests`), then freeze at the fault; under `digests` each node's
    NodeAgent ticks after its ranks published."""
    from distval.health.digest import NodeAgent
    from distval.launch.channel import ChannelReader, put

    os.nice(10)  # on a cluster the nodes are other machines: here they yield the cores to the store and the watchdogs
    culprit = world // 3
    faulty = {"on": False}  # the culprit's node sees it stopped (/proc) from the fault on
    ranks = {n: range(n * PER_NODE, min(world, (n + 1) * PER_NODE)) for n in nodes}
    central = [Counting(c) for c in clients(port, len(nodes))]  # a connection per node, as on a real cluster
    if design == "digests":
        served = server()
        address = f"127.0.0.1:{served.port}"
        sink = local = Counting(served)
        watches = [NodeAgent(n, list(ranks[n]), ChannelReader(local), ChannelReader(c),
                             lambda kind, d, n=n, c=c: put(c, kind, n, d), store=address, host=f"node{n:04d}",
                             states=lambda beats: ({culprit: "T"} if fault == "stopped" and faulty["on"]
                                                   and culprit in beats else {}))
                   for n, c in zip(nodes, central)]
    else:
        sink, local, watches = central[0], None, []
    ready.put(1)
    t0 = wait_start(start)
    fault_at = t0 + STEADY_S
    before = sum(c.requests for c in central)  # the channels' set-up
    sets, learned, steady, local_steady, tick, frozen = [], None, None, None, 0, False
    while not done.is_set() and time.time() < fault_at + (NAMED_WITHIN_S if fault else 0.0):
        began = time.time()
        faulted = began >= fault_at
        if faulted and steady is None:
            steady = sum(c.requests for c in central) - before
            local_steady = local.requests if local else 0
            faulty["on"] = True
        if fault is None and faulted:
            break
        if not faulted or not frozen:  # after the fault the frozen beats, once (a beat is published when it changed)
            frozen = faulted
            for n in nodes:
                for r in ranks[n]:
                    if faulted and fault == "stopped" and r == culprit:
                        continue
                    b = beat(r, tick, fault if faulted else None, culprit)
                    t = time.perf_counter()
                    sink.set(f"distval/heartbeat/{r}", json.dumps(b).encode())
                    sink.set(f"distval/status/{r}", json.dumps({"status": b["status"], "step": b["step"],
                                                                 "time": b["time"]}).encode())
                    if not faulted:
                        sets.append((time.perf_counter() - t) / 2)
        if not faulted:
            tick += 1
        for w in watches:
            verdict = w.tick()
            if verdict and learned is None:
                learned = time.time() - fault_at  # this host's nodes know the leader's verdict
        if learned is not None:
            break
        time.sleep(max(0.0, PERIOD_S - (time.time() - began)))
    if steady is None:
        steady, local_steady = sum(c.requests for c in central) - before, local.requests if local else 0
    out.put(("host", {"sets": sets, "central_requests": steady, "node_requests": local_steady, "learned_s": learned}))


class PerRank:
    """The first design's read: a check and a get per rank."""

    def __init__(self, reader):
        self.reader = reader

    def all(self, world_size: int, kind: str) -> dict:
        return {r: self.reader.latest(r, kind) for r in range(world_size)}


def watch(design: str, port: int, world: int, nodes: int, fault: str | None, ready, start, done, out) -> None:
    """A flat watchdog (its node's launcher's) or, under `digests`, the leader: the real Watchdog,
    ticking every PERIOD_S; reports its tick times in the steady window, its requests then, and the
    verdict with the seconds from the fault."""
    from distval.health import digest
    from distval.health.config import HangPolicy
    from distval.health.watchdog import Watchdog
    from distval.launch.channel import ChannelReader, put

    central = Counting(client(port))
    reader = ChannelReader(central)
    if design == "digests":
        source = digest.DigestReader(reader, nodes, ChannelReader)
    else:
        source = PerRank(reader) if design == "per rank" else reader
    found = []

    def on_hang(hang):
        found.append((time.time(), hang))
        if design == "digests":
            put(central, Kind.VERDICT, 0, digest.verdict(hang))

    dog = Watchdog(world, HangPolicy(), on_hang, every_s=PERIOD_S, say=lambda line: None)
    gc.freeze()  # as launch/watcher.py does: torch's objects out of the collector's full passes
    ready.put(1)
    t0 = wait_start(start)
    fault_at = t0 + STEADY_S
    ticks, cpu, requests = [], [], None
    while not found and time.time() < fault_at + (NAMED_WITHIN_S if fault else 0.0) and not done.is_set():
        began = time.time()
        if began >= fault_at and requests is None:
            requests = central.requests
        t, c = time.perf_counter(), time.thread_time()
        dog.tick(source)
        if began < fault_at:
            ticks.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
        time.sleep(max(0.0, PERIOD_S - (time.time() - began)))
    hang = found[0][1] if found else dog.hang
    paused = dog.pause is not None or bool(dog.pauses)
    out.put(("watch", {"ticks": ticks, "cpu": cpu, "requests": requests if requests is not None else central.requests,
                       "named_s": found[0][0] - fault_at if found else None, "paused": paused,
                       "kind": hang.kind if hang else None, "culprits": hang.culprits if hang else None}))


def run(world: int, design: str, fault: str | None) -> dict:
    ctx = mp.get_context("spawn")
    ports, stop, out, ready, done = ctx.Queue(), ctx.Event(), ctx.Queue(), ctx.Queue(), ctx.Event()
    start = ctx.Value("d", 0.0)
    central = ctx.Process(target=server, args=(stop, ports))
    central.start()
    port, pid = ports.get(timeout=60)
    nodes = -(-world // PER_NODE)
    share = -(-nodes // HOSTS)
    procs = [ctx.Process(target=host, args=(design, port, range(i * share, min(nodes, (i + 1) * share)), world,
                                            fault, ready, start, done, out))
             for i in range(HOSTS) if i * share < nodes]
    watchers = 1 if design == "digests" else WATCHDOGS
    procs += [ctx.Process(target=watch, args=(design, port, world, nodes, fault, ready, start, done, out))
              for _ in range(watchers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    start.value = time.time() + 1.0
    wait_until(start.value)
    cpu0 = cpu_seconds(pid)
    wait_until(start.value + STEADY_S)
    cpu1 = cpu_seconds(pid)
    results = []
    for _ in procs:
        kind, r = out.get(timeout=STEADY_S + NAMED_WITHIN_S + 120)
        results.append((kind, r))
        if kind == "watch" and design != "digests":
            done.set()  # the first watchdog's verdict (or its time is up): the hosts stop (digests: once told)
    for p in procs:
        p.join()
    stop.set()
    central.join()
    hosts = [r for kind, r in results if kind == "host"]
    dogs = [r for kind, r in results if kind == "watch"]
    sets = [x for h in hosts for x in h["sets"]]
    host_rps = sum(h["central_requests"] for h in hosts) / STEADY_S
    dog_rps = sum(d["requests"] for d in dogs) / STEADY_S
    named = [d for d in dogs if d["named_s"] is not None]
    first = min(named, key=lambda d: d["named_s"]) if named else dogs[0]
    learned = [h["learned_s"] for h in hosts]
    return {"ranks": world, "design": design, "fault": fault,
            # flat: the reads scaled to one watchdog per node; digests: every node and the leader ran
            "requests_per_s": host_rps + dog_rps * (nodes / watchers if design != "digests" else 1),
            "node_requests_per_s": sum(h["node_requests"] for h in hosts) / STEADY_S / nodes,
            "set_p50_ms": pct(sets, 50) * 1e3, "set_p99_ms": pct(sets, 99) * 1e3,
            "ticks": [x for d in dogs for x in d["ticks"]], "cpu": [x for d in dogs for x in d["cpu"]],
            "store_cpu_pct": 100 * (cpu1 - cpu0) / STEADY_S,
            "named_s": first["named_s"], "kind": first["kind"], "culprits": first["culprits"],
            "paused": first["paused"],
            # from the verdict until the last host's nodes had read it
            "told_s": max(learned) - first["named_s"] if named and None not in learned and design == "digests"
            else None}


def pct(values: list[float], q: float) -> float:
    return percentile(values, q) if values else float("nan")


def wait_until(when: float) -> None:
    while time.time() < when:
        time.sleep(0.01)


def named_text(r: dict, world: int) -> str:
    if r["named_s"] is not None:
        right = r["culprits"] == [world // 3]
        return f"{r['named_s']:.1f} s" + ("" if right else f" (wrong: {r['kind']} {r['culprits']})")
    return "pause" if r["paused"] else "none"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="64,256,1024,4096")
    p.add_argument("--designs", default="per rank,batched,digests")
    p.add_argument("--faults", default=",".join(FAULTS), help="the faults timed (not for the per rank design)")
    p.add_argument("--json", help="write every row here too")
    args = p.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    print(f"# {HOSTS} host processes simulating the nodes ({PER_NODE} ranks each); flat: {WATCHDOGS} watchdog "
          f"processes; a heartbeat and a status every {PERIOD_S} s ({len(json.dumps(beat(0, 100)))} B); "
          f"steady window {STEADY_S:g} s, then the fault; cores: {os.cpu_count()}")
    print(f"{'ranks':>6} {'design':>9} {'central req/s':>13} {'set p50/p99 ms':>15} {'tick p50/p99 ms':>16} "
          f"{'tick CPU ms':>13} {'store CPU':>9} {'stopped':>9} {'skipped':>9} {'mismatch':>9} {'nodes told':>10}")
    rows = []
    for world in (int(x) for x in args.ranks.split(",")):
        ms, culprits, kind = decide_ms(world)
        assert culprits == [world // 3] and kind == "outside", (culprits, kind)
        print(f"# {world} ranks: the verdict (a skipped collective, rank {world // 3} named) takes {ms:.1f} ms",
              flush=True)
        for design in args.designs.split(","):
            runs = [run(world, design, f) for f in (faults if design != "per rank" and faults else [None])]
            rows += runs
            ticks = [t for r in runs for t in r["ticks"]]
            cpu = [t for r in runs for t in r["cpu"]]
            by = {r["fault"]: r for r in runs}
            told = [r["told_s"] for r in runs if r["told_s"] is not None]
            print(f"{world:>6} {design:>9} {pct([r['requests_per_s'] for r in runs], 50):>13,.0f} "
                  f"{pct([r['set_p50_ms'] for r in runs], 50):>7.2f}/{pct([r['set_p99_ms'] for r in runs], 50):<7.2f} "
                  f"{pct(ticks, 50) * 1e3:>8.1f}/{pct(ticks, 99) * 1e3:<7.1f} "
                  f"{pct(cpu, 50) * 1e3:>6.1f}/{pct(cpu, 99) * 1e3:<6.1f} "
                  f"{pct([r['store_cpu_pct'] for r in runs], 50):>8.0f}% "
                  + " ".join(f"{named_text(by[f], world) if f in by else '-':>9}" for f in FAULTS)
                  + f" {f'+{max(told):.1f} s' if told else '-':>10}", flush=True)
    if args.json:
        kept = [{k: v for k, v in r.items() if k not in ("ticks", "cpu")} for r in rows]
        Path(args.json).write_text(json.dumps(kept, indent=1))


if __name__ == "__main__":
    main()
