"""How often a job's workers fail to start from a fork server forked from the command line
(launch/forkserver.py `start(fork=True)`), and what a start costs against a spawned server.

Each round is what `distval comm check --nproc N` does before its first collective: the process
imports torch and distval's trainer, forks a fork server from itself (or, `--server spawn`, starts
multiprocessing's: a new interpreter importing them again), and the server forks N workers that
meet at a TCP store (rank 0's), init a Gloo group and all_reduce once. A round whose workers do not
all end within --timeout-s is a hang (they are killed). The server is ended after every round, so
every round forks a new one: the hazard being measured is a lock held at that fork.

    python benchmarks/fork_server_starts.py --rounds 500 --nproc 3
    python benchmarks/fork_server_starts.py --rounds 50 --nproc 3 --server spawn

Prints one line per 50 rounds and a summary: rounds, hangs, failures, and the median seconds and
CPU seconds (this process and its children) from the server's start to the last worker's end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.forkserver
import os
import resource
import signal
import statistics
import sys
import time


def _worker(rank: int, world: int, port: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == world
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _end_server() -> None:
    server = multiprocessing.forkserver._forkserver  # type: ignore[attr-defined]
    pid = server._forkserver_pid
    if pid:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(server._forkserver_alive_fd)
        server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--server", choices=("fork", "spawn"), default="fork")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from distval.launch import forkserver

    context = multiprocessing.get_context("forkserver")
    hangs = failures = 0
    walls, cpus = [], []
    for n in range(1, args.rounds + 1):
        started, cpu = time.monotonic(), _cpu()
        forkserver.start(fork=args.server == "fork")
        port = _free_port()
        workers = [context.Process(target=_worker, args=(r, args.nproc, port)) for r in range(args.nproc)]
        for w in workers:
            w.start()
        deadline = started + args.timeout_s
        for w in workers:
            w.join(max(0.0, deadline - time.monotonic()))
        if any(w.is_alive() for w in workers):
            hangs += 1
            for w in workers:
                w.kill()
                w.join()
        elif any(w.exitcode for w in workers):
            failures += 1
        _end_server()
        walls.append(time.monotonic() - started)
        cpus.append(_cpu() - cpu)
        if n % 50 == 0 or n == args.rounds:
            print(f"{n} rounds: {hangs} hung, {failures} failed; median {statistics.median(walls):.2f} s, "
                  f"{statistics.median(cpus):.2f} s of CPU", flush=True)
    print(f"server={args.server} nproc={args.nproc} rounds={args.rounds} hangs={hangs} failures={failures} "
          f"median_s={statistics.median(walls):.2f} median_cpu_s={statistics.median(cpus):.2f}")
    return 1 if hangs or failures else 0


if __name__ == "__main__":
    sys.exit(main())
