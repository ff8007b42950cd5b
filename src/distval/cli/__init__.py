"""The `distval` command line: each command parses its flags, calls the library, renders.

Errors a user can cause (a bad flag, size, dtype, path) end in one line on stderr and exit code 2,
before anything is written; an environment that cannot run the job ends in exit code 3.

`app.py` holds the app, the shared options and the config builders; each command lives in a small
module of its own, imported here (its decorators add it to the app).
"""

from __future__ import annotations

import os
import sys

from distval import exit_without_collecting
from distval.cli import (  # noqa: F401 (each adds its commands)
    comm,
    configfile,
    diagnose,
    doctor,
    drill,
    emulate,
    launch,
    petenv,
    plan,
    run,
    scale,
    slurm,
    trace,
    train,
)
from distval.cli.app import app
from distval.knobs import told
from distval.results import EXIT_CANNOT_RUN, EXIT_USAGE, CannotRun

__all__ = ["app", "main"]


# the commands that start distval's own workers on this host
_LAUNCHING = {"comm", "compare", "doctor", "launch", "run", "scale", "train"}


def main(argv: list[str] | None = None) -> None:
    exit_without_collecting()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        args = configfile.expand(args, _command_of, _every_flag)
        if args[:1] == ["launch"]:  # torchrun's PET_* environment (Kubernetes): below a file's and typed flags
            args = ["launch", *petenv.flags(os.environ), *args[1:]]
    except ValueError as e:
        _fail(str(e), EXIT_USAGE)
    _start_fork_server(args)
    try:
        code = app(args=args, prog_name="distval", standalone_mode=False)
    except ValueError as e:
        _fail(told(e), EXIT_USAGE)  # a config's FieldError by its flags, however the config was built
    except CannotRun as e:
        _fail(str(e), EXIT_CANNOT_RUN)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as e:
        # Usage errors of click (or the click Typer vendors, depending on its version) carry
        # exit_code 2 and a format_message(); Abort is Ctrl-C at a prompt.
        if type(e).__name__ == "NoArgsIsHelpError":  # `distval` or `distval comm` alone: show the help
            print(e.format_message())
            sys.exit(0)
        if getattr(e, "exit_code", None) == EXIT_USAGE and hasattr(e, "format_message"):
            _fail(e.format_message(), EXIT_USAGE)
        if type(e).__name__ == "Abort":
            _fail("interrupted", 130)
        raise
    sys.exit(code if isinstance(code, int) else 0)


def _commands() -> dict[tuple[str, ...], object]:
    """Every command of the app by its words: ("comm", "bench") -> its click command."""
    import typer.main

    found: dict[tuple[str, ...], object] = {}

    def walk(cmd: object, words: tuple[str, ...]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, (*words, name))
        else:
            found[words] = cmd

    walk(typer.main.get_command(app), ())
    return found


def _options_of(cmd: object) -> dict[str, bool]:
    """{option: whether it takes a value}, every spelling."""
    return {o: not getattr(p, "is_flag", False) for p in getattr(cmd, "params", [])
            if getattr(p, "param_type_name", "") == "option" for o in (*p.opts, *p.secondary_opts)}


def _command_of(args: list[str]) -> tuple[list[str], dict[str, bool] | None]:
    """The words at the start of `args` that name a command, and its options (None: none)."""
    commands = _commands()
    words: list[str] = []
    for a in args:
        if not any(path[:len(words) + 1] == (*words, a) for path in commands):
            break
        words.append(a)
    cmd = commands.get(tuple(words))
    return words, _options_of(cmd) if cmd is not None else None


def _every_flag() -> set[str]:
    return {f for cmd in _commands().values() for f in _options_of(cmd) if f.startswith("--")}


def _start_fork_server(args: list[str]) -> None:
    """A command that will start workers here starts their fork server (launch/forkserver.py)
    first, forked from this process once it has imported torch, before any thread starts. Not
    for one worker, nor for a process that is itself a worker of an outer launcher (on a GPU host
    the server is started and not used: a fork of this process, idle)."""
    from distval.launch.modes import detect_mode

    flags = ("--nproc", "--nproc-per-node")
    nproc = next((b for a, b in zip(args, args[1:]) if a in flags),
                 next((a.split("=", 1)[1] for a in args if a.split("=", 1)[0] in flags and "=" in a), None))
    starts = nproc is not None if args and args[0] == "doctor" else nproc != "1"  # doctor probes with --nproc only
    if (sys.platform.startswith("linux") and args and args[0] in _LAUNCHING and starts and "--help" not in args
            and detect_mode() == "local"):
        from distval.launch import forkserver

        forkserver.start(fork=True)


def _fail(message: str, code: int) -> None:
    first = " ".join(message.strip().split("\n")[:1])
    print(f"distval: error: {first}", file=sys.stderr)
    sys.exit(code)
