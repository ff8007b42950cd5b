"""`distval diagnose` over real Flight Recorder dumps (tests/data/frdumps, made by real Gloo jobs
under plain torchrun: tests/data/frdumps/make_dumps.py): every case names the right rank and
kind; bad input is one line and exit 2; a crafted pickle cannot run code."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from distval.health.frdump import DumpError, read
from distval.health.postmortem import diagnose, spans

DUMPS = Path(__file__).parent / "data" / "frdumps"


def _verdict(folder: Path) -> dict:
    report = diagnose([folder])
    return next(c for c in report.to_dict()["checks"] if c["name"] == "diagnose verdict")


def test_a_skipped_collective_names_the_rank_that_never_entered_it():
    check = _verdict(DUMPS / "skip")
    assert check["status"] == "FAIL" and check["details"]["culprits"] == [2], check
    assert check["details"]["hang"] == "outside"
    assert "rank 2 has not issued all_reduce #12 of group 0" in check["summary"]


@pytest.mark.parametrize("case, others", [("size", "ranks 0, 2"), ("dtype", "rank 2")])
def test_a_mismatched_size_or_dtype_names_the_odd_rank_and_both_sides(case, others):
    """On "dtype" Gloo aborted rank 0 (no dump): two sides of one rank each, and rank 1's is the
    collective no rank issued anywhere else."""
    check = _verdict(DUMPS / case)
    what = "[[5]] Float" if case == "size" else "[[4]] Double"
    assert check["details"] == {**check["details"], "hang": "mismatch", "culprits": [1]}, check
    assert check["summary"] == (f"collective #8 of group 0 differs: rank 1 issued all_reduce {what}, while {others} "
                                "issued all_reduce [[4]] Float")


def test_a_stopped_rank_without_a_dump_is_the_one_the_others_wait_for():
    report = diagnose([DUMPS / "stop"]).to_dict()
    read_check, check = report["checks"]
    assert read_check["status"] == "WARN" and "rank 1 left no dump" in read_check["summary"]
    assert check["details"]["culprits"] == [1], check
    assert check["summary"].startswith("ranks 0, 2 issued all_reduce #9 of group 0 last and none is behind; rank 1 "
                                       "left no dump")
    (group,) = report["tables"]["diagnose_groups"]["rows"]
    assert group["completed"] == "9 on every rank with a dump at most (ranks 1 left no dump)"
    assert report["meta"]["ranks_without"] == [1]


def test_a_hung_sub_group_of_a_mesh_is_judged_among_its_own_ranks():
    report = diagnose([DUMPS / "mesh"]).to_dict()
    check = report["checks"][1]
    assert check["details"]["culprits"] == [2], check  # ranks 1 and 3 finished: neither is blamed
    groups = {row["ranks"]: row for row in report["tables"]["diagnose_groups"]["rows"]}
    assert set(groups) == {"0, 2", "1, 3", "0-1", "2-3"}  # Gloo lists no sub-group: from the entries
    assert groups["1, 3"]["issued"] == "6 on every rank with a dump"
    assert groups["0, 2"]["issued"] == "6: ranks 0; 5: ranks 2"


def test_each_rank_shows_its_last_completed_collective_and_the_stack_it_issued_from():
    report = diagnose([DUMPS / "skip"]).to_dict()
    rows = {row["ranks"]: row for row in report["tables"]["diagnose_ranks"]["rows"]}  # ranks alike: one row
    assert list(rows) == ["0-1", "2"] and [row["culprit"] for row in rows.values()] == [False, True]
    assert rows["0-1"]["waiting_in"].startswith("all_reduce #12 of group 0") and rows["2"]["waiting_in"] is None
    assert rows["2"]["last_completed"].startswith("0: #11 all_reduce")
    assert rows["0-1"]["where"] == "step (make_dumps.py:53)" and rows["2"]["where"] == "step (make_dumps.py:51)"
    stacks = report["checks"][1]["details"]["stacks"]
    assert "make_dumps.py" in stacks["0"]


def test_a_rank_whose_dump_is_missing_is_said_and_the_culprit_still_named(tmp_path):
    shutil.copytree(DUMPS / "skip", tmp_path / "d")
    (tmp_path / "d" / "rank0").unlink()
    report = diagnose([tmp_path / "d"]).to_dict()
    assert report["checks"][1]["details"]["culprits"] == [2], report["checks"]
    rows = report["tables"]["diagnose_ranks"]["rows"]
    assert [(row["ranks"], row["dumps"]) for row in rows] == [("0", "none"), ("1", "yes"), ("2", "yes")]


def test_rank_spans():
    assert spans([5, 0, 1, 2, 7, 8, 9]) == "0-2, 5, 7-9" and spans([3]) == "3"


def test_the_json_form_reads_alike():
    assert _verdict(DUMPS / "skip_json")["details"]["culprits"] == [2]


def test_the_cli_names_the_culprit_with_exit_1_and_writes_json_and_html(tmp_path, cli):
    res = cli("diagnose", str(DUMPS / "skip"), "--json", str(tmp_path / "d.json"), "--html", str(tmp_path / "d.html"))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "rank 2 has not issued all_reduce #12" in res.stdout
    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc["command"] == "diagnose" and doc["checks"][1]["details"]["culprits"] == [2]
    assert "rank 2 has not issued" in (tmp_path / "d.html").read_text()
    (tmp_path / "empty").mkdir()
    res = cli("diagnose", str(tmp_path / "empty"))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch PWNED",))


def test_a_crafted_pickle_cannot_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rank0").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Boom()]}))
    with pytest.raises(DumpError, match="names posix.system.*refused"):
        read([tmp_path / "rank0"])
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "no Flight Recorder dumps here"),
    (lambda d: (d / "rank0").write_bytes((DUMPS / "skip" / "rank0").read_bytes()[:300]), "truncated or damaged"),
    (lambda d: (d / "rank0").write_bytes(pickle.dumps([1, 2])), "not a Flight Recorder dump"),
    (lambda d: (d / "rank0").write_text("hello"), "neither a pickle nor JSON"),
    (lambda d: [shutil.copy(DUMPS / "skip" / "rank0", d / "rank0"), shutil.copy(DUMPS / "mesh" / "rank3", d / "rank3")],
     "not of one job: rank 3, but the default group of rank0 has ranks"),
    (lambda d: [shutil.copy(DUMPS / "skip" / "rank0", d / name) for name in ("a_rank0", "b_rank0")],
     "a second dump of rank 0"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, make, message):
    make(tmp_path)
    with pytest.raises(DumpError, match=message):
        read([tmp_path])


def test_a_rank_writes_its_dump_whole_where_the_launcher_asked_or_says_why_not(tmp_path, monkeypatch, capsys):
    from distval.envvars import FR_DUMPS
    from distval.health.heartbeat import write_dump

    monkeypatch.setenv(FR_DUMPS.name, str(tmp_path))
    write_dump(3)  # no process group here: the recorder's dump is empty, and still a dump
    assert [f.name for f in tmp_path.iterdir()] == ["rank3"] and read([tmp_path / "rank3"])[0].rank == 3
    monkeypatch.setenv(FR_DUMPS.name, str(tmp_path / "gone"))
    write_dump(4)
    assert "distval: rank 4 wrote no Flight Recorder dump: FileNotFoundError" in capsys.readouterr().err
    assert not (tmp_path / "gone").exists()
