"""The shape of the house, checked from the source: no import circle between distval's packages
(imports inside functions count; imports for type annotations only, under TYPE_CHECKING, do
not), and the command line's framework stays in `cli/`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import distval

SRC = Path(distval.__file__).parent


def _unit(module: str) -> str:
    """The package (or top-level module) a dotted distval module belongs to: distval.comm.layer
    -> comm, distval.rank -> rank."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "distval"


def _runtime_imports(tree: ast.AST) -> list[str]:
    """Every distval module imported, anywhere in the file, except under `if TYPE_CHECKING:`."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("distval"):
            found.extend(f"{node.module}.{a.name}" if node.module == "distval" else node.module for a in node.names)
        elif isinstance(node, ast.Import):
            found.extend(a.name for a in node.names if a.name.startswith("distval"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def package_graph() -> dict[str, dict[str, str]]:
    """unit -> {unit it imports: one file that does}."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        unit = _unit(module) if path.parent != SRC else rel.parts[-1]
        for imported in _runtime_imports(ast.parse(path.read_text(), str(path))):
            target = _unit(imported)
            if target not in (unit, "distval", "__version__"):
                graph.setdefault(unit, {}).setdefault(target, str(path.relative_to(SRC)))
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One import circle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := walk(start)):
            return cycle
    return None


def test_no_import_circle_between_packages():
    graph = package_graph()
    cycle = find_cycle(graph)
    where = [f"{a} -> {b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:])] if cycle else []
    assert cycle is None, "import circle: " + "; ".join(where)
    assert {"comm", "rank"} <= set(graph["launch"])  # the graph is really read


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b": "x"}, "b": {"c": "y"}, "c": {"a": "z"}}, ["a", "b", "c", "a"]),
    ({"a": {"b": "x"}, "b": {"c": "y"}, "c": {}}, None),
])
def test_find_cycle(graph, expected):
    assert find_cycle(graph) == expected


def test_type_checking_imports_are_not_runtime_imports():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from distval.rank import X\n"
                     "def f():\n    from distval.comm import layer\n")
    assert _runtime_imports(tree) == ["distval.comm"]


def test_only_the_command_line_imports_typer():
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                   if any(name == "typer" or name.startswith("typer.") for name in _imports_of(p)))
    assert users and all(u.startswith("cli/") for u in users), users


def _imports_of(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_every_distval_environment_variable_is_declared_once_and_documented():
    """envvars.py declares each DISTVAL_* variable; no other module spells one as a value (a
    docstring may name it), every name used anywhere in the repository's code is declared, and
    docs/architecture.md lists each with its meaning."""
    import re

    from distval import envvars

    declared = {v.name for v in envvars.ALL}
    assert len(declared) == len(envvars.ALL)
    spelled: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "envvars.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                    and re.fullmatch(r"DISTVAL_[A-Z_]+", node.value):
                spelled.setdefault(node.value, []).append(str(path.relative_to(SRC)))
    assert not spelled, f"use distval.envvars instead of spelling these: {spelled}"
    repo = SRC.parents[1]
    used = {m for folder in ("src", "benchmarks", "examples") for p in (repo / folder).rglob("*.py")
            for m in re.findall(r"DISTVAL_[A-Z][A-Z_]*[A-Z]", p.read_text())}
    assert used <= declared, f"undeclared: {sorted(used - declared)}"
    doc = (repo / "docs" / "architecture.md").read_text()
    assert all(f"`{name}`" in doc for name in declared), sorted(n for n in declared if f"`{n}`" not in doc)


def module_graph() -> dict[str, dict[str, str]]:
    """distval module -> {module it imports at run time: that file}; `from pkg import name` counts
    as importing pkg.name where that is a module, else pkg."""
    modules = {".".join(p.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in SRC.rglob("*.py")}
    graph: dict[str, dict[str, str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        targets: list[str] = []

        def visit(node: ast.AST) -> None:
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                for child in node.orelse:
                    visit(child)
                return
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("distval"):
                targets.extend(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                               for a in node.names)
            elif isinstance(node, ast.Import):
                targets.extend(a.name for a in node.names if a.name.startswith("distval"))
            for child in ast.iter_child_nodes(node):
                visit(child)

        visit(tree)
        for target in targets:
            if target in modules and target != module:
                graph.setdefault(module, {}).setdefault(target, str(path.relative_to(SRC)))
    return graph


def test_no_import_circle_between_modules_of_a_package():
    """Inside a package too, a module's imports (at run time, in functions as well) never lead back
    to it: what two modules share lives below both."""
    graph = module_graph()
    for package in sorted({m.rsplit(".", 1)[0] for m in graph}):
        inside = {m: {t: f for t, f in targets.items() if t.rsplit(".", 1)[0] == package}
                  for m, targets in graph.items() if m.rsplit(".", 1)[0] == package}
        assert find_cycle(inside) is None, f"{package}: {find_cycle(inside)}"


def test_the_rank_channel_speaks_only_the_declared_protocol():
    """Every message kind is distval.protocol's `Kind`: no call that publishes or reads the channel
    spells one as a string; a kind or a payload field not declared there is refused at publish."""
    from distval import protocol

    names = {k.value for k in protocol.Kind}
    calls = ("publish", "latest", "all", "of", "clear", "put")
    spelled = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            on_class = getattr(getattr(node.func, "value", None), "id", "a")[:1].isupper()  # StageResult.of(...)
            if getattr(node.func, "attr", getattr(node.func, "id", None)) in calls and not on_class:
                spelled += [f"{path.relative_to(SRC)}:{node.lineno} {a.value!r}" for a in node.args
                            if isinstance(a, ast.Constant) and a.value in names]
    assert not spelled, spelled
    assert set(protocol.PAYLOADS) == set(protocol.Kind)
    assert protocol.check(protocol.Kind.NOTE, {"no_restart": "x", "exit_code": 3}) == "note"
    with pytest.raises(ValueError, match="has no kind 'notes'"):
        protocol.check("notes", {})
    with pytest.raises(ValueError, match="'status' has no field"):
        protocol.check(protocol.Kind.STATUS, {"status": "x", "stauts": 1})


def test_scoped_environment_is_put_back_as_it_was(monkeypatch):
    """Library code sets variables for a block (a launch, a data set's load) and restores them."""
    import os

    from distval.envvars import scoped

    monkeypatch.setenv("DISTVAL_TEST_KEPT", "before")
    monkeypatch.delenv("DISTVAL_TEST_NEW", raising=False)
    with pytest.raises(RuntimeError):
        with scoped({"DISTVAL_TEST_KEPT": "inside", "DISTVAL_TEST_NEW": "1"}):
            assert os.environ["DISTVAL_TEST_KEPT"] == "inside" and os.environ["DISTVAL_TEST_NEW"] == "1"
            raise RuntimeError("the block failed")
    assert os.environ["DISTVAL_TEST_KEPT"] == "before" and "DISTVAL_TEST_NEW" not in os.environ


# methods of a config that spell flags on purpose: the world is known only at launch, when the
# message names a flag of another config (--nproc); nccl-tests' two names at once (-n/--iters)
SPELLED_FLAGS = {"TrainConfig.check_world", "ScaleConfig.ladder", "CheckConfig.__post_init__",
                 "PairsConfig.__post_init__"}


def test_a_configs_validation_names_fields_not_flags():
    """A class with knobs raises FieldError (distval/knobs.py) naming its fields; no ValueError of
    its methods spells a flag ("--..."), which the command line would name a second way."""
    spelled = []
    for path in sorted(SRC.rglob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(cls, ast.ClassDef) and any(
                    isinstance(n, ast.AnnAssign) and getattr(getattr(n.value, "func", None), "id", None) == "knob"
                    for n in cls.body)):
                continue
            for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                for node in ast.walk(method):
                    if (isinstance(node, ast.Raise) and getattr(getattr(node.exc, "func", None), "id", None)
                            == "ValueError" and f"{cls.name}.{method.name}" not in SPELLED_FLAGS
                            and any(isinstance(s, ast.Constant) and "--" in str(s.value) for s in ast.walk(node.exc))):
                        spelled.append(f"{path.relative_to(SRC)}:{node.lineno} {cls.name}.{method.name}")
    assert not spelled, spelled


def test_a_knob_names_its_flag_only_where_the_fields_name_does_not_give_it():
    """`knob()` without names takes the field's name as its flag (knobs.flag_of); one that spells
    that same flag says it twice, and the two drift apart on the next rename."""
    from distval.knobs import flag_of

    twice = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and getattr(getattr(node.value, "func", None), "id", None) == "knob"
                    and [getattr(a, "value", None) for a in node.value.args[1:]] == [flag_of(node.target.id)]):
                twice.append(f"{path.relative_to(SRC)}:{node.lineno} {node.target.id}")
    assert not twice, twice


def test_every_config_with_knobs_lives_in_its_packages_config_py():
    """A config whose fields are flags is found where the next engineer looks: its package's
    config.py (torch-free: the command line reads its flags without importing torch)."""
    elsewhere = []
    for path in sorted(SRC.rglob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text())):
            if isinstance(cls, ast.ClassDef) and any(
                    isinstance(n, ast.AnnAssign) and getattr(getattr(n.value, "func", None), "id", None) == "knob"
                    for n in cls.body) and path.name != "config.py":
                elsewhere.append(f"{path.relative_to(SRC)} {cls.name}")
    assert not elsewhere, elsewhere


def test_a_field_error_is_raised_by_its_configs_own_method():
    """FieldError takes its owner from the raising method's `self` or `cls` (knobs.py): raised
    anywhere else the command line could not name the field by its flag."""
    stray = []
    for path in sorted(SRC.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = fn.args.args[0].arg if fn.args.args else None
                stray += [f"{path.relative_to(SRC)}:{node.lineno} {fn.name}" for node in ast.walk(fn)
                          if isinstance(node, ast.Raise) and getattr(getattr(node.exc, "func", None), "id", None)
                          == "FieldError" and first not in ("self", "cls")]
    assert not stray, stray


ROOT = SRC.parent.parent
PAST_ROUND = re.compile(r"\b(session|stop|wave)s? #?\d+\b", re.IGNORECASE)  # a stop, session or wave by its number


def test_docs_state_contracts_not_the_history_of_their_work():
    """README at most 300 lines (what distval is, the two commands, one example per command), and
    no numbered reference to a past round of work anywhere a reader looks: one cannot look it up."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *SRC.rglob("*.py"),
             *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "tests").glob("*.py")]
    found = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)}" for p in texts
             for n, line in enumerate(p.read_text().splitlines(), 1) for m in PAST_ROUND.finditer(line)]
    assert not found, found
