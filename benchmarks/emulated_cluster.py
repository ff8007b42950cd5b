"""An emulated cluster against the numbers it was built to deliver (docs/multinode.md, "Numbers").

For each node count (default 2 and 4, one rank per node), `--repeats` times:

    distval emulate --nodes N --nproc-per-node 1 --rate 1gbit -- \
        comm bench --ops all_reduce -b 1M -e 64M -n ITERS -w 2 -c 0 --json X

and from each X:

* β of the α–β fit (t = α + S/β, S the buffer) against the shaped rate. A ring all_reduce sends
  2(N−1)/N·S per rank, so the link rate the fit implies is β·2(N−1)/N (nccl-tests' busbw);
  efficiency = that ÷ the shaped rate. TCP/IP headers alone cap it at 1448/1514 = 95.6% (MTU 1500,
  timestamps on: tbf counts whole Ethernet frames, the bench counts payload).
* the planner's prediction of one 64 MiB all_reduce: `plan.calibration.load(X).links()` and
  `plan.network.Network.time` (what `distval plan --calibration X` uses for every all_reduce),
  against the bench's measured p50 at 64 MiB; plus, across node counts, the plan calibrated on
  the 2-node run predicting the 4-node time (the ring formula's extrapolation), and the
  uncalibrated plan (`--bandwidth rate/8 --efficiency 0.85`, the usual back-of-envelope), and
  `distval plan --calibration X` itself on a DDP step with a 64 MiB gradient.

Medians over repeats are reported (the 2 cores are shared: single runs are noisy). Needs root
(namespaces); exit 1 when a goal is missed (β within 10% of the rate, prediction within 15%).

    sudo .venv/bin/python benchmarks/emulated_cluster.py --nodes 2,4 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distval.emulate.rates import parse_rate
from distval.plan.calibration import load
from distval.plan.network import Link, Network, bus_factor

SIZE = 64 * 2**20
WIRE_SHARE = 1448 / 1514  # TCP payload per Ethernet frame at MTU 1500 with TCP timestamps


def bench_once(nodes: int, rate: str, iters: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "distval", "emulate", "--nodes", str(nodes), "--nproc-per-node", "1", "--rate", rate,
           "--", "comm", "bench", "--ops", "all_reduce", "-b", "1M", "-e", "64M", "-n", str(iters), "-w", "2",
           "-c", "0", "--json", str(out)]
    started = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"emulate failed ({res.returncode}): {res.stderr.strip().splitlines()[-1:]}")
    doc = json.loads(out.read_text())
    (fit,) = doc["tables"]["alpha_beta"]["rows"]
    rows = [r for r in doc["tables"]["bench"]["rows"] if r["bytes"] == SIZE]
    row = next((r for r in rows if not r["inplace"]), rows[0])  # the point the fit used (out-of-place where it exists)
    measured_s = row["time_us_p50"] * 1e-6
    cal = load(str(out))
    net = Network(1, nodes, 1, None, None, calibrated={("intra", op): link for op, link in cal.links().items()})
    predicted_s, _, _ = net.time("all_reduce", SIZE)
    # the same through the CLI: a DDP step whose gradient is 64 MiB (16 Mi fp32 parameters) in
    # buckets of 1 MiB then 63 MiB (PyTorch DDP's first bucket), no overlap: one α more than one call
    plan_json = out.with_suffix(".plan.json")
    subprocess.run([sys.executable, "-m", "distval", "plan", "--params", str(SIZE // 4), "--world", str(nodes),
                    "--calibration", str(out), "--bucket-mb", "64", "--no-overlap", "--json", str(plan_json)],
                   capture_output=True, text=True, timeout=120, check=True)
    plan_cli_s = json.loads(plan_json.read_text())["tables"]["step"]["rows"][0]["comm_time_s"]
    return {
        "plan_cli_s": plan_cli_s,
        "alpha_us": fit["alpha_us"],
        "beta_gbps": fit["beta_gbps"],
        "r2": fit["r2"],
        "measured_s": measured_s,
        "predicted_s": predicted_s,
        "wall_s": time.monotonic() - started,
        "emulated": doc["meta"].get("emulated"),
        "link": cal.links()["all_reduce"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="2,4")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", help="also write every run's figures here")
    a = p.parse_args()
    rate_bytes = parse_rate(a.rate) / 8
    folder = Path(tempfile.mkdtemp(prefix="distval-emulated-"))
    runs: dict[int, list[dict]] = {}
    ok = True
    for nodes in [int(n) for n in a.nodes.split(",")]:
        runs[nodes] = [bench_once(nodes, a.rate, a.iters, folder / f"bench-{nodes}-{r}.json") for r in range(a.repeats)]
        factor = bus_factor("all_reduce", nodes)
        med = {k: statistics.median(r[k] for r in runs[nodes])
               for k in ("alpha_us", "beta_gbps", "measured_s", "predicted_s", "plan_cli_s")}
        link_gbps = med["beta_gbps"] * factor
        eff = link_gbps * 1e9 / rate_bytes
        ratio = med["predicted_s"] / med["measured_s"]
        plain = Network(1, nodes, 1, Link(a.rate, 0.0, rate_bytes * 0.85, "given"), None).time("all_reduce", SIZE)[0]
        print(f"{nodes} nodes x 1 rank, {a.rate} tbf, {a.repeats} runs, medians:")
        print(f"  fit: alpha {med['alpha_us']:.0f} us, beta {med['beta_gbps'] * 1e3:.1f} MB/s "
              f"(betas {', '.join(format(r['beta_gbps'] * 1e3, '.1f') for r in runs[nodes])})")
        print(
            f"  link rate implied (beta x 2(N-1)/N = {factor:g}): {link_gbps * 8:.3f} Gbit/s = {eff:.1%} of the shaped "
            f"rate ({eff / WIRE_SHARE:.1%} of the TCP payload ceiling {WIRE_SHARE:.1%})"
        )
        print(
            f"  64 MiB all_reduce: measured {med['measured_s'] * 1e3:.0f} ms, "
            f"calibrated plan {med['predicted_s'] * 1e3:.0f} ms "
            f"(x{ratio:.3f}), uncalibrated plan at 85% of line rate {plain * 1e3:.0f} ms "
            f"(x{plain / med['measured_s']:.3f})"
        )
        print(
            f"  `distval plan --params 16Mi --world {nodes} --calibration X --bucket-mb 64 --no-overlap`: step comm "
            f"{med['plan_cli_s'] * 1e3:.0f} ms (1 MiB + 63 MiB buckets; "
            f"x{med['plan_cli_s'] / med['measured_s']:.3f} of one 64 MiB call)"
        )
        ok &= abs(eff - 1) <= 0.10 and abs(ratio - 1) <= 0.15
    counts = sorted(runs)
    for small, big in zip(counts, counts[1:]):
        links = [r["link"] for r in runs[small]]
        link = Link(
            "median",
            statistics.median(li.alpha_s for li in links),
            statistics.median(li.bytes_per_s for li in links),
            "calibrated",
        )
        predicted = Network(1, big, 1, None, None, calibrated={("intra", "all_reduce"): link}).time("all_reduce", SIZE)[
            0
        ]
        measured = statistics.median(r["measured_s"] for r in runs[big])
        print(f"  plan calibrated on {small} nodes predicts {big} nodes: {predicted * 1e3:.0f} ms vs measured "
              f"{measured * 1e3:.0f} ms (x{predicted / measured:.3f})")
        ok &= abs(predicted / measured - 1) <= 0.15
    if a.json:
        Path(a.json).write_text(json.dumps({str(n): [{k: v for k, v in r.items() if k != "link"} for r in rs]
                                            for n, rs in runs.items()}, indent=1))
    print("goals (beta within 10% of the rate, predictions within 15%):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
