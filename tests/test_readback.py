"""The step readback queue (readback.py): lag 1 finishes each step when the next is
issued, in order; flush finishes the rest; lag 0 at once."""

import pytest
import torch

from distval.readback import Readback, StepMarks, lag_for, to_host
from distval.train.config import MetricsConfig


def test_lag_one_finishes_the_previous_step_when_the_next_is_issued():
    done: list[int] = []
    queue = Readback(1, done.append)
    queue.push(0)
    assert done == []
    queue.push(1)
    queue.push(2)
    assert done == [0, 1]
    queue.flush()
    assert done == [0, 1, 2]
    queue.flush()
    assert done == [0, 1, 2]


def test_lag_zero_finishes_at_once():
    done: list[int] = []
    queue = Readback(0, done.append)
    queue.push(7)
    assert done == [7]


def test_late_on_a_gpu_at_once_on_the_host_unless_asked():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert [lag_for(r, cpu) for r in ("auto", "now", "late")] == [0, 0, 1]
    assert [lag_for(r, gpu) for r in ("auto", "now", "late")] == [1, 0, 1]
    with pytest.raises(ValueError, match="^readback must be auto, now or late"):
        MetricsConfig(readback="sometimes")


def test_host_marks_time_the_interval_and_values_stay_put():
    clock = StepMarks(torch.device("cpu"))
    clock.mark("start")
    sum(range(10000))
    clock.mark("end")
    assert 0 < clock.seconds("start", "end") < 1 and not clock.cuda
    values = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert to_host(values) is values
