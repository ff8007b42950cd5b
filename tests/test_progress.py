"""Live training progress: rank 0's per-step lines reach the console while training runs."""

import json

from distval.train.progress import watch

from conftest import run_cli


def test_watch_reports_whole_lines_only(capsys):
    with watch(total=3, label="train x", every_s=0, poll_s=0.01) as path:
        with open(path, "a") as f:
            for step in range(3):
                f.write(json.dumps({"step": step, "loss": 5.0 - step, "step_time_s": 0.25}) + "\n")
            f.write('{"step": 3, "lo')  # a line still being written is not read
    err = capsys.readouterr().err
    assert "train x: step 3/3 · loss 3.0000 · 0.250 s/step" in err
    assert "step 4/3" not in err


def test_train_shows_progress_on_stderr_while_running():
    res = run_cli("train", "--nproc", "2", "--steps", "5", "--strategy", "simple_ddp", timeout=120,
                  env={"DISTVAL_PROGRESS_EVERY": "0"})
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("train simple_ddp: step ")]
    assert lines and lines[-1].startswith("train simple_ddp: step 5/5 · loss ")
    assert "step 5/5" not in res.stdout  # the report on stdout stays clean
