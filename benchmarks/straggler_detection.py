"""Precision and recall of the straggler detector (health/monitor.py) in real `distval train`
jobs: one rank slowed by 10%, 20%, 50%, 100% and 200% from step `--fault-step`, and clean runs,
on 2 and 3 ranks, several seeds. The rank is slowed one of two ways (`--how`):

  fault    from inside: the `slow` fault (DISTVAL_FAULT step=N,rank=R,action=slow,percent=P)
           stretches the rank's compute by P% (a sleep after its forward/backward)
  sigstop  from outside, as a CPU quota or a throttled device slows a process: once rank 0 has
           finished step N, the rank's process is stopped (SIGSTOP) s ms of every p ms and
           continued (SIGCONT); stopping s of every p slows the rank by p/(p-s)-1, so
           s = p·P/(100+P) gives an effective slowdown of P% (p = `--period-ms`, 100 ms).
           The stops land anywhere in the step, in its compute as in its collectives.
  cgroup   from outside: the rank's process moved into a cpu cgroup (v1 `cpu` or v2) whose
           quota is its CPU use before the onset over (1+P/100): needs root and a mounted
           cpu controller
  taskset  from outside: the rank's threads pinned onto the last core and its peers' onto the
           other cores from the job's start, and from the onset a busy process pinned on the
           rank's core holds it P/(100+P) of every 10 ms (a noisy neighbour arriving on one
           rank's core; pinning only at the onset would, on a 2-core host, squeeze its peers
           onto the one other core and slow them all alike, which the effective slowdown would
           then count as the neighbour's)

The rank's pid is the one its heartbeat publishes on the job's rank channel (the channel's
address is in the workers' environment, DISTVAL_CHANNEL); the onset is the step rank 0 had
finished when the slowing began (read from the same channel).

The effective slowdown of a run is measured: the job's median step time from 20 steps after the
onset over its median before the onset (the report's steps table), less 1.

Per slowdown: recall = runs whose slowed rank was named / runs; precision = findings naming the
slowed rank / all straggler findings (clean runs: every finding is a false positive); steps to
detection = the step the finding was raised at minus the onset (median); the onset error = the
"since" step minus the onset (median); `by` = which score(s) decided it (relative, individual,
waited; counted over the runs). Runs go one after the other (no timing overlap).

    python benchmarks/straggler_detection.py --models tiny --seeds 3 --steps 200
    python benchmarks/straggler_detection.py --how sigstop --models tiny --seeds 3 --steps 400 --fault-step 100
    python benchmarks/straggler_detection.py --table sweep.jsonl      # the tables of saved runs
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SLOWDOWNS = (0, 10, 20, 50, 100, 200)


def med(xs: list) -> str:
    return f"{statistics.median(xs):g}" if xs else "-"


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on (its sockets' inodes in /proc/net/tcp, state LISTEN)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    except OSError:
        return []
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def worker_channel(launcher: int, timeout_s: float = 60.0) -> str | None:
    """The rank channel's address: the launcher's listening port whose store holds rank 0's
    heartbeat (workers started from the fork server get the address in-process, not in their
    environment)."""
    from distval.launch.channel import ChannelReader

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{launcher}").exists():
            return None  # the launcher ended
        for port in listening_ports(launcher):
            with contextlib.suppress(Exception):
                if ChannelReader(f"127.0.0.1:{port}").latest(0, "heartbeat") is not None:
                    return f"127.0.0.1:{port}"
        time.sleep(0.2)
    return None


class Slower(threading.Thread):
    """Slows rank `rank` of the job launched as `proc` from outside, from the moment rank 0 has
    finished step `fault_step`, until the job ends. `onset`: that step (None: it never came)."""

    def __init__(self, proc: subprocess.Popen, rank: int, fault_step: int, percent: int, how: str, period_ms: float):
        super().__init__(daemon=True)
        self.proc, self.rank, self.fault_step, self.percent, self.how = proc, rank, fault_step, percent, how
        self.period_s = period_ms / 1e3
        self.onset: int | None = None
        self.peers: list[int] = []  # the other ranks' pids
        self.note = ""

    def run(self) -> None:
        from distval.launch.channel import ChannelReader  # the job's own TCPStore client

        address = worker_channel(self.proc.pid)
        if address is None:
            self.note = "no worker channel"
            return
        reader, pid, pinned = ChannelReader(address), None, False
        while self.proc.poll() is None:
            beat, step = reader.latest(self.rank, "heartbeat"), reader.latest(0, "step")
            pid = pid or (beat or {}).get("pid")
            self.peers = [b["pid"] for r in range(self.rank) if (b := reader.latest(r, "heartbeat"))]
            if self.how == "taskset" and not pinned and pid and len(self.peers) == self.rank:
                self.pin(pid)  # from the start: the onset adds the neighbour, not the pinning
                pinned = True
            if pid and step and step["step"] >= self.fault_step:
                self.onset = step["step"]
                break
            time.sleep(0.005)
        else:
            return
        self.reader = reader
        {"sigstop": self.sigstop, "cgroup": self.cgroup, "taskset": self.taskset}[self.how](pid)

    def began(self) -> None:
        """The slowing takes effect now: the onset is the step rank 0 has reached."""
        step = self.reader.latest(0, "step")
        if step:
            self.onset = step["step"]

    def pin(self, pid: int) -> None:
        """The rank's threads on the last core, its peers' on the others (on 2 cores: each rank a
        core of its own), from before the onset."""
        core = os.cpu_count() - 1
        for p, cores in [(pid, {core}), *((peer, set(range(core)) or {core}) for peer in self.peers)]:
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), cores)

    def taskset(self, pid: int) -> None:
        """From the onset, a process busy `P/(100+P)` of every 10 ms on the rank's core (pinned
        there since the start: `pin`)."""
        core = os.cpu_count() - 1
        busy = 0.010 * self.percent / (100 + self.percent)
        code = (f"import os, time\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    t = time.perf_counter()\n"
                f"    while time.perf_counter() - t < {busy}: pass\n    time.sleep({0.010 - busy})\n")
        spinner = subprocess.Popen([sys.executable, "-c", code])
        try:
            self.pin(pid)  # threads started since (a restart of a thread pool) join it too
            self.note = f"pinned on core {core} with a process busy {busy * 1e3:.1f} of every 10 ms"
            self.proc.wait()
        finally:
            spinner.kill()
            spinner.wait()

    def sigstop(self, pid: int) -> None:
        stop_s = self.period_s * self.percent / (100 + self.percent)
        # ProcessLookupError: the rank ended, which ends the duty cycle; it is never left stopped
        with contextlib.suppress(ProcessLookupError):
            try:
                while self.proc.poll() is None:
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(stop_s)
                    os.kill(pid, signal.SIGCONT)
                    time.sleep(self.period_s - stop_s)
            finally:
                os.kill(pid, signal.SIGCONT)

    def cgroup(self, pid: int) -> None:
        """CPU quota: the rank's CPU use over the last second before the onset, over 1+P/100."""
        tick = os.sysconf("SC_CLK_TCK")

        def cpu_s() -> float:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick  # utime + stime

        used0, t0 = cpu_s(), time.monotonic()
        time.sleep(1.0)
        share = (cpu_s() - used0) / (time.monotonic() - t0)  # cores it used
        v1 = Path("/sys/fs/cgroup/cpu")
        group = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / f"distval_slow_{pid}"
        group.mkdir(exist_ok=True)
        period_us = 100_000
        quota_us = max(1000, int(period_us * share / (1 + self.percent / 100)))
        if v1.is_dir():
            (group / "cpu.cfs_period_us").write_text(str(period_us))
            (group / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            (group / "cpu.max").write_text(f"{quota_us} {period_us}")
        self.note = f"{share:.2f} cores -> quota {quota_us / period_us:.2f}"
        unmoved = 0  # threads that ended (or could not move) before the quota took them: said in the note
        for tid in os.listdir(f"/proc/{pid}/task"):  # every thread (v1 moves tasks one by one)
            try:
                (group / "tasks" if v1.is_dir() else group / "cgroup.threads").write_text(tid)
            except OSError:
                unmoved += 1
        self.began()  # a second after the fault step: the quota was measured first
        if unmoved:
            self.note += f"; {unmoved} thread(s) not under the quota"
        self.proc.wait()
        try:
            group.rmdir()
        except OSError as e:  # a task still in it: said, not hidden
            print(f"straggler_detection: cgroup {group} left behind ({e.strerror})", file=sys.stderr)


def run(model: str, nproc: int, seed: int, steps: int, percent: int, fault_step: int, how: str, period_ms: float,
        out: str) -> tuple[list[dict], int, float | None]:
    """One job; returns its straggler findings, the onset step (the fault step for `fault`) and
    the effective slowdown (None for a job that did not run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTVAL_FAULT", "RANK", "MASTER_"))}
    if percent and how == "fault":
        env["DISTVAL_FAULT"] = f"step={fault_step},rank={nproc - 1},action=slow,percent={percent}"
    proc = subprocess.Popen([sys.executable, "-m", "distval", "train", "--nproc", str(nproc), "--model", model,
                             "--strategy", "simple_ddp", "--steps", str(steps), "--seed", str(seed),
                             "--check-replicas-every", "0", "--json", out], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    slower = Slower(proc, nproc - 1, fault_step, percent, how, period_ms) if percent and how != "fault" else None
    if slower:
        slower.start()
    proc.wait(timeout=1800)
    if slower:
        slower.join(timeout=10)
    onset = fault_step if slower is None else slower.onset
    if slower is not None and onset is None:  # a run never slowed is no measurement of a slowed rank
        raise SystemExit(f"straggler_detection: the {how} slowing never began ({slower.note or 'the job ended first'})")
    doc = json.load(open(out))
    start = onset if onset is not None else fault_step
    times = [(row["step"], row["step_time_s"]) for row in doc.get("tables", {}).get("steps", {}).get("rows", [])]
    before = [x for step, x in times if 10 <= step < start]
    after = [x for step, x in times if step >= start + 20]
    effective = statistics.median(after) / statistics.median(before) - 1 if before and after else None
    rows = [c for c in doc["checks"] if c["name"] == "health stragglers" and c["status"] == "WARN"]
    findings = [{"rank": c["where"]["rank"], "since": c["where"]["step"], "detected": c["details"].get("detected_step"),
                 "slowdown": c["details"].get("slowdown"), "by": c["details"].get("decided_by", ["relative"])}
                for c in rows]
    return findings, start, effective


def table(records: list[dict]) -> None:
    """Per (how, model) and slowdown: recall, precision, steps to detection (the slowed rank's
    earliest finding), onset error, measured slowdown, which rule decided; then the goal's lines."""
    goal = {"runs": 0, "named": 0, "true": 0, "found": 0, "late": 0}  # runs at >= 20% effective slowdown
    clean = {"runs": 0, "found": 0}
    groups: dict[tuple[str, str], dict[int, list[dict]]] = {}
    for rec in records:
        groups.setdefault((rec["how"], rec["model"]), {}).setdefault(rec["percent"], []).append(rec)
    for (how, model), by_percent in groups.items():
        worlds = sorted({r["world_size"] for rs in by_percent.values() for r in rs})
        print(f"{model}, slowed by {how}; worlds {','.join(map(str, worlds))}")
        print(f"  {'slowdown':>8} {'effective':>9} {'runs':>5} {'recall':>7} {'precision':>9} "
              f"{'steps to detect':>16} {'onset error':>12} {'measured x':>11}  decided by")
        for percent, runs in sorted(by_percent.items()):
            found = true = named = 0
            delays, onsets, measured, effective, by = [], [], [], [], collections.Counter()
            for rec in runs:
                slowed, onset, eff = rec["world_size"] - 1, rec["onset"], rec["effective"]
                findings = rec["findings"]
                mine = sorted((f for f in findings if f["rank"] == slowed), key=lambda f: f["detected"]) \
                    if percent else []
                found += len(findings)
                true += len(mine)
                named += bool(mine)
                if eff is not None:
                    effective.append(round(eff, 2))
                for f in mine[:1]:
                    delays.append(f["detected"] - onset)
                    onsets.append(f["since"] - onset)
                    measured.append(f["slowdown"])
                    by["+".join(f["by"])] += 1
                if not percent:
                    clean["runs"] += 1
                    clean["found"] += len(findings)
                elif eff is not None and eff >= 0.2:
                    goal["runs"] += 1
                    goal["named"] += bool(mine)
                    goal["true"] += len(mine)
                    goal["found"] += len(findings)
                    goal["late"] += bool(mine) and mine[0]["detected"] - onset > 200
            recall = f"{named / len(runs):.2f}" if percent else "-"
            precision = f"{true / found:.2f}" if found else ("1.00" if percent else "-")
            print(f"  {str(percent) + '%' if percent else 'clean':>8} {med(effective):>9} {len(runs):>5} "
                  f"{recall:>7} {precision:>9} {med(delays):>16} {med(onsets):>12} {med(measured):>11}  "
                  + ", ".join(f"{k} {v}" for k, v in by.most_common())
                  + (f"false positives: {found}" if not percent else ""), flush=True)
    if goal["runs"]:
        print(f"at >= 20% effective slowdown: {goal['runs']} runs, recall {goal['named'] / goal['runs']:.2f}, "
              f"precision {goal['true'] / goal['found'] if goal['found'] else 1:.2f}, "
              f"named later than 200 steps after the onset: {goal['late']}")
    if clean["runs"]:
        print(f"clean runs: {clean['runs']}, findings {clean['found']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny")
    p.add_argument("--worlds", default="2,3")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed+seeds-1")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--fault-step", type=int, default=50)
    p.add_argument("--how", default="fault", help="fault, sigstop, cgroup or taskset (comma-separated: each in turn)")
    p.add_argument("--period-ms", type=float, default=100.0, help="the SIGSTOP duty cycle's period")
    p.add_argument("--slowdowns", default=",".join(map(str, SLOWDOWNS)), help="percent; 0 is the clean run")
    p.add_argument("--jsonl", help="append one line per run (findings, onset, effective slowdown) to this file")
    p.add_argument("--table", nargs="+", metavar="JSONL", help="only print the tables of these --jsonl files")
    args = p.parse_args()
    if args.table:
        table([json.loads(line) for path in args.table for line in open(path) if line.strip()])
        return
    started = time.monotonic()
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for how in args.how.split(","):
            for model in args.models.split(","):
                for percent in map(int, args.slowdowns.split(",")):
                    for nproc in map(int, args.worlds.split(",")):
                        for seed in range(args.first_seed, args.first_seed + args.seeds):
                            findings, onset, eff = run(model, nproc, seed, args.steps, percent, args.fault_step, how,
                                                       args.period_ms, os.path.join(tmp, "r.json"))
                            rec = {"how": how, "model": model, "world_size": nproc, "seed": seed, "percent": percent,
                                   "onset": onset, "effective": eff, "findings": findings}
                            records.append(rec)
                            if args.jsonl:
                                with open(args.jsonl, "a") as f:
                                    f.write(json.dumps(rec) + "\n")
    table(records)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
