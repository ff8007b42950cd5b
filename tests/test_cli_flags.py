"""One declaration per knob: every flag generated from a config field (distval/knobs.py) has the
field's default and help on every command that takes it, a command takes every knob of its
config, and the command line reads them without importing torch."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import typer

from distval import knobs
from distval.cli import app
from distval.comm.config import BenchConfig, CheckConfig
from distval.comm.names import BENCH_OPS
from distval.doctor.config import DoctorConfig
from distval.drill.config import DrillConfig
from distval.health.config import HealthConfig
from distval.ladder.config import RunConfig
from distval.launch.config import LAUNCH, LaunchOptions
from distval.plan.config import PlanConfig
from distval.train.config import TrainConfig

# the configs whose knobs each command takes as flags
USES = {"plan": (PlanConfig,), "train": (TrainConfig, LaunchOptions), "compare": (TrainConfig, LaunchOptions),
        "comm check": (CheckConfig, LaunchOptions), "comm bench": (BenchConfig, LaunchOptions),
        "run": (RunConfig, LaunchOptions), "launch": (LaunchOptions,), "drill": (DrillConfig,),
        "doctor": (DoctorConfig, LaunchOptions)}
OWN = {("compare", "--bucket-mb")}  # a comma list that sweeps, where the knob takes one size

def _commands() -> dict[str, Any]:
    root = typer.main.get_command(app)
    out: dict[str, Any] = {}
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        for sub, inner in (getattr(cmd, "commands", None) or {name: cmd}).items():
            out[name if sub == name else f"{name} {sub}"] = inner
    return out


def _options(cmd: Any) -> dict[str, Any]:
    return {name: p for p in cmd.params if p.param_type_name == "option" for name in p.opts}


def _knob_flags(configs: tuple[type, ...]) -> dict[str, list[knobs.Flag]]:
    by_flag: dict[str, list[knobs.Flag]] = {}
    for cls in configs:
        for flag in knobs.flags(cls):
            by_flag.setdefault(flag.knob.flag.split("/")[0], []).append(flag)
    return by_flag


COMMANDS = _commands()


@pytest.mark.parametrize("name", sorted(USES))
def test_a_flag_named_like_a_knob_of_the_commands_configs_is_that_knob(name):
    by_flag = _knob_flags(USES[name])
    for flag, option in _options(COMMANDS[name]).items():
        if flag not in by_flag or (name, flag) in OWN:
            continue
        helps = {f.knob.help for f in by_flag[flag]}
        assert option.help in helps, (name, flag, option.help)


@pytest.mark.parametrize("name, cls, skip", [
    ("train", TrainConfig, {"health.nan_every"}),  # train reads every step's loss and gradient norm
    # a script's NaN is named, not stopped (the script owns its loop); its gradient norm is not read
    ("launch", HealthConfig, {"on_nan", "spike"}),
    ("compare", TrainConfig, {"strategy", "ckpt", "metrics", "health", "strategy_cfg.bucket_mb"}),
    ("plan", PlanConfig, set()),
    ("comm check", CheckConfig, set()),
    ("comm bench", BenchConfig, set()),
    ("drill", DrillConfig, set()),
    ("doctor", DoctorConfig, set()),
])
def test_a_command_takes_every_knob_of_its_config_with_the_fields_default(name, cls, skip):
    options = _options(COMMANDS[name])
    defaults = {"train": {"strategy": "pytorch_ddp"}, "compare": {"steps": 10}}.get(name, {})
    for flag in knobs.flags(cls):
        if flag.path[0] in skip or ".".join(flag.path) in skip:
            continue
        option = options[flag.knob.flag.split("/")[0]]
        default = defaults.get(flag.knob.param, flag.default)
        assert option.default == (list(default) if isinstance(default, tuple) else default), (name, flag.path)
        assert option.help == flag.knob.help


@pytest.mark.parametrize("name", ["comm check", "comm bench", "run", "train", "launch"])
def test_every_command_that_launches_takes_the_launch_knobs(name):
    options = _options(COMMANDS[name])
    wanted = {f.knob.flag for f in knobs.flags(LaunchOptions) if ".".join(f.path) in LAUNCH}
    if name == "launch":
        wanted -= {"--backend", "--expect-world", "--deadline"}  # torchrun's interface
    assert wanted <= set(options), wanted - set(options)


def test_the_config_is_built_from_the_flags_text():
    opts = knobs.build(LaunchOptions, {("timeout_s",): "2m", ("hang", "floor_s"): "5s",
                                       ("hang", "kill_after_s"): "30s", ("nproc",): 3})
    assert (opts.timeout_s, opts.nproc, opts.hang.floor_s, opts.hang.kill_after_s) == (120.0, 3, 5.0, 30.0)
    assert knobs.build(LaunchOptions, {("hang", "floor_s"): "off"}).hang is None  # no watchdog
    cfg = knobs.build(TrainConfig, {("optim", "lr"): 0.01, ("strategy_cfg", "bucket_mb"): "5", ("steps",): 3})
    assert (cfg.optim.lr, cfg.strategy_cfg.bucket_mb, cfg.steps, cfg.optim.clip) == (0.01, 5.0, 3, 1.0)
    with pytest.raises(ValueError, match="one size here"):
        knobs.build(TrainConfig, {("strategy_cfg", "bucket_mb"): "1,5"})
    with pytest.raises(ValueError, match="--nnodes must be a whole number"):
        knobs.build(LaunchOptions, {("nnodes",): "1:2"})


def test_the_command_line_reads_its_flags_without_torch():
    code = "import sys, distval.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, "import distval.cli imported torch"


def test_every_config_is_frozen_and_normalised_at_construction():
    import dataclasses

    from distval.ckpt.config import CheckpointConfig
    from distval.health.config import HangPolicy, HealthConfig
    from distval.strategies.config import StrategyConfig
    from distval.trace.config import TraceConfig
    from distval.train.config import MetricsConfig, OptimConfig

    for cls in (LaunchOptions, HangPolicy, TrainConfig, OptimConfig, StrategyConfig, CheckpointConfig, MetricsConfig,
                HealthConfig, TraceConfig, PlanConfig, CheckConfig, BenchConfig, DoctorConfig, DrillConfig, RunConfig):
        assert cls.__dataclass_params__.frozen, cls.__name__  # type: ignore[attr-defined]
    bench = BenchConfig(ops=["all"], dtype="fp16")
    assert bench.ops == tuple(BENCH_OPS) and bench.dtype == "float16"  # normalised by the constructor
    with pytest.raises(dataclasses.FrozenInstanceError):
        bench.dtype = "float32"  # type: ignore[misc]
    assert PlanConfig(model="gpt2", param_dtype="bfloat16").grad_dtype == "bf16"
    with pytest.raises(ValueError, match="-r 2 is not a rank of a world of 2"):
        BenchConfig(root=2).check_job("gloo", 2)


def _config_of(cli, tmp_path, *args: str) -> dict:
    import json

    out = tmp_path / f"plan{len(list(tmp_path.iterdir()))}.json"
    res = cli("plan", *args, "--json", str(out))
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())["meta"]["config"]


def test_a_config_file_gives_every_command_its_flags_and_the_typed_flags_win(cli, tmp_path):
    """--config FILE.toml: defaults < file < flags typed; the command's own table wins over the top
    level; a top-level key another command takes (nproc) is left out; false is the --no- form."""
    f = tmp_path / "distval.toml"
    f.write_text('nproc = 4\nmodel = "gpt2"\noverlap = false\n[plan]\nmodel = "llama-7b"\nworld = 64\n'
                 'link = "400G-RoCE"\n[train]\nmodel = "tiny"\n')
    flags = _config_of(cli, tmp_path, "--model", "llama-7b", "--world", "64", "--link", "400G-RoCE", "--no-overlap")
    assert _config_of(cli, tmp_path, "--config", str(f)) == flags
    assert flags["world_size"] == 64 and flags["overlap"] is False
    typed = _config_of(cli, tmp_path, "--world", "8", f"--config={f}")
    assert typed["world_size"] == 8 and typed["link"] == flags["link"]


@pytest.mark.parametrize("text, message", [
    ('modle = "tiny"\n', "'modle' is not a flag of distval plan"),
    ("[plan]\nnproc = 2\n", "'nproc' is not a flag of distval plan"),
    ("model = \n", "not a TOML file"),
])
def test_a_bad_config_file_is_one_line_exit_2(cli, tmp_path, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    res = cli("plan", "--config", str(f))
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    missing = cli("plan", "--config", str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_a_scripts_own_config_flag_is_left_to_the_script():
    """`distval launch train.py --config cfg.yaml`: the script's flag, not distval's."""
    from distval.cli import _command_of, _every_flag
    from distval.cli.configfile import expand

    args = ["launch", "--nproc", "2", "train.py", "--config", "cfg.yaml"]
    assert expand(args, _command_of, _every_flag) == args
    assert _command_of(["comm", "bench", "-b", "8"])[0] == ["comm", "bench"]
