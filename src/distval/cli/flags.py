"""Flags generated from config fields (distval/knobs.py): a command asks for a config and gets
every knob of it as a flag, with the field's default and help; it receives the config built from
what the user typed. A field and its flag cannot drift (tests/test_cli_flags.py checks every
command's flags against its configs' fields).

    @app.command("bench")
    @config_flags("cfg", BenchConfig)
    @config_flags("opts", LaunchOptions, only=LAUNCH)
    def comm_bench(cfg: BenchConfig, opts: LaunchOptions, json: JsonOut = None) -> int: ...

Decorators stack (the outermost's flags come first in --help). `only` keeps some knobs (by field
name; a part's by "part.field"), `skip` drops some, `defaults` overrides a default for this command
(by parameter name), `names` renames a flag for this command (e.g. --nproc-per-node), `build`
replaces the constructor (for a config that needs more than its knobs).
"""

from __future__ import annotations

import functools
import inspect
from typing import Annotated, Any, Callable, Iterable, Optional

import typer

from distval import knobs


def config_flags(param: str, cls: type, *, only: Optional[Iterable[str]] = None, skip: Iterable[str] = (),
                 defaults: Optional[dict[str, Any]] = None, names: Optional[dict[str, tuple[str, ...]]] = None,
                 build: Optional[Callable[[dict[tuple[str, ...], Any]], Any]] = None) -> Callable:
    chosen = selected(cls, only, skip)
    defaults, names = defaults or {}, names or {}
    unknown = (set(defaults) | set(names)) - {f.knob.param for f in chosen}
    if unknown:
        raise TypeError(f"{cls.__name__} has no flag for {sorted(unknown)}")
    make = build or (lambda values: knobs.build(cls, values))

    def decorate(fn: Callable[..., int]) -> Callable[..., int]:
        own = list(inspect.signature(fn, eval_str=True).parameters.values())
        if param not in {p.name for p in own}:
            raise TypeError(f"{fn.__name__} takes no parameter {param!r} for its {cls.__name__}")
        generated = [
            inspect.Parameter(f.knob.param, inspect.Parameter.KEYWORD_ONLY,
                              annotation=Annotated[f.type, typer.Option(*names.get(f.knob.param, f.knob.names),
                                                                       help=f.knob.help)],
                              default=defaults.get(f.knob.param, f.default))
            for f in chosen]
        clash = {p.name for p in generated} & {p.name for p in own}
        if clash:
            raise TypeError(f"{fn.__name__}: flags {sorted(clash)} declared twice")
        kept = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p.name != param]
        params = generated + kept

        @functools.wraps(fn)
        def command(**kwargs: Any) -> int:
            values = {f.path: kwargs.pop(f.knob.param) for f in chosen}
            return fn(**{param: make(values)}, **kwargs)

        command.__signature__ = inspect.Signature(params, return_annotation=int)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def selected(cls: type, only: Optional[Iterable[str]] = None, skip: Iterable[str] = ()) -> list[knobs.Flag]:
    """The knobs of `cls` a command takes."""
    every = knobs.flags(cls)
    key = {".".join(f.path): f for f in every}
    wanted = list(only) if only is not None else list(key)
    missing = (set(wanted) | set(skip)) - set(key)
    if missing:
        raise TypeError(f"{cls.__name__} has no knob {sorted(missing)}")
    return [key[k] for k in wanted if k not in set(skip)]
