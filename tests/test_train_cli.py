"""`distval train` and `distval compare` from the command line."""

import json
import statistics

import pytest

from conftest import run_cli


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--strategy", "zero9"], "unknown strategy 'zero9'; choose from simple_ddp"),
        (
            ["train", "--nproc", "2", "--global-batch", "5"],
            "--global-batch 5 is not --micro-batch 2 x 2 ranks x --grad-accum 1 = 4",
        ),
        (["train", "--data", "/nonexistent/corpus.jsonl"], "/nonexistent/corpus.jsonl"),
        (["train", "--model", "gpt9"], "gpt9"),
        (["train", "--precision", "fp8"], "--precision must be fp32 or bf16"),
        (["train", "--metrics-readback", "sometimes"], "--metrics-readback must be auto, now or late"),
        (["compare", "--strategies", "simple_ddp,zero9"], "unknown strategy 'zero9'"),
    ],
)
def test_bad_training_input_is_one_line_exit_2(args, message, tmp_path, cli):
    out = tmp_path / "t.json"
    res = cli(*args, "--json", str(out))  # in process: these end before any worker starts
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert not out.exists()


def test_compare_under_an_outer_launcher_is_one_line_exit_2(monkeypatch, tmp_path, cli):
    """Each rank of a torchrun/Slurm/emulate job would start its own local jobs: refused at once."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    res = cli("compare", "--json", str(tmp_path / "c.json"))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "compare starts local jobs of its own" in lines[0], res.stderr
    assert "found torchrun" in lines[0] and not (tmp_path / "c.json").exists()


def test_train_reports_every_step(tmp_path):
    out, log = tmp_path / "t.json", tmp_path / "steps.jsonl"
    res = run_cli("train", "--nproc", "2", "--strategy", "simple_ddp_async", "--steps", "6", "--grad-accum", "2",
                  "--json", str(out), "--log-jsonl", str(log), timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(out.read_text())
    rows = doc["tables"]["steps"]["rows"]
    assert [r["step"] for r in rows] == list(range(6))
    for r in rows:
        assert {
            "step",
            "loss",
            "grad_norm",
            "lr",
            "tokens_per_s",
            "step_time_s",
            "comm_bytes",
            "peak_mem_bytes",
        } <= set(r)
        assert r["comm_bytes"] > 0 and r["peak_mem_bytes"] > 0 and r["step_time_s"] > 0
    assert rows[-1]["loss"] < rows[0]["loss"]
    # what a step spends in each op (rank 0, medians over the steps after the first): simple_ddp_async all-reduces
    # each tensor and waits for them all; the exposed part is the waiting, never more than issue to end
    (op,) = doc["tables"]["comm_ops"]["rows"]
    after_first = rows[1:]
    assert op["op"] == "all_reduce" and op["calls"] == statistics.median(r["comm_calls"] for r in after_first)
    assert op["bytes"] == statistics.median(r["comm_bytes"] for r in after_first)
    assert 0 < op["blocked_s"] <= op["time_s"]
    assert op["blocked_per_call_s"] == pytest.approx(op["blocked_s"] / op["calls"])
    assert len(doc["meta"]["param_checksum"]) == 16 and doc["meta"]["world_size"] == 2
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(6)) and lines[-1]["loss"] == rows[-1]["loss"]


def test_tensorboard_events(tmp_path):
    pytest.importorskip("tensorboard")
    res = run_cli("train", "--nproc", "2", "--steps", "3", "--tensorboard", str(tmp_path / "tb"), timeout=180)
    assert res.returncode == 0, res.stderr
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [0, 1, 2]


def test_compare_command_from_the_issue(tmp_path):
    out = tmp_path / "c.json"
    res = run_cli(
        "compare",
        "--nproc",
        "2",
        "--model",
        "tiny",
        "--steps",
        "10",
        "--grad-accum",
        "2",
        "--strategies",
        "simple_ddp,simple_ddp_ga,pytorch_ddp,dp",  # every strategy's parity: test_strategies.py
        "--json",
        str(out),
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(out.read_text())
    (dp,) = [c for c in doc["checks"] if c["name"] == "compare dp"]  # no GPU here: said, not run
    assert dp["status"] == "SKIP" and "2 or more local GPUs; this host has 0" in dp["summary"]
    rows = {r["strategy"]: r for r in doc["tables"]["strategies"]["rows"]}
    assert list(rows) == ["simple_ddp", "simple_ddp_ga", "pytorch_ddp"]
    for name, r in rows.items():
        assert r["max_rel_param_diff"] <= 1e-5, name
        assert r["comm_bytes_per_step"] == r["expected_comm_bytes_per_step"], name
        assert r["step_time_p50_s"] > 0 and r["tokens_per_s"] > 0 and r["peak_mem_bytes"] > 0
    assert rows["simple_ddp"]["comm_bytes_per_step"] == 2 * rows["simple_ddp_ga"]["comm_bytes_per_step"]  # K = 2
    assert rows["simple_ddp"]["comm_hidden_frac"] == 0 and 0 <= rows["pytorch_ddp"]["comm_hidden_frac"] <= 1
    parity = [c for c in doc["checks"] if c["name"].endswith("parity")]
    assert len(parity) == 3 and all(c["status"] == "OK" for c in parity)
    assert "strategies on 2 ranks against a single-process reference" in res.stdout  # the compact view
    assert "parity" in res.stdout and "tokens/s" in res.stdout and "max_rel_param_diff" not in res.stdout


def test_review_classification_trains_a_classifier(tmp_path):
    data = tmp_path / "reviews.csv"
    data.write_text("label,text\n" + "".join(f'{i % 5},"review number {i} says {"good" if i % 5 > 2 else "bad"}"\n'
                                             for i in range(16)))
    out = tmp_path / "c.json"
    res = run_cli(
        "train",
        "--nproc",
        "2",
        "--model",
        "small",
        "--data",
        str(data),
        "--task",
        "classify",
        "--steps",
        "2",
        "--micro-batch",
        "1",
        "--json",
        str(out),
        timeout=240,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(out.read_text())["tables"]["steps"]["rows"]
    assert len(rows) == 2 and all(r["comm_bytes"] > 0 for r in rows)


def test_classification_columns_are_checked_before_starting(tmp_path, cli):
    data = tmp_path / "reviews.csv"
    data.write_text("stars,body\n1,meh\n")
    res = cli("train", "--model", "small", "--data", str(data), "--task", "classify")
    assert res.returncode == 2 and "label" in res.stderr and "stars" in res.stderr
