"""Knobs (distval/knobs.py): a knob's flag is its field's name unless it names another; FieldError:
a config's validation names fields; built from flags (or told by `told`), the message names each
field by its knob's label, in library use by the field's name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from distval import knobs
from distval.health.config import HangPolicy, HealthConfig
from distval.knobs import FieldError, knob
from distval.plan.config import PlanConfig
from distval.train.config import TrainConfig


@dataclass(frozen=True)
class Part:
    size: int = knob(1, "--part-size", "-s", help="A size.")

    def __post_init__(self) -> None:
        if self.size < 1:
            raise FieldError("size", f"must be at least 1 (got {self.size})")


@dataclass(frozen=True)
class Whole:
    nodes: int = knob(1, "--nodes", help="Nodes.")
    endpoint: str | None = knob(None, "--endpoint", help="HOST:PORT.")
    mode: str = knob("fast", "--mode", help="fast or slow.")
    part: Part = field(default_factory=Part)

    def __post_init__(self) -> None:
        if self.nodes > 1 and not self.endpoint:
            raise FieldError("nodes", f"{self.nodes} needs {{endpoint}} HOST:PORT")
        if self.mode not in ("fast", "slow"):
            raise FieldError("mode", f"unknown {{mode}} {self.mode!r}: fast or slow")


@dataclass(frozen=True)
class Watched:
    hang: HangPolicy | None = field(default_factory=HangPolicy)


def test_the_library_form_names_the_field():
    with pytest.raises(FieldError) as e:
        Part(size=0)
    assert (e.value.field, str(e.value)) == ("size", "size must be at least 1 (got 0)")
    with pytest.raises(ValueError, match=r"^replicas_every must be 0 \(off\) or more \(got -1\)$"):
        HealthConfig(replicas_every=-1)


def test_the_command_line_form_names_the_flag():
    with pytest.raises(ValueError) as e:
        knobs.build(Whole, {("mode",): "quick"})
    assert str(e.value) == "unknown --mode 'quick': fast or slow"  # names its own field where it reads better
    assert not isinstance(e.value, FieldError)  # told once, as the user typed it
    with pytest.raises(ValueError) as e:
        knobs.build(Whole, {("mode",): "{fast}"})
    assert str(e.value) == "unknown --mode '{fast}': fast or slow"  # braces of no field's name: as typed
    with pytest.raises(ValueError, match=r"^--check-replicas-every must be 0 \(off\) or more \(got -1\)$"):
        knobs.build(HealthConfig, {("replicas_every",): -1})


def test_a_parts_field_is_named_by_the_parts_flag():
    with pytest.raises(ValueError) as e:
        knobs.build(Whole, {("part", "size"): 0})
    assert str(e.value) == "-s must be at least 1 (got 0)"  # the short name: the knob's label
    with pytest.raises(ValueError, match=r"^--check-replicas-every must be 0 \(off\) or more \(got -1\)$"):
        knobs.build(TrainConfig, {("health", "replicas_every"): -1})
    with pytest.raises(ValueError, match=r"^--hang-after must be positive \(got 0 s\), e\.g\. 30s$"):
        knobs.build(Watched, {("hang", "floor_s"): "0s"})  # a part built by its from_knobs


def test_another_field_named_in_the_message_is_named_in_both_forms():
    with pytest.raises(FieldError, match=r"^nodes 2 needs endpoint HOST:PORT$"):
        Whole(nodes=2)
    with pytest.raises(ValueError, match=r"^--nodes 2 needs --endpoint HOST:PORT$"):
        knobs.build(Whole, {("nodes",): 2})
    with pytest.raises(FieldError, match=r"^link and bandwidth_gbps both give the link; use one$"):
        PlanConfig(link="10GbE", bandwidth_gbps=1.0)
    with pytest.raises(ValueError, match=r"^--link and --bandwidth both give the link; use one$"):
        knobs.build(PlanConfig, {("link",): "10GbE", ("bandwidth_gbps",): 1.0})


@dataclass(frozen=True)
class Derived:
    max_restarts: int = knob(0, help="Restarts.")
    timeout_s: float = knob(60.0, help="A duration.", parse=lambda text, flag: float(text.rstrip("s")), text="60s")
    min_bytes: int = knob(8, "--minbytes", "-b", help="As nccl-tests names it.")

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise FieldError("timeout_s", f"must be positive (got {self.timeout_s:g})")


def test_a_knob_without_names_takes_its_fields_name_as_its_flag():
    by_path = {f.path: f.knob for f in knobs.flags(Derived)}
    assert [k.names for k in by_path.values()] == [("--max-restarts",), ("--timeout",), ("--minbytes", "-b")]
    assert by_path[("timeout_s",)].param == "timeout" and by_path[("min_bytes",)].label == "-b"
    assert knobs.build(Derived, {("timeout_s",): "30s", ("max_restarts",): 2}) == Derived(2, 30.0)
    with pytest.raises(ValueError, match=r"^--timeout must be positive \(got -1\)$"):
        knobs.build(Derived, {("timeout_s",): "-1s"})


def test_an_error_of_a_config_built_otherwise_is_told_by_its_flags():
    """A config made by dataclasses.replace (a sweep's value) raises its FieldError outside any
    build from flags: `told` names its fields by their owner's knobs all the same."""
    base = knobs.build(Whole, {})
    with pytest.raises(FieldError) as raised:
        dataclasses.replace(base, nodes=2)
    assert raised.value.owner is Whole and str(raised.value) == "nodes 2 needs endpoint HOST:PORT"
    assert knobs.told(raised.value) == "--nodes 2 needs --endpoint HOST:PORT"
    assert knobs.told(ValueError("--sweep 'x': use NAME=v1,v2")) == "--sweep 'x': use NAME=v1,v2"
