"""`distval diagnose` over the dump folders of torch.distributed.debug's periodic dumper
(tests/data/debugdumps, made by real 3-rank Gloo jobs under plain torchrun: its README): every
case names the right rank and kind from the ranks' stacks; the stacks alone decide no more than
they show."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from distval.health.debugstacks import RankStack, parse, verdict
from distval.health.frdump import DumpError
from distval.health.postmortem import diagnose

FOLDERS = Path(__file__).parent / "data" / "debugdumps"
C10D = "all_reduce (/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252)"


def _checks(folder: Path) -> tuple[dict, dict]:
    read_check, check = diagnose([folder]).to_dict()["checks"]
    return read_check, check


@pytest.mark.parametrize("case, culprits, kind, summary", [
    ("outside", [1], "outside", "rank 1 is outside any collective at evaluate (make_stacks.py:23) while ranks 0, 2 "
                                "wait in all_reduce at <module> (make_stacks.py:38)"),
    ("mismatch", [2], "mismatch", "rank 2 waits in broadcast at <module> (make_stacks.py:29), while ranks 0, 1 wait "
                                  "in all_reduce at <module> (make_stacks.py:38)"),
    ("stopped", [2], "outside", "ranks 0, 1 wait in all_reduce at <module> (make_stacks.py:38); rank 2 did not answer "
                                "the dumper: the one they wait for"),
    ("ddp", [0], "outside", "rank 0 is outside any collective at evaluate (make_stacks.py:23) while ranks 1, 2 wait in "
                            "backward at <module> (make_stacks.py:36)"),  # DDP's gradient all_reduce, inside autograd
])
def test_each_case_names_its_rank_and_kind_from_the_stacks(case, culprits, kind, summary):
    read_check, check = _checks(FOLDERS / case)
    assert check["status"] == "FAIL" and check["details"]["culprits"] == culprits, check
    assert check["details"]["hang"] == kind and check["where"] == {"rank": culprits[0]}
    assert check["summary"].startswith(summary), check["summary"]
    assert check["summary"].endswith("(the same in the last 2 of 2 stacks files)")
    assert ("rank 2 did not answer" in read_check["summary"]) == (case == "stopped"), read_check
    assert read_check["status"] == ("WARN" if case == "stopped" else "OK")
    stacks = check["details"]["stacks"]
    assert sorted(stacks) == (["0", "1"] if case == "stopped" else ["0", "1", "2"])  # innermost frame first
    innermost = stacks["1" if case == "ddp" else "0"].splitlines()[0]
    assert innermost.startswith("_engine_run_backward (" if case == "ddp" else "all_reduce ("), innermost
    assert "/site-packages/torch/" in innermost


def test_the_ranks_table_groups_ranks_alike():
    rows = diagnose([FOLDERS / "stopped"]).to_dict()["tables"]["diagnose_ranks"]["rows"]
    assert rows == [
        {"ranks": "0-1", "culprit": False, "state": "waits in all_reduce", "where": "<module> (make_stacks.py:38)"},
        {"ranks": "2", "culprit": True, "state": "did not answer", "where": None}]


def test_the_main_thread_is_the_scripts_not_the_thread_that_answered():
    text = """=== Rank 0: http://h:1/handler/dump_traceback? ===
Thread 0x0000000000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/work/loader.py", line 9 in prefetch
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap

Current thread 0x0000000000000003 (most recent call first):
  <no Python frame>

Thread 0x0000000000000001 (most recent call first):
  File "/work/train.py", line 40 in save
  File "/work/train.py", line 77 in <module>
"""
    (rank0,) = parse(text).values()
    assert rank0.frames == ("save (/work/train.py:40)", "<module> (/work/train.py:77)") and rank0.op is None
    assert rank0.where == "save (train.py:40)" and rank0.state == "outside any collective"


def test_stacks_that_do_not_decide_are_said_as_such():
    waiting = RankStack(0, (C10D, "<module> (/w/train.py:5)"))
    assert verdict({0: waiting, 1: RankStack(1, waiting.frames)})[:2] == ([], "none")
    assert "cannot say which rank is behind" in verdict({0: waiting, 1: RankStack(1, waiting.frames)})[2]
    running = RankStack(0, ("step (/w/train.py:9)", "<module> (/w/train.py:5)"))
    assert verdict({0: running, 1: RankStack(1, running.frames)}) == (
        [], "none", "no rank waits in a collective: the job was running when the stacks were taken")
    silent = RankStack(2, answered=False)
    assert verdict({0: running, 2: silent}) == (
        [], "none", "no rank waits in a collective: the job was running when the stacks were taken; rank 2 did not "
                    "answer")
    assert verdict({2: silent})[2] == "no rank answered the dumper (rank 2): the stacks say nothing"
    backward = RankStack(1, ("_engine_run_backward (/v/torch/autograd/graph.py:824)", "<module> (/w/train.py:5)"))
    assert backward.op == "backward" and verdict({0: waiting, 1: backward})[:2] == ([1], "mismatch")


def test_an_older_file_that_differs_is_not_counted_as_held(tmp_path):
    folder = tmp_path / "outside"
    shutil.copytree(FOLDERS / "outside", folder)
    older = sorted(folder.glob("stacks_*.txt"))[0]
    older.write_text(next((FOLDERS / "mismatch").glob("stacks_*.txt")).read_text())  # rank 2 in a broadcast then
    _, check = _checks(folder)
    assert check["details"]["culprits"] == [1] and check["details"]["held_files"] == 1
    assert "the same in the last" not in check["summary"]


def test_the_cli_reads_a_debug_folder_and_refuses_one_without_stacks(tmp_path, cli):
    res = cli("diagnose", str(FOLDERS / "mismatch"), "--json", str(tmp_path / "d.json"))
    assert res.returncode == 1 and "rank 2 waits in broadcast" in res.stdout, res.stdout + res.stderr
    assert json.loads((tmp_path / "d.json").read_text())["meta"]["source"] == "torch.distributed.debug stacks"
    one = sorted((FOLDERS / "stopped").glob("stacks_*.txt"))[-1]  # a stacks file named alone
    res = cli("diagnose", str(one))
    assert res.returncode == 1 and "rank 2 did not answer" in res.stdout, res.stdout + res.stderr
    (tmp_path / "fr").mkdir()
    (tmp_path / "fr" / "fr_trace_20261129_044911.txt").write_text("=== FR Trace ===\n")
    with pytest.raises(DumpError, match="fr_trace tables .* without its stacks files"):
        diagnose([tmp_path / "fr"])
    (tmp_path / "fr" / "stacks_20261129_044911.txt").write_text("PARTIAL DATA: 0/2 workers responded\n")
    res = cli("diagnose", str(tmp_path / "fr"))
    assert res.returncode == 2 and res.stderr.strip().endswith("no rank's stacks in torch.distributed.debug's "
                                                               "stacks files"), res.stderr
