"""The Typer app, the options several commands share, and the builders that turn flags into the
library's configs. Command modules (cli/<command>.py) add their commands to `app`.

Commands import torch-backed modules (launch, comm, train) inside their bodies, so `--help` and
`distval plan` answer without paying for `import torch`.
"""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

from distval import __version__
from distval.report import terminal
from distval.results import Report, check_writable, output_dir
from distval.units import parse_duration

# `distval --help` lists the commands in the order a user needs them.
ORDER = ("run", "doctor", "comm", "plan", "train", "compare", "trace", "drill", "launch", "emulate", "slurm")


class _InOrder(typer.core.TyperGroup):
    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))


app = typer.Typer(
    cls=_InOrder,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Validate, benchmark, profile and harden distributed PyTorch training.",
)
comm_app = typer.Typer(no_args_is_help=True, help="Collective correctness and bandwidth.")
app.add_typer(comm_app, name="comm")
trace_app = typer.Typer(no_args_is_help=True, help="Per-rank profiler traces: where each step's time goes.")
app.add_typer(trace_app, name="trace")


@app.callback(invoke_without_command=True)
def _root(version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False) -> None:
    if version:
        print(f"distval {__version__}")
        raise typer.Exit(0)


def option(*names: str, help: str) -> typer.models.OptionInfo:  # noqa: A002 (typer's keyword)
    """A flag with its help text; the shared flags below and every command module use it."""
    return typer.Option(*names, help=help)


# -- options of every command that launches ranks --------------------------------------------------
Nproc = Annotated[Optional[int], option(
    "--nproc", help="Local workers to start (default: number of GPUs, else 2). Ignored under torchrun/Slurm.")]
Backend = Annotated[str, option("--backend", help="auto (nccl on CUDA, else gloo), gloo, nccl or mpi.")]
ExpectWorld = Annotated[Optional[int], option(
    "--expect-world", help="Fail fast unless the world has exactly N ranks (catches every process running alone).")]
Timeout = Annotated[str, option("--timeout", help="Per-collective and rendezvous timeout, e.g. 60s.")]
Deadline = Annotated[Optional[str], option(
    "--deadline", help="Stop the whole local job after this long, naming each rank's last status, e.g. 10m.")]
JsonOut = Annotated[Optional[Path], option("--json", help="Write the report as JSON (schema distval.report/1).")]
HangAfter = Annotated[str, option(
    "--hang-after", help="Look for a hang when no rank progresses for this long (at least; learned from the gaps "
    "between progress, x10), then name the culprit with every rank's stack. A stopped or dead rank, a skipped or "
    "mismatched collective, every rank waiting: ended at once. Ranks running outside any collective while the "
    "others wait (an evaluation or a save on rank 0 looks the same): named live, ended only past --hang-kill-after. "
    "off: no watchdog (local workers).")]
HangKillAfter = Annotated[str, option(
    "--hang-kill-after", help="End a job whose ranks have run outside any collective while the others waited for "
    "this long (default 10m, NCCL's own collective timeout: a healthy job's evaluation or save on one rank must "
    "not be killed; raised where this job already survived a longer pause at the same line).")]


def launch_options(nproc, backend, expect_world, timeout, deadline, hang_after: str = "8s",
                   hang_kill_after: str = "10m", **extra):
    from distval.health.hang import HangPolicy
    from distval.launch import LaunchOptions

    hang = None if hang_after == "off" else HangPolicy(
        floor_s=parse_duration(hang_after, "--hang-after"),
        kill_after_s=parse_duration(hang_kill_after, "--hang-kill-after"))
    return LaunchOptions(nproc=nproc, backend=backend, expect_world=expect_world,
                         timeout_s=parse_duration(timeout, "--timeout"),
                         deadline_s=parse_duration(deadline, "--deadline") if deadline else None, hang=hang, **extra)


def check_outputs(outputs: dict[str, Optional[Path]]) -> None:
    """Every output file a command will write must be writable before anything runs (exit 2)."""
    for flag, path in outputs.items():
        if path:
            check_writable(path, flag)


def make_console() -> Console:
    """The terminal's width on a terminal; 132 columns into a pipe or file (rich would use 80)."""
    return Console() if sys.stdout.isatty() else Console(width=132)


def split_list(text: str) -> list[str]:
    return [x for x in (s.strip() for s in text.split(",")) if x]


def finish(report: Report | None, json_path: Path | None, console: Console) -> int:
    """Render on the rank that reports; write JSON; return the exit code (0 on other ranks)."""
    from distval.results import write_json

    if report is None:
        return 0
    terminal.render(report, console)
    if json_path is not None:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")
    return report.exit_code()


# Commands that make no sense inside an emulated cluster or a Slurm job: they launch nothing or
# launch it elsewhere.
_NOT_INSIDE = ("emulate", "slurm", "plan", "launch")


def check_inner(argv: list[str], where: str) -> list[str]:
    """The inner command of `where` (distval emulate or distval slurm) must be a distval command
    that launches ranks (one line, exit 2, if not); a leading "distval" is dropped."""
    if not argv:
        raise ValueError(f"{where} needs a distval command after `--`, e.g. {where} --nodes 2 -- comm bench "
                         f"--ops all_reduce")
    first = argv[1] if argv[0] == "distval" and len(argv) > 1 else argv[0]
    if argv[0] == "distval":
        argv = argv[1:]
    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    if first in _NOT_INSIDE:
        raise ValueError(f"`distval {first}` cannot run inside {where}; give a command that launches ranks "
                         f"(comm check, comm bench, run, train, compare)")
    if first not in names:
        raise ValueError(f"{first!r} after `--` is not a distval command "
                         f"(known: {', '.join(sorted(n for n in names if n))})")
    return argv


# -- the training workload: the flags `train` and `compare` share ------------------------------------
STRATEGIES_HELP = ("simple_ddp, simple_ddp_ga, simple_ddp_hook, simple_ddp_async, bucket_ddp_async, pytorch_ddp, "
                   "zero1, zero2, zero3, pytorch_zero1, fsdp2; dp (nn.DataParallel, one process over every local GPU).")
_WORKLOAD: dict[str, tuple[Any, Any]] = {  # name: (annotation, default)
    "model": (Annotated[str, option("--model", help="Model preset: tiny, small, gpt2, smollm2-135m, ...")], "tiny"),
    "steps": (Annotated[int, option("--steps", help="Optimizer steps.")], 20),
    "micro_batch": (Annotated[int, option("--micro-batch", help="Sequences per rank per micro-batch.")], 2),
    "grad_accum": (Annotated[int, option("--grad-accum", help="Micro-batches per optimizer step.")], 1),
    "global_batch": (Annotated[Optional[int], option(
        "--global-batch", help="Sequences per step; must equal micro-batch x ranks x grad-accum.")], None),
    "lr": (Annotated[float, option("--lr", help="Peak learning rate (AdamW, warm-up then cosine).")], 3e-3),
    "warmup": (Annotated[int, option("--warmup", help="Warm-up steps.")], 5),
    "clip": (Annotated[float, option("--clip", help="Clip the global gradient norm to this (0: off).")], 1.0),
    "seed": (Annotated[int, option("--seed", help="Seed of the model init and the data order.")], 0),
    "precision": (Annotated[str, option("--precision", help="fp32 or bf16 (autocast).")], "fp32"),
    "compile": (Annotated[bool, option("--compile", help="torch.compile the model's forward (every strategy but "
                                       "zero3 and dp; docs/training.md).")], False),
    "data": (Annotated[str, option(
        "--data", help="synthetic, a .txt/.jsonl/.csv/.parquet path, or hf:NAME (offline cache).")], "synthetic"),
    "task": (Annotated[str, option("--task", help="lm (next token) or classify (label, text columns).")], "lm"),
    "bucket_mb": (Annotated[str, option("--bucket-mb", help="Bucket cap in MiB (as torch's bucket_cap_mb) of "
                                        "bucket_ddp_async, pytorch_ddp, zero1 and zero2; compare: a comma list "
                                        "sweeps the sizes (e.g. 1,5,25,100) and names the best.")], "25"),
    "comm_hook": (Annotated[str, option("--comm-hook", help="pytorch_ddp: none, fp16, bf16 or powersgd.")], "none"),
    "powersgd_rank": (Annotated[int, option("--powersgd-rank", help="Rank of PowerSGD's approximation.")], 1),
    "mixed_precision": (Annotated[str, option("--mixed-precision", help="fsdp2: none or bf16 (bf16 parameters for "
                                              "compute, fp32 gradient reduction).")], "none"),
}


def workload_options(**defaults: Any) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Give a command the training workload's flags (declared once, above; `defaults` overrides
    some defaults, e.g. steps=10). The command takes them as one `workload: dict` parameter."""
    def decorate(fn: Callable[..., int]) -> Callable[..., int]:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "workload"]
        shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                    default=defaults.get(name, default))
                  for name, (annotation, default) in _WORKLOAD.items()]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[:1]] + shared + \
                 [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[1:]]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> int:
            return fn(workload={name: kwargs.pop(name) for name in _WORKLOAD}, **kwargs)

        command.__signature__ = inspect.Signature(params, return_annotation=int)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def bucket_sizes(text: str) -> list[float]:
    """`--bucket-mb 25` or a comma list `1,5,25,100` (MiB, each > 0, no repeats)."""
    sizes = []
    for item in split_list(str(text)):
        try:
            size = float(item)
        except ValueError:
            raise ValueError(f"--bucket-mb {text!r}: give MiB as a number or a comma list (1,5,25,100)") from None
        if not size > 0 or size in sizes:
            raise ValueError(f"--bucket-mb {text!r}: sizes must be positive and different")
        sizes.append(size)
    if not sizes:
        raise ValueError("--bucket-mb: give a size in MiB")
    return sizes


def train_config(workload: dict[str, Any], strategy: str, sweep: bool = False, **parts: Any):
    """The workload's flags as a TrainConfig; `parts`: its other parts (ckpt, metrics); `sweep`:
    a list of bucket sizes is allowed (compare), the config takes the first."""
    from distval.strategies.base import StrategyConfig
    from distval.train.config import OptimConfig, TrainConfig

    w = dict(workload)
    sizes = bucket_sizes(w.pop("bucket_mb"))
    if len(sizes) > 1 and not sweep:
        raise ValueError(f"--bucket-mb {','.join(f'{x:g}' for x in sizes)}: one size here (compare sweeps a list)")
    w["bucket_mb"] = sizes[0]
    optim = OptimConfig(lr=w.pop("lr"), warmup_steps=w.pop("warmup"), clip=w.pop("clip"))
    strategy_cfg = StrategyConfig(
        **{k: w.pop(k) for k in ("bucket_mb", "comm_hook", "powersgd_rank", "mixed_precision")}
    )
    return TrainConfig(strategy=strategy, optim=optim, strategy_cfg=strategy_cfg, **w, **parts)


TraceSteps = Annotated[Optional[str], option(
    "--trace", help="Record steps with torch.profiler: SKIP:N skips SKIP steps then records N (e.g. 5:3); one "
    "Kineto trace per rank, analysed at the end (docs/trace.md).")]
TraceDir = Annotated[Path, option("--trace-dir", help="Where --trace writes: <dir>/<strategy>/rank_<r>.json.gz.")]


def trace_config(text: str | None, steps: int, trace_dir: Path, run: str):
    """`--trace SKIP:N` as a TraceConfig for the run's folder (created if missing; rank files
    of an earlier run in it are removed, so an analysis never mixes two runs)."""
    from distval.trace.config import TraceConfig

    if text is None:
        return TraceConfig()
    skip, active = TraceConfig.parse(text, steps)
    folder = output_dir(trace_dir / run, "--trace-dir")
    for old in folder.glob("rank_*.json*"):
        old.unlink()
    return TraceConfig(skip, active, str(folder))


def check_training(cfg, opts) -> None:
    """What a user can get wrong about a training workload, before any worker starts: the batch
    split over the planned world, the data source."""
    from distval.launch import planned_world_size
    from distval.plan import presets
    from distval.train.data import validate_source

    cfg.check_world(planned_world_size(opts))
    validate_source(cfg.data_config(), presets.model(cfg.model).vocab_size)
