"""`distval scale` and `distval comm pairs`: the round-robin schedule, the outlier rules and the
scaling rows as pure functions; real local jobs for the tables; bad input in one line.
Emulated clusters with one bad link or one slow node: tests/test_emulate.py."""

from __future__ import annotations

import itertools
import json
import sys

import pytest

from distval.scale.pairs import findings, round_robin
from distval.scale.run import scaling_rows

from conftest import run_cli


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 64])
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n):
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)  # 63 rounds for 64 nodes, not 2,016
    met = [pair for r in rounds for pair in r]
    assert sorted(met) == list(itertools.combinations(range(n), 2))
    for r in rounds:  # every pair of a round at once: nobody twice
        seen = [x for pair in r for x in pair]
        assert len(seen) == len(set(seen))


def _pairs(gbps: dict[tuple[int, int], float], level: str = "node", node: int = 0) -> list[dict]:
    rows = []
    for (a, b), v in gbps.items():
        ends = {"node_a": a, "node_b": b, "rank_a": a, "rank_b": b} if level == "node" else \
            {"node_a": node, "node_b": node, "rank_a": a, "rank_b": b}
        rows.append({"level": level, **ends, "round": 0, "bytes": 1, "a_to_b_gbps": v, "b_to_a_gbps": v})
    return rows


def _nodes(n: int, compute: dict[int, float] | None = None) -> list[dict]:
    return [{"node": i, "host": f"h{i}", "ranks": 1, "allreduce_busbw_gbps": None,
             "compute_gflops": (compute or {}).get(i, 50.0)} for i in range(n)]


def _named(checks) -> list[str]:
    return [c.name for c in checks]


def test_a_node_slow_to_every_peer_is_named_for_its_link_and_nothing_else():
    links = {pair: (0.03 if 2 in pair else 0.117) for pair in itertools.combinations(range(4), 2)}
    found = findings(_pairs(links), _nodes(4), [], 0.7)
    assert _named(found) == ["comm.pairs node 2 link"]
    assert "node 2 (h2): 0.03 GB/s to every peer against a median of 0.117 (0.26x < 0.7x): its link" \
        in found[0].summary


def test_one_slow_path_between_healthy_nodes_is_that_link_only():
    links = {pair: (0.03 if pair == (1, 3) else 0.117) for pair in itertools.combinations(range(4), 2)}
    found = findings(_pairs(links), _nodes(4), [], 0.7)
    assert _named(found) == ["comm.pairs node 1-3 link", "comm.pairs node 3-1 link"]
    assert found[0].summary.startswith("link node 1 -> node 3 only: 0.03 GB/s against 0.117")


def test_a_slow_host_is_named_for_its_compute_not_its_links():
    """A starved host sends slowly too: its compute is the finding, its links are not."""
    links = {pair: (0.06 if 1 in pair else 0.117) for pair in itertools.combinations(range(4), 2)}
    found = findings(_pairs(links), _nodes(4, {1: 12.5}), [], 0.7)
    assert _named(found) == ["comm.pairs node 1 compute"]
    assert "compute 0.25x its peers" in found[0].summary and found[0].summary.endswith("not a link")


def test_a_uniform_cluster_names_nothing_and_noise_under_the_share_is_not_a_finding():
    links = {pair: 0.117 * (1 + 0.1 * ((a + b) % 3 - 1)) for pair in itertools.combinations(range(6), 2)
             for a, b in [pair]}
    assert findings(_pairs(links), _nodes(6, {3: 40.0}), [], 0.7) == []


def test_a_slow_rank_inside_a_node_is_named_with_its_node_and_local_index():
    inside = {pair: (40.0 if 5 in pair else 150.0) for pair in itertools.combinations(range(8), 2)}
    ranks = [{"rank": r, "node": 0, "host": "h0", "local": r, "compute_gflops": 100.0} for r in range(8)]
    nodes = [{"node": 0, "host": "h0", "ranks": 8, "allreduce_busbw_gbps": 120.0, "compute_gflops": 100.0}]
    found = findings(_pairs(inside, level="rank"), nodes, ranks, 0.7)
    assert _named(found) == ["comm.pairs rank 5 link"]
    assert found[0].summary.startswith("rank 5 (node 0, local 5): 40 GB/s to every peer")


def _point(world: int, tokens_per_s: float, cores: int = 2) -> dict:
    return {"world_size": world, "nodes": 1, "ranks_per_node": world, "micro_batch": 2, "tokens_per_step": 128 * world,
            "step_time_s": 128 * world / tokens_per_s, "tokens_per_s": tokens_per_s, "compute_s": 0.01,
            "optimizer_s": 0.002, "exposed_comm_s": 0.001, "busbw_gbps": None if world == 1 else 0.8,
            "grad_bytes": 460032, "num_tensors": 20, "ranks_per_machine": world, "cores": cores, "threads": 1,
            "device": "cpu"}


def test_efficiency_is_throughput_against_world_times_the_one_rank_throughput():
    from distval.train.config import TrainConfig

    rows = scaling_rows([_point(3, 12000.0), _point(1, 10000.0), _point(2, 18000.0)], TrainConfig(), None, None)
    assert [r["world_size"] for r in rows] == [1, 2, 3]
    assert [round(r["efficiency"], 3) for r in rows] == [1.0, 0.9, 0.4]
    assert [r["oversubscribed"] for r in rows] == [False, False, True]  # 3 ranks x 1 thread on 2 cores
    assert all(r["planned_efficiency"] is None and r["gap"] == "" for r in rows)  # no calibration: no plan


def test_the_gap_is_named_where_the_plan_missed_most(monkeypatch):
    """measured/planned efficiency = the small point's plan error / this point's: the larger names
    the point, and its category furthest from its plan the cause."""
    from distval.scale import run
    from distval.train.config import TrainConfig

    plans = {1: {"predicted_step_time_s": 0.0128, "predicted_compute_s": 0.01, "predicted_optimizer_s": 0.002,
                 "predicted_exposed_comm_s": 0.0008},
             3: {"predicted_step_time_s": 0.0192, "predicted_compute_s": 0.0120, "predicted_optimizer_s": 0.002,
                 "predicted_exposed_comm_s": 0.005}}
    monkeypatch.setattr(run, "_planned", lambda point, *args: plans[point["world_size"]])
    slow = _point(3, 12000.0)
    slow.update(compute_s=0.022)
    rows = scaling_rows([_point(1, 10000.0), slow], TrainConfig(), "cal.json", object())
    assert rows[1]["planned_efficiency"] == pytest.approx(0.0128 / 0.0192)
    assert rows[1]["gap"].startswith("this point took 1.67x its planned step, most in compute (+10.0 ms)")
    assert rows[1]["gap"].endswith("compute sharing cores (3 ranks x 1 thread(s) on 2 cores)")


def test_pairs_on_three_local_ranks(tmp_path):
    """One host: the rank pairs in 3 rounds, both directions, the node's all_reduce and every
    rank's compute probe; the statistic is stated."""
    out, expect = tmp_path / "pairs.json", tmp_path / "expect.toml"
    expect.write_text("[pairs]\nmin_rank_gbps = 0.01\nmin_allreduce_busbw_gbps = 5000\n")
    res = run_cli("comm", "pairs", "--nproc", "3", "-b", "1M", "-n", "3", "--expect", str(expect), "--json", str(out),
                  timeout=120)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]  # the FAIL of --expect
    doc = json.loads(out.read_text())
    verdicts = {c["name"]: c for c in doc["checks"] if c["name"].startswith("expect")}
    rank = verdicts["expect pairs rank"]
    assert rank["status"] == "OK" and rank["summary"].startswith("PASS")
    assert verdicts["expect pairs allreduce"]["status"] == "FAIL"
    assert "< 5000 GB/s" in verdicts["expect pairs allreduce"]["summary"]
    rows = doc["tables"]["pairs"]["rows"]
    assert sorted((r["rank_a"], r["rank_b"]) for r in rows) == [(0, 1), (0, 2), (1, 2)]
    assert sorted(r["round"] for r in rows) == [0, 1, 2] and {r["level"] for r in rows} == {"rank"}
    assert all(r["a_to_b_gbps"] > 0 and r["b_to_a_gbps"] > 0 and r["bytes"] == 2**20 for r in rows)
    node = doc["tables"]["pair_nodes"]["rows"][0]
    assert node["ranks"] == 3 and node["allreduce_busbw_gbps"] > 0 and node["compute_gflops"] > 0
    assert "under 0.7x the median" in doc["meta"]["outlier_rule"]


def test_scale_on_one_and_two_ranks_with_its_own_calibration(tmp_path):
    """Each point a launch; the bench at 2 ranks and the one-rank probe give the plan; busbw at the
    gradient's size; the page carries the table."""
    out, html, expect = tmp_path / "scale.json", tmp_path / "scale.html", tmp_path / "expect.toml"
    expect.write_text('[scale]\nmin_efficiency = { 2 = 0.05 }\nmax_step_time_s = 0.000001\n')
    res = run_cli("scale", "--nproc", "2", "--steps", "12", "--expect", str(expect), "--json", str(out), "--html",
                  str(html), timeout=300)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]  # the FAIL of --expect
    assert "distval scale: 1 rank(s)" in res.stdout and "distval scale: 2 rank(s)" in res.stdout
    doc = json.loads(out.read_text())
    rows = doc["tables"]["scaling"]["rows"]
    assert [r["world_size"] for r in rows] == [1, 2] and rows[0]["efficiency"] == pytest.approx(1.0)
    assert all(0 < r["planned_efficiency"] <= 1.0001 and r["planned_step_time_s"] > 0 for r in rows)
    assert rows[0]["busbw_gbps"] is None and rows[1]["busbw_gbps"] > 0 and rows[1]["grad_bytes"] > 0
    assert "alpha_beta" in doc["tables"] and doc["tables"]["step_costs"]["rows"][0]["strategy"] == "pytorch_ddp"
    assert "weak scaling 1 -> 2 ranks" in next(c for c in doc["checks"] if c["name"] == "scale")["summary"]
    page = html.read_text()
    assert '<figure id="fig-scaling">' in page and "planned" in page  # the chart: measured, planned, ideal
    verdicts = {c["name"]: c for c in doc["checks"] if c["name"].startswith("expect")}
    assert verdicts["expect scale efficiency 2"]["status"] == "OK"
    assert verdicts["expect scale step_time"]["status"] == "FAIL"


def test_bench_expectations_pass_and_fail(tmp_path):
    expect = tmp_path / "expect.toml"
    expect.write_text('[[bench]]\nop = "all_reduce"\nbytes = "1M"\nmin_busbw_gbps = 0.001\n\n'
                      '[[bench]]\nop = "all_reduce"\nbytes = "2M"\nmin_busbw_gbps = 5000\n')
    res = run_cli("comm", "bench", "--nproc", "2", "-b", "1M", "-e", "2M", "-n", "3", "-w", "1", "--no-call-cost",
                  "--expect", str(expect), timeout=120)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "PASS all_reduce busbw at 1 MiB" in res.stdout and "FAIL all_reduce busbw at 2 MiB" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--nproc", "2", "--worlds", "1,4"], "--worlds 4: more ranks than the launcher can start here (2: give --nproc 4"),
    (["--worlds", "1,x"], "--worlds: 'x' is not a world size"),
    (["--nproc", "3", "--strong", "--micro-batch", "1"], "--strong: the global batch 3 (--micro-batch 1 x 3 ranks) "
                                                         "does not split over 2 ranks"),
    (["--join", "nowhere.json"], "--join nowhere.json: cannot be read"),
    (["--worlds", "1,2", "--join", "a.json"], "--worlds and --join exclude each other"),
])
def test_scale_bad_input_is_one_line(cli, args, message):
    res = cli("scale", *args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr


def test_pairs_bad_input_is_one_line(cli, tmp_path):
    res = cli("comm", "pairs", "--outlier-share", "1.5")
    assert res.returncode == 2 and "--outlier-share must be a share between 0 and 1" in res.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[pairs]\nmin_node_gbs = 3\n")
    res = cli("comm", "pairs", "--expect", str(bad), "--json", str(tmp_path / "p.json"))
    assert res.returncode == 2 and "min_node_gbs" in res.stderr and not (tmp_path / "p.json").exists()


def test_points_of_separate_jobs_join_into_one_table(tmp_path):
    """Under an outer launcher (here torchrun, one job per world size) scale measures its job's
    point; --join builds the table and the plan from the points' own bench and step costs."""
    one, two, joined = tmp_path / "p1.json", tmp_path / "p2.json", tmp_path / "joined.json"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    for nproc, path in (("1", one), ("2", two)):
        res = run_cli("--nproc-per-node", nproc, "-m", "distval", "scale", "--steps", "10", "--json", str(path),
                      prefix=torchrun, timeout=240)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "join the points of several jobs" in res.stdout
    res = run_cli("scale", "--join", f"{one},{two}", "--json", str(joined), timeout=60)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = json.loads(joined.read_text())["tables"]["scaling"]["rows"]
    assert [r["world_size"] for r in rows] == [1, 2]
    assert all(r["planned_efficiency"] is not None for r in rows) and rows[1]["busbw_gbps"] > 0
