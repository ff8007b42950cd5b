"""`--config FILE.toml` on every command: defaults < the file < the flags typed.

The file's keys are the command's long flags without their dashes (`nproc = 4`, `hang_after =
"30s"` or `"hang-after" = "30s"`); a table named after a command applies to that command only and
wins over the top level (`[train]`, `[comm.bench]`). A true boolean is the flag, a false one its
`--no-` form; a list is joined with commas, as the flags take them. The file becomes flags put
before the ones typed, so a typed flag wins (the last value of an option is the one kept); a key
that is not a flag of the command is bad input, said with the file's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FLAG = "--config"


def expand(args: list[str], command_of: Any, every_flag: Any) -> list[str]:
    """`args` with `--config FILE` replaced by the file's flags, placed after the command's name.
    `command_of(args)`: (the words naming the command args start with, {option: whether it takes
    a value} of it, None where they name none); `every_flag()`: the long flags of every command (a
    top-level key another command takes is left out). A `--config` after the command's first
    argument (`distval launch`'s script) is that argument's own, left alone."""
    if not any(a == FLAG or a.startswith(FLAG + "=") for a in args):
        return args  # the usual case: no command tree built
    words, options = command_of(args)
    path, at = _config_path(args, len(words), options or {})
    if path is None:
        return args
    if options is None:
        raise ValueError(f"{FLAG} {path}: give it after a command (distval COMMAND {FLAG} FILE)")
    flags = {o for o in options if o.startswith("--")}
    rest = args[:at] + args[at + (1 if "=" in args[at] else 2):]
    top, own = _values(_read(path), words)
    shared = every_flag() if set(top) - set(own) else set()
    from_file: list[str] = []
    for key, value in {**top, **own}.items():
        flag = "--" + key.replace("_", "-")
        negated = "--no-" + flag[2:]
        if key not in own and flag not in flags and negated not in flags and (flag in shared or
                                                                              negated in shared):
            continue  # a shared file's key for another command
        if value is False and negated in flags:
            from_file.append(negated)
            continue
        if flag not in flags:
            raise ValueError(f"{FLAG} {path}: {key!r} is not a flag of distval {' '.join(words)} "
                             f"(see distval {' '.join(words)} --help)")
        if value is True:
            from_file.append(flag)
        elif value is False:
            raise ValueError(f"{FLAG} {path}: {key!r} is a flag that cannot be turned off; leave it out")
        else:
            from_file += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    n = len(words)
    return rest[:n] + from_file + rest[n:]


def _config_path(args: list[str], start: int, options: dict[str, bool]) -> tuple[str | None, int]:
    """(FILE, where --config is) among the command's own options: the scan stops at its first
    argument that is no option (a script, whose own flags follow) or at `--`."""
    i = start
    while i < len(args):
        a = args[i]
        if a == FLAG:
            if i + 1 >= len(args):
                raise ValueError(f"{FLAG} needs a file, e.g. {FLAG} distval.toml")
            return args[i + 1], i
        if a.startswith(FLAG + "="):
            return a.split("=", 1)[1], i
        if a == "--" or not a.startswith("-"):
            break
        i += 2 if options.get(a) and "=" not in a else 1
    return None, -1


def _read(path: str) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise ValueError(f"{FLAG} needs Python 3.11 or later (tomllib)") from None
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{FLAG} {path}: no such file")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{FLAG} {path}: not a TOML file ({e})") from None


def _values(doc: dict[str, Any], words: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The top level's plain keys, and the command's own tables' (the deeper winning: [comm]
    then [comm.bench])."""
    top = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    own: dict[str, Any] = {}
    table: Any = doc
    for word in words:
        table = table.get(word) if isinstance(table, dict) else None
        if not isinstance(table, dict):
            break
        own.update({k: v for k, v in table.items() if not isinstance(v, dict)})
    return top, own
