"""The health plane's store at 64 to 4,096 simulated ranks (issue 26, first part): one real c10d
TCPStore (libuv, as torch's rendezvous serves it) in its own process, publisher processes writing
each simulated rank's heartbeat every 0.5 s with a payload of the real size, and watchdog
processes reading every rank's heartbeat every 0.5 s through distval's own `ChannelReader.all`,
per rank (the design before the batched read: a check and a get per rank) or batched (one
check and one multi_get). Per size it prints the store's requests per second, the publishers'
set latency p50/p99, a watchdog read p50/p99, and the store process's CPU.

    python benchmarks/health_plane_scale.py [--ranks 64,256,1024,4096] [--seconds 8] [--watchdogs 4]

Per size it also times the watchdog's verdict logic (`decide`) naming a skipped collective among
that many ranks' heartbeats. What it is not (yet): the node digests of the issue's hierarchical
design, the status and fingerprint kinds, and the time to name a fault injected into live ranks.
With one watchdog per node (8 ranks a node) the real job has ranks/8 watchdogs; the figures are
measured with --watchdogs readers and the last column scales the reads to ranks/8 watchdogs (the
store's CPU does not scale linearly forever: the measured columns are the facts, the scaled one
an estimate).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from distval.health.hang import cpu_seconds  # noqa: E402 (after the path)
from distval.stats import percentile  # noqa: E402

PERIOD_S = 0.5  # the heartbeat's interval_s and the watchdog's every_s


def heartbeat(rank: int, step: int) -> bytes:
    """A heartbeat of the size a real one has (health/heartbeat.py's payload; two groups, two
    fingerprint windows)."""
    beat = {"pid": 100000 + rank, "host": f"node{rank // 8:04d}", "status": f"train zero2 step {step}", "busy": False,
            "step": step, "groups": {"0": [step * 12, step * 12], "1": [step * 3, step * 3]}, "pending": [],
            "windows": {"0": {str(step // 64): "9f2c4e1d0b7a6358"}, "1": {str(step // 64): "4e1d0b7a63589f2c"}},
            "cpu_s": 12.5 + step, "time": time.time()}
    return json.dumps(beat).encode()


def decide_ms(world: int) -> tuple[float, list[int], str]:
    """The watchdog's verdict logic (health/hang.py `decide`) on `world` ranks' heartbeats where
    one rank skipped a collective: every other rank waits in group 0's collective 121, rank
    world//3 issued 120 there and went on to wait in group 1. Returns (median ms of 5, culprits, kind)."""
    from distval.health.hang import decide

    odd = world // 3
    beats = {r: {"pid": r, "host": "elsewhere", "status": "train step 10", "step": 10, "pending": [],
                 "groups": {"0": [120, 120], "1": [31, 30]} if r == odd else {"0": [121, 120], "1": [30, 30]}}
             for r in range(world)}
    times = []
    for _ in range(5):
        t = time.perf_counter()
        culprits, kind, _ = decide(beats, {})
        times.append(time.perf_counter() - t)
    return sorted(times)[2] * 1e3, culprits, kind


def serve(port_queue: mp.Queue, stop: mp.Event) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True,
                          timeout=datetime.timedelta(seconds=60))
    port_queue.put((store.port, os.getpid()))
    stop.wait()


def client(port: int):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))


def publish(port: int, ranks: range, seconds: float, out: mp.Queue, start: float) -> None:
    store = client(port)
    for r in ranks:  # every rank has published once before the watchdogs start
        store.set(f"distval/heartbeat/{r}", heartbeat(r, 0))
    latencies, step = [], 1
    wait_until(start)
    end = start + seconds
    while time.time() < end:
        began = time.perf_counter()
        for r in ranks:
            t = time.perf_counter()
            store.set(f"distval/heartbeat/{r}", heartbeat(r, step))
            latencies.append(time.perf_counter() - t)
        step += 1
        time.sleep(max(0.0, PERIOD_S - (time.perf_counter() - began)))
    out.put(("publish", len(latencies), latencies))


def watch(port: int, world: int, batched: bool, seconds: float, out: mp.Queue, start: float) -> None:
    from distval.launch import channel

    reader = channel.ChannelReader(client(port))
    read = reader.all if batched else (lambda n, kind: {r: reader.latest(r, kind) for r in range(n)})
    times, requests = [], 0
    wait_until(start)
    end = start + seconds
    while time.time() < end:
        began = time.perf_counter()
        beats = read(world, "heartbeat")
        times.append(time.perf_counter() - began)
        requests += 2 if batched else 2 * world
        assert sum(b is not None for b in beats.values()) == world
        time.sleep(max(0.0, PERIOD_S - (time.perf_counter() - began)))
    out.put(("watch", requests, times))


def pct(values: list[float], q: float) -> float:
    return percentile(values, q) if values else float("nan")


def wait_until(start: float) -> None:
    """Every process begins measuring at the same wall-clock moment."""
    while time.time() < start:
        time.sleep(0.01)


def run(world: int, batched: bool, seconds: float, watchdogs: int, publishers: int) -> dict:
    ctx = mp.get_context("spawn")
    ports, stop, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    server = ctx.Process(target=serve, args=(ports, stop))
    server.start()
    port, pid = ports.get(timeout=60)
    start = time.time() + 6.0  # every process connected and every rank published once
    share = -(-world // publishers)
    procs = [ctx.Process(target=publish, args=(port, range(i * share, min(world, (i + 1) * share)), seconds, out,
                                               start)) for i in range(publishers) if i * share < world]
    procs += [ctx.Process(target=watch, args=(port, world, batched, seconds, out, start)) for _ in range(watchdogs)]
    for p in procs:
        p.start()
    wait_until(start)
    cpu0 = cpu_seconds(pid)
    results = [out.get(timeout=seconds + 120) for _ in procs]
    cpu1 = cpu_seconds(pid)
    for p in procs:
        p.join()
    stop.set()
    server.join()
    sets = [x for kind, _, xs in results if kind == "publish" for x in xs]
    reads = [x for kind, _, xs in results if kind == "watch" for x in xs]
    read_requests = sum(n for kind, n, _ in results if kind == "watch")
    per_watchdog_rps = read_requests / watchdogs / seconds
    return {"ranks": world, "design": "batched" if batched else "per rank", "watchdogs": watchdogs,
            "requests_per_s": (len(sets) + read_requests) / seconds, "set_p50_ms": pct(sets, 50) * 1e3,
            "set_p99_ms": pct(sets, 99) * 1e3, "read_p50_ms": pct(reads, 50) * 1e3, "read_p99_ms": pct(reads, 99) * 1e3,
            "store_cpu_pct": 100 * (cpu1 - cpu0) / seconds,
            "requests_per_s_at_scale": len(sets) / seconds + per_watchdog_rps * max(1, world // 8)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="64,256,1024,4096")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--watchdogs", type=int, default=4)
    p.add_argument("--publishers", type=int, default=4)
    args = p.parse_args()
    print(f"# {args.watchdogs} watchdog(s) and {args.publishers} publisher process(es), {args.seconds:g} s per row, "
          f"heartbeats every {PERIOD_S} s of {len(heartbeat(0, 100))} B; cores: {os.cpu_count()}")
    print(f"{'ranks':>6} {'design':>9} {'req/s':>9} {'set p50/p99 ms':>15} {'read p50/p99 ms':>16} "
          f"{'store CPU':>9} {'req/s, ranks/8 watchdogs':>25}")
    for world in (int(x) for x in args.ranks.split(",")):
        ms, culprits, kind = decide_ms(world)
        assert culprits == [world // 3] and kind == "outside", (culprits, kind)
        print(f"# {world} ranks: the verdict (a skipped collective, rank {world // 3} named) takes {ms:.1f} ms")
        for batched in (False, True):
            r = run(world, batched, args.seconds, args.watchdogs, args.publishers)
            print(f"{r['ranks']:>6} {r['design']:>9} {r['requests_per_s']:>9,.0f} "
                  f"{r['set_p50_ms']:>7.2f}/{r['set_p99_ms']:<7.2f} {r['read_p50_ms']:>8.1f}/{r['read_p99_ms']:<7.1f} "
                  f"{r['store_cpu_pct']:>8.0f}% {r['requests_per_s_at_scale']:>25,.0f}", flush=True)


if __name__ == "__main__":
    main()
