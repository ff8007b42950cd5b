"""`--expect FILE`: measured figures of a Report turned into PASS/FAIL checks against stated
thresholds (docs/expectations.md). Torch-free, so the command line loads it before any job runs.

    from distval.expect import load, judge
    exp = load("preset:8xH100-NVLink")        # or a TOML file's path; ValueError (one line) if wrong
    for check in judge(exp, report):           # one Check per threshold: OK, FAIL or SKIP
        report.add(check)

`spec.py` reads and validates the file (and the shipped presets in `presets/`), `judge.py` compares.
"""

from distval.expect.judge import judge
from distval.expect.spec import (
    PRESET_PREFIX,
    PRESETS,
    BenchExpectation,
    Expectations,
    PairsExpectation,
    ScaleExpectation,
    TrainExpectation,
    list_presets,
    load,
    parse,
)

__all__ = ["load", "parse", "judge", "list_presets", "PRESETS", "PRESET_PREFIX", "Expectations", "BenchExpectation",
           "PairsExpectation", "ScaleExpectation", "TrainExpectation"]
