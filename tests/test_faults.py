"""health/faults.py: one grammar for collective and step faults, and where each one fires."""

import pytest
import torch

from distval.health.faults import Fault, Faults, parse


def test_one_grammar_for_collective_and_step_faults():
    assert parse("op=all_reduce,rank=1,index=3") == [Fault(rank=1, action="corrupt", op="all_reduce", index=3)]
    assert parse("op=broadcast,rank=0,action=hang")[0].action == "hang"
    assert parse("") == [] and parse(None) == []
    both = parse("step=7,rank=1,action=kill_in_save,attempt=-1; op=any,rank=0,action=kill,nth=500")
    assert [(f.step, f.op, f.action, f.attempt) for f in both] == [
        (7, None, "kill_in_save", -1),
        (None, "any", "kill", 0),
    ]


@pytest.mark.parametrize("value, message", [
    ("op=x,rank=0,action=explode", "action 'explode'; choose from corrupt, raise"),
    ("step=3,rank=0,action=corrupt", "'corrupt' applies to op=, not step="),
    ("op=all_reduce,rank=0,action=sigterm", "'sigterm' applies to step=, not op="),
    ("rank=0,action=kill", "either op= .* or step="),
    ("op=all_reduce,action=kill", "names no rank="),
    ("op=all_reduce,rank=one", "rank='one' is not a whole number"),
    ("op=all_reduce,rank=0,when=now", "unknown key 'when'"),
])
def test_bad_faults_are_one_line_errors(value, message):
    with pytest.raises(ValueError, match=message):
        parse(value)


def test_a_rank_gets_only_its_own_faults_and_the_nth_call_fires():
    faults = Faults(
        parse("op=all_reduce,rank=1,index=2,nth=2;step=5,rank=1,action=kill_in_save;op=all_reduce,rank=0"), 1
    )
    assert len(faults.on_ops) == 1 and len(faults.on_steps) == 1
    out = torch.zeros(4, dtype=torch.int32)
    faults.after_op("broadcast", [out])  # another op: not counted
    faults.after_op("all_reduce", [out])  # the first call: untouched
    assert out.tolist() == [0, 0, 0, 0]
    faults.after_op("all_reduce", [out])  # the second: the lowest bit of element 2 flipped
    assert out.tolist() == [0, 0, 1, 0]
    assert faults.in_save(6) and not faults.in_save(4)
    assert not Faults(parse("op=all_reduce,rank=1"), 0)  # nothing armed on rank 0


def test_a_step_fault_fires_only_in_its_attempt(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert not Faults(parse("step=2,rank=0,action=raise"), 0)  # attempt 0 only: this is attempt 1
    again = Faults(parse("step=2,rank=0,action=raise,attempt=-1"), 0)
    again.at_step(1)
    with pytest.raises(RuntimeError, match="DISTVAL_FAULT: injected failure at step 2 on rank 0"):
        again.at_step(2)
