"""One declaration per knob: a config field that is also a command-line flag carries its flag
names, help text and parser in its metadata (`knob(...)`), so the field, its default and its flag
cannot drift apart. The command line (cli/flags.py) generates the flags from these fields and
builds the config from what the user typed; the library never sees a flag.

torch-free and typer-free: every config module may use it.

    timeout_s: float = knob(60.0, help="Per-collective timeout, e.g. 60s.", parse=parse_duration, text="60s")
    min_bytes: int = knob(8, "--minbytes", "-b", help="Smallest size in bytes.")

The flag is the field's name (`flag_of`: `timeout_s` is `--timeout`); `names` only where it reads
otherwise (nccl-tests' `--minbytes`/`-b`, torchrun's words, a short form).

`parse(text, flag)` turns the flag's text into the field's value (ValueError, one line, exit 2);
`text` is the flag's default as the user would type it (shown in --help). Without `parse` the flag
has the field's own type (int, float, str, bool, or one of them or None). A field whose type is a
dataclass with knobs of its own is a part: its knobs are flags of the command too, and the part is
built from them by its `from_knobs(**values)` classmethod when it has one (it may return None:
e.g. `--hang-after off` is no watchdog), else by its constructor.

A config's validation names fields, not flags: `FieldError("replicas_every", "must be 0 (off) or
more (got -1)")`. Built from flags (`build`), its message names each field by its knob's label
(`--check-replicas-every must be ...`); in library use, by the field's name.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Callable, Iterator, Optional

KEY = "distval.knob"
_FIELD = re.compile(r"\{(\w+)\}")


class FieldError(ValueError):
    """A value of the config's field `field` the user got wrong. `message` names other fields of
    the same config as `{name}` (in an f-string `{{name}}`); it follows the field's name unless it
    names `{field}` itself, where that reads better ("unknown {mode} 'x'"). Raised from a method
    of the config (its `self` or `cls`), which is kept as `owner`: the command line names the
    fields by its knobs (`told`), however the config came to be built (flags, a sweep's replace)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.field, self.message = field, message
        raiser = sys._getframe(1).f_locals
        owner = raiser.get("self", raiser.get("cls"))
        self.owner: type | None = owner if isinstance(owner, type) or owner is None else type(owner)

    def __str__(self) -> str:
        return self.naming()

    def naming(self, labels: dict[str, str] | None = None) -> str:
        """The message with each field named by the field's name, or by its entry in `labels` (a
        `{text}` that has none, e.g. inside a path the user gave, stays as it is)."""
        own = "{" + self.field + "}"
        text = self.message if own in self.message else f"{own} {self.message}"
        return _FIELD.sub(lambda m: m[1] if labels is None else labels.get(m[1], m[0]), text)


@dataclass(frozen=True)
class Knob:
    names: tuple[str, ...]  # the flag's names, the long one first ("--timeout"), short ones after ("-n")
    help: str
    parse: Optional[Callable[[str, str], Any]] = None  # (text, flag) -> the field's value
    text: Optional[str] = None  # the flag's default as typed, where `parse` reads it

    @property
    def flag(self) -> str:
        return self.names[0]

    @property
    def label(self) -> str:
        """How messages name the flag: its short name where it has one (-b, as nccl-tests users type it)."""
        short = [n for n in self.names[1:] if not n.startswith("--")]
        return short[0] if short else self.flag.split("/")[0]

    @property
    def param(self) -> str:
        """The flag as a Python identifier: the command's parameter name ("--hang-after" -> hang_after)."""
        return self.flag.split("/")[0].lstrip("-").replace("-", "_")


def comma_list(text: str, flag: str = "") -> tuple[str, ...]:
    """A flag's comma list ("a, b,,c" -> ("a", "b", "c")): the parser of every list-valued knob."""
    return tuple(x for x in (s.strip() for s in str(text).split(",")) if x)


def normalise(cfg: Any, **values: Any) -> None:
    """Set a frozen config's fields to their normal form while it is being constructed (from its
    `__post_init__`, before anything reads them); never after."""
    for name, value in values.items():
        object.__setattr__(cfg, name, value)


def knob(default: Any = MISSING, *names: str, help: str, parse: Optional[Callable[[str, str], Any]] = None,  # noqa: A002
         text: Optional[str] = None, factory: Optional[Callable[[], Any]] = None) -> Any:
    """A dataclass field that is also a flag (see the module's docstring). Without `names` the
    flag is the field's name (`flag_of`); names are given where the flag reads otherwise (nccl-tests'
    `--minbytes/-b`, torchrun's words, a short form)."""
    if names and not names[0].startswith("--"):
        raise TypeError(f"a knob's names start with its long flag (got {names!r})")
    meta = {KEY: Knob(tuple(names), help, parse, text)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_of(name: str) -> str:
    """A field's flag, where its knob names none: `max_restarts` -> `--max-restarts`, a unit of
    seconds left out (`timeout_s` -> `--timeout`: the flag takes a duration, "30s")."""
    return "--" + name.removesuffix("_s").replace("_", "-")


def knob_of(f: dataclasses.Field) -> Knob | None:
    """The knob of a config's field (its flag names filled in), None for a field that is no flag."""
    meta = f.metadata.get(KEY)
    if meta is None or meta.names:
        return meta
    return dataclasses.replace(meta, names=(flag_of(f.name),))


@dataclass(frozen=True)
class Flag:
    """One knob as the command line sees it: where it lives in the config (`path`, e.g.
    ("optim", "lr")), its Python type and its default as the flag takes it."""

    path: tuple[str, ...]
    knob: Knob
    type: Any
    default: Any


def flags(cls: type) -> list[Flag]:
    """Every knob of `cls` and of its parts, in declaration order."""
    return list(_walk(cls, ()))


def _walk(cls: type, prefix: tuple[str, ...]) -> Iterator[Flag]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = knob_of(f)
        if meta is None:
            if (kind := _part(hints[f.name])) is not None:
                yield from _walk(kind, prefix + (f.name,))
            continue
        if meta.parse is not None:  # the flag takes text, as typed
            yield Flag(prefix + (f.name,), meta, str if meta.text is not None else Optional[str], meta.text)
        else:
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            yield Flag(prefix + (f.name,), meta, _plain(hints[f.name]), default)


def _plain(annotation: Any) -> Any:
    """`int | None` as Optional[int] (what the command line's framework reads)."""
    args = typing.get_args(annotation)
    if type(None) in args and len(args) == 2:
        return Optional[next(a for a in args if a is not type(None))]
    return annotation


def _part(annotation: Any) -> type | None:
    """The dataclass a field holds (`X` or `X | None`) when that dataclass has knobs, else None."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if len(args) == 1 and dataclasses.is_dataclass(args[0]) and isinstance(args[0], type) and _has_knobs(args[0]):
        return args[0]
    return None


@functools.cache
def _has_knobs(cls: type) -> bool:
    return next(_walk(cls, ()), None) is not None


def build(cls: type, values: dict[tuple[str, ...], Any]) -> Any:
    """The config `cls` from flag values keyed by path (text is parsed here, a value already parsed
    is kept); knobs not given, and parsed knobs whose flag was left out (None), keep the field's
    default. Parts are built first, from their own knobs."""
    given = {path: v for path, v in values.items() if v is not None or _knob(cls, path).parse is None}
    return _build(cls, (), {path: _parsed(cls, path, v) for path, v in given.items()})


def _parsed(cls: type, path: tuple[str, ...], value: Any) -> Any:
    meta = _knob(cls, path)
    return meta.parse(value, meta.label) if meta.parse is not None and isinstance(value, str) else value


def _knob(cls: type, path: tuple[str, ...]) -> Knob:
    hints = typing.get_type_hints(cls)
    f = next(f for f in dataclasses.fields(cls) if f.name == path[0])
    return knob_of(f) if len(path) == 1 else _knob(_part(hints[f.name]), path[1:])  # type: ignore[arg-type,return-value]


def _build(cls: type, prefix: tuple[str, ...], values: dict[tuple[str, ...], Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        path = prefix + (f.name,)
        if path in values:
            kwargs[f.name] = values[path]
        elif (kind := _part(hints[f.name])) is not None and any(p[:len(path)] == path for p in values):
            kwargs[f.name] = _build(kind, path, values)
    make = getattr(cls, "from_knobs", cls) if prefix else cls
    try:
        return make(**kwargs)
    except FieldError as e:
        raise ValueError(told(e)) from e


def told(error: Exception) -> str:
    """An error as the command line says it: a FieldError's fields named by their owner's knobs'
    labels (`--check-replicas-every must be ...`), any other error as it is."""
    if not isinstance(error, FieldError) or error.owner is None or not dataclasses.is_dataclass(error.owner):
        return str(error)
    return error.naming({f.name: k.label if (k := knob_of(f)) else f.name for f in dataclasses.fields(error.owner)})
