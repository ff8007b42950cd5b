# The two commands of the README:
#   make run    set up, then run the main job (distval run on its built-in default)
#   make test   set up, then lint (ruff) and run the whole test suite
# On CPU machines torch is pinned to 2.13.0 (the CPU wheel); it is installed before the package
# so pip never resolves distval's `torch>=2.6` to a multi-GB CUDA build. On a GPU machine with
# its own torch, skip the Makefile: `pip install -e .` into that environment.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.distval-installed
TORCH ?= torch==2.13.0

.PHONY: setup browser run test test-fast jobs-list bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -qq "$(TORCH)"
	$(PY) -m pip install -qq -e ".[test]"
	touch $(STAMP)

# The browser test of report.html drives the system's Chromium (Debian's package; Playwright never
# downloads one). Installed here when missing and this is root on Debian; otherwise the test skips
# and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }; \
	  } && echo "installed chromium (Debian) for the browser test"; } || \
	  echo "no chromium: the browser test of report.html will skip (as root on Debian: apt-get install chromium)"

run: setup
	$(VENV)/bin/distval run

# compileall: where PYTHONDONTWRITEBYTECODE is set (these machines), every process of the suite
# would compile distval's modules again (0.2-0.3 s of a core each).
# WORKERS: the suite's worker processes, a test file to each (tests/parallel.py); 0 runs it in one.
# Two take about four fifths of one process's time here; a test another test's load would skew is
# marked `alone` (docs/results/2026-11-29-suite-on-two-workers.md).
WORKERS ?= 2
test: setup browser
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(PY) -m compileall -q src
	$(PY) -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist loadfile --durations=15

# The fast tier: every test that starts no process, and one smoke job per command (tests/tiers.py);
# a test that starts a process without being recorded as a job fails here and says so.
test-fast: setup
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(PY) -m compileall -q src
	DISTVAL_TEST_TIER=fast $(PY) -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist loadfile -m "not job or smoke" --durations=10

# Record which tests and fixtures start processes (tests/jobs.txt): a whole run of the suite, in one
# process (the record is one file).
jobs-list: setup
	DISTVAL_TEST_RECORD=tests/jobs.txt $(PY) -m pytest -q -p no:cacheprovider -n 0

bench: setup
	$(PY) benchmarks/overhead_vs_bare.py --nproc 2 -b 1M -e 64M

clean:
	rm -rf $(VENV) distval-report
