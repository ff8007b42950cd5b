"""`--expect`: the expectations file, its presets and the judge (distval.expect), on hand-built
Reports. Pure logic: no process group, no torch (one subprocess checks that the package stays
torch-free)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distval.expect import PRESETS, judge, list_presets, load, parse
from distval.expect.spec import BenchExpectation
from distval.results import Report, Status, Table

REPO = Path(__file__).resolve().parents[1]
BENCH_COLUMNS = ["op", "dtype", "bytes", "inplace", "busbw_gbps"]
PAIRS_COLUMNS = ["level", "node_a", "node_b", "host_a", "host_b", "rank_a", "rank_b", "round", "bytes",
                 "a_to_b_gbps", "b_to_a_gbps"]
MIB = 2**20


def expect(text: str, tmp_path: Path, name: str = "cluster.toml"):
    path = tmp_path / name
    path.write_text(text)
    return load(str(path))


def bench_report(rows, world_size=8, hosts=None) -> Report:
    table = Table("bench", BENCH_COLUMNS)
    for op, size, inplace, busbw, *dtype in rows:
        table.add(op=op, dtype=dtype[0] if dtype else "float32", bytes=size, inplace=inplace, busbw_gbps=busbw)
    meta = {"world_size": world_size, "hosts": hosts or {"node-a": list(range(world_size))}}
    return Report("comm bench", meta=meta, tables=[table])


def pairs_report(node_rows=(), rank_rows=(), node_allreduce=None) -> Report:
    """node_rows: (node_a, node_b, a_to_b, b_to_a); rank_rows: (node, rank_a, rank_b, a_to_b, b_to_a)."""
    pairs = Table("pairs", PAIRS_COLUMNS)
    for a, b, ab, ba in node_rows:
        pairs.add(level="node", node_a=a, node_b=b, rank_a=8 * a, rank_b=8 * b, bytes=64 * MIB, a_to_b_gbps=ab,
                  b_to_a_gbps=ba)
    for node, ra, rb, ab, ba in rank_rows:
        pairs.add(level="rank", node_a=node, node_b=node, rank_a=ra, rank_b=rb, bytes=64 * MIB, a_to_b_gbps=ab,
                  b_to_a_gbps=ba)
    tables = [pairs]
    if node_allreduce is not None:
        nodes = Table("pair_nodes", ["node", "host", "ranks", "pair_gbps", "allreduce_busbw_gbps"])
        for node, busbw in enumerate(node_allreduce):
            nodes.add(node=node, host=f"h{node}", ranks=8, allreduce_busbw_gbps=busbw)
        tables.append(nodes)
    return Report("comm pairs", meta={"world_size": 8 * max(2, len(node_allreduce or ()))}, tables=tables)


def only(checks, name):
    found = [c for c in checks if c.name == name]
    assert len(found) == 1, [c.name for c in checks]
    return found[0]


# -- presets -----------------------------------------------------------------------------------------


def test_every_preset_parses_and_is_listed():
    shipped = {p.stem for p in (REPO / "src/distval/expect/presets").glob("*.toml")}
    assert set(PRESETS) == shipped >= {"8xH100-NVLink", "8xMI300X-xGMI", "400G-IB"}
    listed = dict(list_presets())
    assert set(listed) == shipped and all(listed.values())
    for name in PRESETS:
        exp = load(f"preset:{name}")
        assert exp.source == f"preset:{name}" and exp.name == name and exp.label == f"preset {name}"
        assert exp.bench or exp.pairs
    assert load("preset:8xh100-nvlink").name == "8xH100-NVLink"  # the name is not case-sensitive


def test_preset_figures_are_what_the_docs_state():
    h100 = {(b.op, b.size_bytes): b for b in load("preset:8xH100-NVLink").bench}
    assert h100[("all_reduce", 128 * MIB)].min_busbw_gbps == 300 and h100[("all_reduce", 2**30)].min_busbw_gbps == 330
    assert all(b.world_size == 8 and b.nodes == 1 for b in h100.values())
    mi300 = {(b.op, b.size_bytes): b.min_busbw_gbps for b in load("preset:8xMI300X-xGMI").bench}
    assert mi300 == {("all_reduce", 128 * MIB): 250, ("all_reduce", 2**30): 270}
    ib = load("preset:400G-IB")
    assert ib.pairs.min_node_gbps == 40 and {(b.world_size, b.nodes) for b in ib.bench} == {(2, 2)}
    doc = (REPO / "docs/expectations.md").read_text()
    assert all(f"`{name}`" in doc for name in PRESETS)


def test_presets_ship_with_the_package():
    assert '"distval.expect" = ["presets/*.toml"]' in (REPO / "pyproject.toml").read_text()


# -- the file: every mistake is one line naming the file and the key ----------------------------------

BENCH = '[[bench]]\nop = "all_reduce"\nbytes = "128M"\nmin_busbw_gbps = 360\n'


@pytest.mark.parametrize("text, message", [
    ("[pair]\nmin_node_gbps = 1\n", r"cluster.toml: unknown section 'pair'; known: name, description, bench, pairs"),
    ("[pairs]\nmin_nod_gbps = 1\n", r"cluster.toml: pairs: unknown key 'min_nod_gbps'; known: min_node_gbps, "),
    (BENCH + "size = 3\n", r"cluster.toml: bench\[0\]: unknown key 'size'; known: op, bytes, min_busbw_gbps"),
    ("[train]\nmin_mfu = 0.3\nmax_step_s = 1\n", r"train: unknown key 'max_step_s'; known: max_step_time_s"),
    ('[pairs]\nmin_node_gbps = "40 GB/s"\n', r"cluster.toml: pairs.min_node_gbps: give GB/s .*e.g. 40 \(got '40 GB"),
    ("[pairs]\nmin_node_gbps = true\n", r"pairs.min_node_gbps: give GB/s"),
    ('[train]\nmax_step_time_s = "500ms"\n', r"train.max_step_time_s: give seconds as a number, e.g. 0.5"),
    ("[train]\nmin_mfu = 30\n", r"train.min_mfu: 30 is not a fraction; give a fraction, e.g. 0.9"),
    ("[scale]\nmin_efficiency = { 8 = 90 }\n", r"scale.min_efficiency.8: 90 is not a fraction; give a fraction, e"),
    ("[scale]\nmin_efficiency = { eight = 0.9 }\n", r"scale.min_efficiency: world size 'eight' is not a whole number"),
    ("[scale]\nmin_efficiency = 0.9\n", r"scale.min_efficiency: give world size = fraction pairs"),
    ("[pairs]\nmin_rank_gbps = -1\n", r"pairs.min_rank_gbps: must be above 0 \(got -1\)"),
    ("[train]\nmin_tokens_per_s = 0\n", r"train.min_tokens_per_s: must be above 0"),
    ("[scale]\nmax_step_time_s = 0.0\n", r"scale.max_step_time_s: must be above 0"),
    (BENCH.replace('"128M"', '"128Q"'), r"bench\[0\].bytes: size '128Q' does not parse"),
    (BENCH.replace('"128M"', "1.5"), r"bench\[0\].bytes: give a size such as \"128M\""),
    (BENCH.replace('"128M"', "0"), r"bench\[0\].bytes: must be above 0 bytes"),
    (BENCH.replace("360", "-5"), r"bench\[0\].min_busbw_gbps: must be above 0"),
    (BENCH.replace('"all_reduce"', '"allreduce"'), r"bench\[0\].op: unknown op 'allreduce'; ops: all_reduce, "),
    (BENCH.replace('bytes = "128M"\n', ""), r"bench\[0\]: missing key 'bytes'"),
    (BENCH + 'dtype = "float8"\n', r"bench\[0\].dtype: unknown dtype 'float8'; dtypes: float32, "),
    (BENCH + "world_size = 0\n", r"bench\[0\].world_size: give a whole number of at least 1"),
    (BENCH + "nodes = 1.5\n", r"bench\[0\].nodes: give a whole number"),
    (BENCH + BENCH.replace("360", "300"), r"bench\[1\]: repeats bench\[0\]"),
    ('[bench]\nop = "all_reduce"\n', r"cluster.toml: bench: give one \[\[bench\]\] table per \(op, size\)"),
    ("pairs = 40\n", r"cluster.toml: pairs: give a \[pairs\] table"),
    ("name = 3\n" + BENCH, r"cluster.toml: name: give a string"),
    ('name = "empty"\n', r"cluster.toml: no thresholds; give at least one of \[\[bench\]\], \[pairs\]"),
    ("[pairs]\n", r"cluster.toml: \[pairs\] holds no thresholds; known: min_node_gbps"),
    ("[pairs\nmin_node_gbps = 1\n", r"cluster.toml: not valid TOML: .*line 1"),
    ("[pairs]\nmin_node_gbps = 1\nmin_node_gbps = 2\n", r"cluster.toml: not valid TOML: .*line 3"),
])
def test_a_mistake_in_the_file_is_one_line_naming_file_and_key(tmp_path, text, message):
    with pytest.raises(ValueError, match=message) as error:
        expect(text, tmp_path)
    assert "\n" not in str(error.value)


def test_a_missing_file_or_unknown_preset_says_so(tmp_path):
    with pytest.raises(ValueError, match=r"--expect '.*nope.toml': no such file .*preset:NAME"):
        load(str(tmp_path / "nope.toml"))
    with pytest.raises(ValueError, match=r"is a directory"):
        load(str(tmp_path))
    with pytest.raises(ValueError, match=r"'preset:DGX-9000': no such preset; presets: 400G-IB, 8xH100-NVLink, "
                                         r"8xMI300X-xGMI"):
        load("preset:DGX-9000")


def test_a_full_file_reads_into_the_dataclasses(tmp_path):
    exp = expect('name = "lab"\ndescription = "two nodes"\n' + BENCH + 'dtype = "bf16"\nworld_size = 8\nnodes = 1\n'
                 '[[bench]]\nop = "all_gather"\nbytes = 1048576\nmin_busbw_gbps = 12.5\n'
                 "[pairs]\nmin_node_gbps = 40\nmin_rank_gbps = 300\nmin_allreduce_busbw_gbps = 300\n"
                 "[scale]\nmin_efficiency = { 16 = 0.85, 8 = 0.9 }\nmax_step_time_s = 0.5\n"
                 "[train]\nmax_step_time_s = 1\nmin_mfu = 0.3\nmin_tokens_per_s = 1000\n", tmp_path)
    assert (exp.name, exp.description, exp.source, exp.label) == ("lab", "two nodes", str(tmp_path / "cluster.toml"),
                                                                  str(tmp_path / "cluster.toml"))
    assert exp.bench == (BenchExpectation("all_reduce", 128 * MIB, 360.0, "bfloat16", 8, 1),
                         BenchExpectation("all_gather", MIB, 12.5))
    assert exp.scale.min_efficiency == ((8, 0.9), (16, 0.85)) and exp.scale.max_step_time_s == 0.5
    assert (exp.train.max_step_time_s, exp.train.min_mfu, exp.train.min_tokens_per_s) == (1.0, 0.3, 1000.0)
    assert exp.pairs.min_rank_gbps == 300.0


# -- judge: [[bench]] ---------------------------------------------------------------------------------


def preset_like(data: dict, name: str = "8xH100-NVLink"):
    return parse(data, f"preset:{name}")


def test_bench_judges_the_best_row_at_exactly_that_size():
    exp = preset_like({"bench": [{"op": "all_reduce", "bytes": "128M", "min_busbw_gbps": 360}]})
    report = bench_report([("all_reduce", 128 * MIB, False, 340.0), ("all_reduce", 128 * MIB, True, 372.1),
                           ("all_reduce", 256 * MIB, True, 999.0), ("all_gather", 128 * MIB, False, 999.0)])
    (check,) = judge(exp, report)
    assert check.name == "expect bench all_reduce 128M" and check.status is Status.OK
    assert check.summary == "PASS all_reduce busbw at 128 MiB: 372.1 GB/s >= 360 GB/s (preset 8xH100-NVLink)"
    assert check.where["inplace"] is True and check.where["bytes"] == 128 * MIB and check.hint == ""
    assert check.details["measured"] == 372.1 and check.details["threshold"] == 360


def test_bench_at_exactly_the_threshold_passes_and_below_fails():
    exp = preset_like({"bench": [{"op": "all_reduce", "bytes": "128M", "min_busbw_gbps": 360}]})
    (at,) = judge(exp, bench_report([("all_reduce", 128 * MIB, True, 360.0)]))
    assert at.status is Status.OK and "360 GB/s >= 360 GB/s" in at.summary
    (below,) = judge(exp, bench_report([("all_reduce", 128 * MIB, True, 359.99999)]))
    assert below.status is Status.FAIL and below.summary.startswith("FAIL all_reduce busbw at 128 MiB: 359.99999 GB/s"
                                                                     " < 360 GB/s")  # never "360 < 360"
    assert "distval comm pairs" in below.hint and below.where["op"] == "all_reduce" and below.where["world_size"] == 8
    assert below.details["measured"] == 359.99999 and below.details["comparison"] == ">="


def test_bench_skips_with_the_reason(tmp_path):
    exp = preset_like({"bench": [{"op": "all_reduce", "bytes": "1G", "min_busbw_gbps": 330},
                                 {"op": "all_gather", "bytes": "1G", "min_busbw_gbps": 320},
                                 {"op": "all_reduce", "bytes": "1M", "min_busbw_gbps": 1, "dtype": "bfloat16"},
                                 {"op": "all_reduce", "bytes": "1M", "min_busbw_gbps": 1, "world_size": 16},
                                 {"op": "all_reduce", "bytes": "1M", "min_busbw_gbps": 1, "nodes": 2}]})
    sizes = [("all_reduce", 8 * 2**k, True, 1.0 + k) for k in range(25)]  # 8 B .. 128 MiB
    checks = judge(exp, bench_report(sizes))
    assert [c.status for c in checks] == [Status.SKIP] * 5
    assert "not measured at this size; sizes measured: 8 B to 128 MiB (25 sizes)" in checks[0].summary
    assert checks[0].summary.startswith("SKIP all_reduce busbw at 1 GiB:")
    assert "no all_gather rows; ops measured: all_reduce" in checks[1].summary
    assert "no bfloat16 rows; dtypes measured: float32" in checks[2].summary
    assert "for 16 ranks; this job ran 8" in checks[3].summary
    assert "for 2 node(s); this job ran on 1" in checks[4].summary
    assert all(c.details["reason"] for c in checks)
    (no_table,) = judge(exp.__class__(exp.source, bench=exp.bench[:1]), pairs_report([(0, 1, 40.0, 40.0)]))
    assert no_table.status is Status.SKIP and "has no table `bench`" in no_table.summary


def test_bench_preset_applies_to_its_world_size_and_nodes():
    exp = load("preset:400G-IB")
    two_nodes = bench_report([("all_reduce", 128 * MIB, True, 45.0), ("all_reduce", 2**30, True, 39.0)],
                             world_size=2, hosts={"a": [0], "b": [1]})
    checks = {c.name: c for c in judge(exp, two_nodes)}
    assert checks["expect bench all_reduce 128M 2 ranks 2 nodes"].status is Status.OK
    fail = checks["expect bench all_reduce 1G 2 ranks 2 nodes"]
    assert fail.status is Status.FAIL and fail.summary == ("FAIL all_reduce busbw at 1 GiB (2 ranks, 2 nodes): "
                                                           "39 GB/s < 40 GB/s (preset 400G-IB)")
    assert checks["expect pairs node"].status is Status.SKIP  # a pairs threshold on a bench report
    one_node = bench_report([("all_reduce", 128 * MIB, True, 45.0)], world_size=2, hosts={"a": [0, 1]})
    assert judge(exp, one_node)[0].status is Status.SKIP


# -- judge: [pairs] -----------------------------------------------------------------------------------


def test_pairs_fail_names_the_worst_direction_and_the_suspect_node():
    exp = parse({"pairs": {"min_node_gbps": 0.1}}, "lab.toml")
    report = pairs_report([(0, 1, 0.5, 0.5), (0, 2, 0.5, 0.03), (1, 2, 0.05, 0.5)])
    (check,) = judge(exp, report)
    assert check.name == "expect pairs node" and check.status is Status.FAIL
    assert check.summary == "FAIL node 2 -> node 0: 0.03 GB/s < 0.1 GB/s, and 1 more direction below it (lab.toml)"
    assert check.where["node_a"] == 0 and check.where["node_b"] == 2 and check.where["direction"] == "b_to_a"
    assert check.hint.startswith("node 2 is in every slow direction") and "ibstat" in check.hint
    assert [d["link"] for d in check.details["below"]] == ["node 2 -> node 0", "node 1 -> node 2"]
    assert check.details["measured"] == 0.03 and check.details["threshold"] == 0.1


def test_pairs_pass_at_the_threshold_and_two_nodes_cannot_name_an_end():
    exp = parse({"pairs": {"min_node_gbps": 40}}, "lab.toml")
    (ok,) = judge(exp, pairs_report([(0, 1, 40.0, 45.0)]))
    assert ok.status is Status.OK
    assert ok.summary == "PASS slowest node-to-node direction, node 0 -> node 1: 40 GB/s >= 40 GB/s (lab.toml)"
    (bad,) = judge(exp, pairs_report([(0, 1, 20.0, 45.0)]))
    assert bad.status is Status.FAIL and "cannot say which end is slow" in bad.hint


def test_pairs_rank_level_and_node_allreduce():
    exp = parse({"pairs": {"min_node_gbps": 40, "min_rank_gbps": 300, "min_allreduce_busbw_gbps": 300}}, "lab.toml")
    report = pairs_report(rank_rows=[(0, 0, 1, 350.0, 340.0), (0, 2, 3, 120.0, 330.0)],
                          node_allreduce=[None, 310.0, 200.5])
    node, rank, allreduce = judge(exp, report)
    assert node.status is Status.SKIP and "no node-level pairs" in node.summary
    assert rank.name == "expect pairs rank" and rank.status is Status.FAIL
    assert rank.summary.startswith("FAIL rank 2 -> rank 3: 120 GB/s < 300 GB/s (lab.toml)")
    assert rank.where["rank_a"] == 2 and rank.where["level"] == "rank" and "nvlink" in rank.hint
    assert allreduce.status is Status.FAIL and allreduce.where == {"node": 2, "host": "h2"}
    assert allreduce.summary == "FAIL all_reduce busbw within node 2 (h2): 200.5 GB/s < 300 GB/s (lab.toml)"
    (alone,) = judge(parse({"pairs": {"min_allreduce_busbw_gbps": 1}}, "x"), pairs_report(node_allreduce=[None]))
    assert alone.status is Status.SKIP and "one rank per node" in alone.summary


# -- judge: [scale] and [train] -------------------------------------------------------------------------


def scaling_report(points) -> Report:
    table = Table("scaling", ["world_size", "nodes", "ranks_per_node", "tokens_per_s", "step_time_s", "efficiency",
                              "planned_efficiency", "gap"])
    for world, efficiency, step_s in points:
        table.add(world_size=world, nodes=1, ranks_per_node=world, tokens_per_s=1000.0 * world * efficiency,
                  step_time_s=step_s, efficiency=efficiency, planned_efficiency=0.95,
                  gap="exposed communication" if efficiency < 0.8 else "")
    return Report("scale", tables=[table])


def test_scale_efficiency_per_world_size_and_step_time():
    exp = parse({"scale": {"min_efficiency": {"2": 0.9, "4": 0.8, "16": 0.7}, "max_step_time_s": 0.5}}, "s.toml")
    two, four, sixteen, step = judge(exp, scaling_report([(1, 1.0, 0.2), (2, 0.9, 0.3), (4, 0.75, 0.6)]))
    assert two.name == "expect scale efficiency 2" and two.status is Status.OK  # exactly at the threshold
    assert two.summary == "PASS scaling efficiency at 2 ranks: 0.9 >= 0.9 (s.toml)"
    assert four.status is Status.FAIL and four.summary == "FAIL scaling efficiency at 4 ranks: 0.75 < 0.8 (s.toml)"
    assert four.where["world_size"] == 4 and "exposed communication" in four.hint and "0.95" in four.hint
    assert sixteen.status is Status.SKIP and "world sizes measured: 1, 2, 4" in sixteen.summary
    assert step.name == "expect scale step_time" and step.status is Status.FAIL
    assert step.summary == "FAIL step time at 4 ranks: 0.6 s > 0.5 s (s.toml)" and step.where["world_size"] == 4
    (ok,) = judge(parse({"scale": {"max_step_time_s": 0.6}}, "s.toml"), scaling_report([(4, 0.75, 0.6)]))
    assert ok.status is Status.OK and ok.summary.endswith("at 4 ranks: 0.6 s <= 0.6 s (s.toml)")


def steps_report(step_times, mfu=0.4) -> Report:
    table = Table("steps", ["step", "step_time_s", "tokens_per_s", "mfu", "comm_blocked_s", "optimizer_s"])
    for i, t in enumerate(step_times):
        table.add(step=i, step_time_s=t, tokens_per_s=1000 / t, mfu=mfu, comm_blocked_s=t / 4, optimizer_s=t / 10)
    return Report("train", meta={"world_size": 2}, tables=[table])


def test_train_medians_leave_the_first_step_out():
    exp = parse({"train": {"max_step_time_s": 0.5, "min_mfu": 0.4, "min_tokens_per_s": 2500}}, "t.toml")
    step, mfu, tokens = judge(exp, steps_report([30.0, 0.4, 0.5, 0.45]))  # the first step (warm-up) is slow
    assert step.name == "expect train step_time" and step.status is Status.OK
    assert step.summary == "PASS median step time over 3 steps: 0.45 s <= 0.5 s (t.toml)"
    assert mfu.status is Status.OK and "0.4 >= 0.4" in mfu.summary  # exactly at the threshold
    assert tokens.status is Status.FAIL and tokens.summary.startswith("FAIL median throughput over 3 steps: 2222 "
                                                                      "tokens/s < 2500 tokens/s")
    assert "communication is 25% of a step" in tokens.hint and tokens.where == {"world_size": 2, "steps": 3}
    (slow,) = judge(parse({"train": {"max_step_time_s": 0.1}}, "t.toml"), steps_report([0.2, 0.2]))
    assert slow.status is Status.FAIL and slow.summary.startswith("FAIL median step time over 1 steps: 0.2 s > 0.1 s")


def test_train_skips_without_steps_or_mfu():
    exp = parse({"train": {"min_mfu": 0.3, "max_step_time_s": 1}}, "t.toml")
    step, mfu = judge(exp, steps_report([0.2, 0.2, 0.2], mfu=None))
    assert step.status is Status.OK and mfu.status is Status.SKIP and "no mfu figure" in mfu.summary
    assert all(c.status is Status.SKIP and "has no table `steps`" in c.summary
               for c in judge(exp, bench_report([("all_reduce", 8, True, 1.0)])))


def test_every_threshold_is_one_check_with_a_unique_name():
    exp = parse({"bench": [{"op": "all_reduce", "bytes": "1M", "min_busbw_gbps": 1},
                           {"op": "all_reduce", "bytes": "1M", "min_busbw_gbps": 1, "dtype": "float16"}],
                 "pairs": {"min_node_gbps": 1, "min_rank_gbps": 1, "min_allreduce_busbw_gbps": 1},
                 "scale": {"min_efficiency": {"2": 0.5, "4": 0.5}, "max_step_time_s": 1},
                 "train": {"max_step_time_s": 1, "min_mfu": 0.1, "min_tokens_per_s": 1}}, "all.toml")
    checks = judge(exp, Report("run"))
    assert len(checks) == 11 and len({c.name for c in checks}) == 11
    assert all(c.status is Status.SKIP and c.summary.startswith("SKIP ") and c.summary.endswith("(all.toml)")
               for c in checks)


def test_importing_expect_does_not_import_torch():
    code = ("import sys, distval.expect as e; e.judge(e.load('preset:8xH100-NVLink'), __import__('distval.results')"
            ".results.Report('x')); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
