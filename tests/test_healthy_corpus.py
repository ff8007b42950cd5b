"""Healthy scripts get no health finding under `distval launch`: two styles of the corpus
(benchmarks/corpus/, counted many times by benchmarks/healthy_corpus.py), each once on 2 ranks
for 120 steps: rank 0 evaluating and saving alone with a barrier after the save (plain_ddp), and
a Trainer whose optimizer steps through a closure, with validation collectives of other shapes and
a metric logger (closure)."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import REPO

_spec = importlib.util.spec_from_file_location("healthy_corpus", REPO / "benchmarks" / "healthy_corpus.py")
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)

# every detector judges a 120-step run: stragglers over >= 50 steps, replicas at steps 50 and 100
JUDGED = ("launch script", "health stragglers", "health numerics", "health memory", "health replicas")


@pytest.mark.parametrize("style", ["plain_ddp", "closure"])
def test_a_healthy_script_ends_with_exit_0_and_no_health_finding(style):
    record = corpus.run_once(style, nproc=2, step_ms=20, steps=120, timeout_s=150)
    assert record["exit_code"] == 0, record
    assert record["findings"] == [], record
    assert {name: record["checks"].get(name) for name in JUDGED} == dict.fromkeys(JUDGED, "OK"), record
