"""`distval plan` as a user meets it: the real CLI entry point (`distval.cli.main`), exit codes,
one-line errors, the JSON report keys, --sweep, and the time the plan takes. Most cases run
in-process (the CLI code path without a 1.7 s interpreter start each); two run as real subprocesses."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import run_cli

SCRIPT = "import sys; from distval import cli; cli.main(sys.argv[1:])"


def plan(capsys, *args: str) -> tuple[int, str, str]:
    """Run `distval plan ARGS` through cli.main in this process: (exit code, stdout, stderr)."""
    from distval import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["plan", *args])
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def plan_json(capsys, tmp_path, *args: str) -> dict:
    """Run with --json; the parsed report, its terminal output under the key "stdout"."""
    path = tmp_path / "plan.json"
    code, out, err = plan(capsys, *args, "--json", str(path))
    assert code == 0, err
    doc = json.loads(path.read_text())
    assert doc["schema"] == "distval.report/1" and doc["command"] == "plan"
    return {**doc, "stdout": out}


def rows(doc: dict, table: str) -> list[dict]:
    return doc["tables"][table]["rows"]


def test_seed_001_figures_from_the_command_line(capsys, tmp_path):
    for link, figure in (("1GbE", 14.0), ("10GbE", 1.4), ("400G-RoCE", 0.036)):
        doc = plan_json(capsys, tmp_path, "--params", "760e6", "--grad-dtype", "bf16", "--world", "2", "--link", link)
        (step,) = rows(doc, "step")
        assert step["comm_time_s"] == pytest.approx(figure, rel=0.05)
        assert step["compute_time_s"] is None  # no sequence length given: not guessed
        assert {c["name"]: c["status"] for c in doc["checks"]}["plan.compute"] == "SKIP"


def test_zero_memory_table_from_the_issue(capsys, tmp_path):
    doc = plan_json(
        capsys, tmp_path, "--params", "1e9", "--world", "8", "--param-dtype", "bf16", "--grad-dtype", "bf16"
    )
    psi, n = 1e9, 8
    expected = {"ddp": 16 * psi, "zero1": 4 * psi + 12 * psi / n, "zero2": 2 * psi + 14 * psi / n,
                "zero3": 16 * psi / n, "fsdp": 16 * psi / n}
    table = {r["strategy"]: r for r in rows(doc, "memory")}
    assert set(table) == set(expected)
    for strategy, value in expected.items():
        r = table[strategy]
        assert r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"] == pytest.approx(value)
        assert set(r) >= {
            "strategy",
            "params_bytes",
            "grads_bytes",
            "optimizer_bytes",
            "activations_bytes",
            "total_bytes",
            "fits",
        }
    # no link given: bytes are known, times are not
    collectives = rows(doc, "collectives")
    assert collectives and all(c["time_s"] is None and c["bytes_per_rank"] > 0 for c in collectives)
    assert {c["name"]: c["status"] for c in doc["checks"]}["plan.comm"] == "SKIP"


def test_gpt2_large_plan_has_every_output(capsys, tmp_path):
    doc = plan_json(capsys, tmp_path, "--model", "gpt2-large", "--world", "2", "--link", "1GbE", "--device", "RTX-4070",
                    "--micro-batch", "8")
    out = doc["stdout"]
    tables = doc["tables"]
    assert set(tables) >= {"collectives", "step", "memory", "scaling", "levers", "rightsizing", "assumptions"}
    assert (
        tables["collectives"]["columns"][:4] == ["name", "op", "count", "bytes_per_rank"]
        and "time_s" in tables["collectives"]["columns"]
    )
    (step,) = rows(doc, "step")
    for key in ("comm_time_s", "compute_time_s", "step_time_no_overlap_s", "step_time_overlap_s", "comm_compute_ratio"):
        assert isinstance(step[key], float) and step[key] > 0
    assert step["step_time_no_overlap_s"] == pytest.approx(step["comm_time_s"] + step["compute_time_s"])
    memory = rows(doc, "memory")
    assert [r["strategy"] for r in memory] == ["ddp", "zero1", "zero2", "zero3", "fsdp"]
    assert all(r["activations_ckpt_bytes"] < r["activations_no_ckpt_bytes"] for r in memory)
    assert [r["world_size"] for r in rows(doc, "scaling")] == [2**i for i in range(11)]
    assert all(set(r) >= {"world_size", "throughput", "efficiency", "comm_share"} for r in rows(doc, "scaling"))
    levers = rows(doc, "levers")
    assert {r["lever"] for r in levers} >= {"accumulation", "bf16 compression", "PowerSGD", "faster link"}
    assert doc["meta"]["config"]["model"] == "gpt2-large" and doc["meta"]["model"]["num_params"] == 774_030_080
    # the terminal shows the same tables, readable
    for title in (
        "collectives of one step",
        "one optimizer step",
        "memory per rank",
        "weak scaling",
        "levers",
        "smallest device",
    ):
        assert title in out


def test_gpt2_large_plan_computes_in_well_under_a_second():
    from distval import meta  # noqa: F401  (import time is not planning time)
    from distval.plan import PlanConfig, build_report
    from distval.plan.model import measured_cpu_peak_flops

    measured_cpu_peak_flops.cache_clear()  # the default device is this CPU: its peak is measured too
    start = time.perf_counter()
    report = build_report(PlanConfig(model="gpt2-large", world_size=2, link="1GbE"))
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"{elapsed:.2f} s"
    assert report.table("step").rows[0]["step_time_s"] > 0 and report.table("scaling").rows


def test_sweep_prints_one_row_per_value(capsys, tmp_path):
    doc = plan_json(capsys, tmp_path, "--params", "760e6", "--grad-dtype", "bf16", "--world", "2",
                    "--sweep", "link=1GbE,10GbE,400G-RoCE")
    sweep = rows(doc, "sweep")
    assert [r["link"] for r in sweep] == ["1GbE", "10GbE", "400G-RoCE"]
    assert [r["comm_time_s"] for r in sweep] == pytest.approx([14.0, 1.4, 0.036], rel=0.05)
    assert doc["meta"]["sweep"] == {"input": "link", "values": ["1GbE", "10GbE", "400G-RoCE"]}
    doc = plan_json(
        capsys, tmp_path, "--model", "gpt2", "--link", "10GbE", "--device", "H100", "--sweep", "world=2,8,64"
    )
    sweep = rows(doc, "sweep")
    assert [r["world"] for r in sweep] == [2, 8, 64]
    assert sweep[0]["comm_time_s"] < sweep[1]["comm_time_s"] < sweep[2]["comm_time_s"]  # 2(N-1)/N grows with N


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "gpt5"], "unknown model preset (--model) 'gpt5'; known: tiny, small, gpt2, gpt2-medium"),
        (
            ["--layers", "2", "--hidden", "64", "--heads", "5", "--seq", "64", "--vocab", "256"],
            "--heads 5 does not divide --hidden 64",
        ),
        (["--layers", "2", "--hidden", "64"], "missing sizes"),
        (
            ["--model", "tiny", "--world", "2", "--global-batch", "5"],
            "--global-batch 5 is not divisible by --micro-batch 1 × world size 2",
        ),
        (["--params", "1e9", "--bandwidth", "0"], "--bandwidth must be positive"),
        (["--params", "1e9", "--bandwidth", "-3"], "--bandwidth must be positive"),
        (["--params", "1e9", "--link", "3GbE"], "unknown link preset (--link) '3GbE'; known: 1GbE"),
        (["--params", "1e9", "--device", "TPUv5"], "unknown device preset (--device) 'TPUv5'; known: RTX-4070"),
        (["--params", "1e9", "--strategy", "zero4"], "unknown strategy 'zero4'"),
        (["--params", "lots"], "--params 'lots' does not parse"),
        (["--model", "gpt2", "--params", "1e9"], "contradicts the architecture"),
        (
            ["--params", "1e9", "--world", "4", "--nodes", "2", "--devices-per-node", "4"],
            "--world 4 contradicts --nodes 2",
        ),
        (["--params", "1e9", "--mfu", "0"], "--mfu must be in (0, 1]"),
        (["--params", "1e9", "--sweep", "gpus=1,2"], "--sweep 'gpus=1,2': use NAME=v1,v2"),
        (["--params", "1e9", "--sweep", "world=2,x"], "--sweep world: 'x' is not a valid int"),
        (  # a value only the sweep gives: the config is built by replace(), its error still named by flags
            ["--model", "tiny", "--world", "2", "--global-batch", "8", "--sweep", "world=2,3"],
            "--global-batch 8 is not divisible by --micro-batch 1 × world size 3",
        ),
        (["--params", "1e9", "--calibration", "/nonexistent/bench.json"], "no such file"),
        ([], "give --model NAME, --params N"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, args, message):
    out = tmp_path / "plan.json"
    code, stdout, stderr = plan(capsys, *args, "--json", str(out))
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distval: error: ") and message in lines[0], stderr
    assert "Traceback" not in stdout + stderr and not out.exists()


def test_unwritable_json_path_is_rejected_before_planning(capsys):
    code, _, stderr = plan(capsys, "--params", "1e9", "--json", "/proc/nope/p.json")
    assert code == 2 and "--json '/proc/nope' cannot be created" in stderr


def test_real_process_plan_and_bad_input(tmp_path):
    out, bad_out = tmp_path / "p.json", tmp_path / "bad.json"
    good_args = ["plan", "--model", "gpt2-large", "--world", "2", "--link", "1GbE", "--json", str(out)]
    bad_args = [
        "plan",
        "--model",
        "gpt2-large",
        "--world",
        "2",
        "--link",
        "1GbE",
        "--global-batch",
        "3",
        "--json",
        str(bad_out),
    ]
    with ThreadPoolExecutor(2) as pool:  # two interpreters side by side: half the wall time
        good, bad = pool.map(
            lambda a: run_cli(*a, prefix=[sys.executable, "-c", SCRIPT], timeout=120), [good_args, bad_args]
        )
    assert good.returncode == 0, good.stderr
    assert "one optimizer step" in good.stdout and f"wrote {out}" in good.stdout
    assert json.loads(out.read_text())["tables"]["step"]["rows"][0]["comm_time_s"] > 0
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--global-batch 3" in bad.stderr
    assert "Traceback" not in bad.stderr and not bad_out.exists()
