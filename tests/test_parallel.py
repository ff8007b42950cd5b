"""tests/parallel.py: on two workers the suite's tests run side by side, and a test marked `alone`
runs while no other test does."""

from pathlib import Path

pytest_plugins = ("pytester",)

LOGGED = """
import os, time, pytest

@pytest.fixture
def logged(request):
    start = time.monotonic()
    yield
    alone = request.node.get_closest_marker("alone") is not None
    with open(os.environ["TEST_LOG"], "a") as log:
        log.write(f"{request.node.name} {int(alone)} {start} {time.monotonic()}\\n")
"""


def test_an_alone_test_runs_while_no_other_test_does(pytester, monkeypatch, tmp_path):
    log = tmp_path / "log"
    pytester.makeconftest(f'pytest_plugins = ("parallel",)\n{LOGGED}')
    side = "".join(f"def test_side_{i}(logged):\n    time.sleep(0.3)\n" for i in range(20))
    alone = "".join(f"@pytest.mark.alone\ndef test_alone_{i}(logged):\n    time.sleep(0.3)\n" for i in range(2))
    pytester.makepyfile(test_side=f"import time\n{side}",
                        test_mixed=f"import time, pytest\ndef test_first(logged):\n    time.sleep(0.5)\n{alone}")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    monkeypatch.setenv("TEST_LOG", str(log))
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=23)
    runs = {name: (alone == "1", float(start), float(end))
            for name, alone, start, end in (line.split() for line in log.read_text().splitlines())}

    def overlap(a: str, b: str) -> bool:
        return runs[a][1] < runs[b][2] and runs[b][1] < runs[a][2]

    assert any(overlap("test_first", f"test_side_{i}") for i in range(20)), runs  # two workers at once
    for alone in ("test_alone_0", "test_alone_1"):
        assert runs[alone][0] and not any(overlap(alone, other) for other in runs if other != alone), runs
