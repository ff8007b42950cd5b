"""The Typer app, the few options that are no config's field (--json, --trace, --trace-dir), and
what every command does around its one library call (check outputs, render, exit code). Command
modules (cli/<command>.py) add their commands to `app`; their flags come from the configs' knobs
(cli/flags.py).

Commands import torch-backed modules (launch, comm, train) inside their bodies, so `--help` and
`distval plan` answer without paying for `import torch`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from distval import __version__
from distval.knobs import comma_list
from distval.report import terminal
from distval.results import Report, check_writable, output_dir

# `distval --help` lists the commands in the order a user needs them.
ORDER = ("run", "doctor", "comm", "plan", "train", "compare", "scale", "trace", "diagnose", "drill", "launch",
         "emulate", "slurm")


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
    """A flag that is no config's knob, with its help text."""
    return typer.Option(*names, help=help)


JsonOut = Annotated[Optional[Path], option("--json", help="Write the report as JSON (schema distval.report/1).")]


ExpectFile = Annotated[Optional[str], option(
    "--expect", help="Expectations (TOML file, or preset:NAME, e.g. preset:8xH100-NVLink): each threshold a PASS/FAIL "
    "line (docs/expectations.md).")]


def load_expectations(spec: str | None) -> Any:
    """The --expect file read and checked before anything runs (one line, exit 2, if it is bad)."""
    if spec is None:
        return None
    from distval import expect

    return expect.load(spec)


def judged(report: Report | None, expectations: Any) -> Report | None:
    """The report with one PASS/FAIL check per threshold of --expect (on the reporting rank)."""
    if report is not None and expectations is not None:
        from distval import expect

        report.checks += expect.judge(expectations, report)
    return report


def check_outputs(outputs: dict[str, Optional[Path]]) -> None:
    """Every output file a command will write must be writable before anything runs (exit 2)."""
    for flag, path in outputs.items():
        if path:
            check_writable(path, flag)


def make_console() -> Console:
    """The terminal's width on a terminal; 132 columns into a pipe or file (rich would use 80)."""
    return Console() if sys.stdout.isatty() else Console(width=132)


def split_list(text: str) -> list[str]:
    return list(comma_list(text))


def finish(report: Report | None, json_path: Path | None, console: Console, html: Path | None = None) -> int:
    """Render on the rank that reports; write JSON and the HTML page where asked; return the exit
    code (0 on other ranks)."""
    from distval.results import atomic_write_text, write_json

    if report is None:
        return 0
    terminal.render(report, console)
    if json_path is not None:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")
    if html is not None:
        from distval.report.html import render_html

        atomic_write_text(html, render_html(report.to_dict()))
        console.print(f"wrote {html}")
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
