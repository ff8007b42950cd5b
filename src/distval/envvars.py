"""Every `DISTVAL_*` environment variable, declared once: its name, its form, who sets it and who
reads it. Modules take the name from here; tests/test_architecture.py fails on a `DISTVAL_` name
spelled anywhere else, and docs/architecture.md's table is checked against this list.

Most are how a launching process tells the processes it starts what to do (the launcher its
workers, `distval emulate` its nodes); three are for people: `DISTVAL_FAULT` (tests and drills),
`DISTVAL_NETCHECK` and `DISTVAL_PROGRESS_EVERY`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator, Mapping


@dataclass(frozen=True)
class EnvVar:
    name: str
    form: str
    set_by: str
    read_by: str
    meaning: str


CHANNEL = EnvVar("DISTVAL_CHANNEL", "host:port", "`distval launch` / the local launcher, for every worker",
                 "launch/channel.py", "the launcher's store, where ranks publish their status, steps and notes")
PROBE = EnvVar("DISTVAL_PROBE", "NAN_EVERY:REPLICAS_EVERY (0: off)", "`distval launch`, for every worker",
               "health/probe.py", "how often a user's script is checked for non-finite values and replica drift")
TRACE = EnvVar("DISTVAL_TRACE", "SKIP:STEPS:DIR", "`distval launch --trace`, for every worker", "trace/capture.py",
               "profile STEPS optimizer steps after SKIP and write each rank's trace to DIR")
FAULT = EnvVar("DISTVAL_FAULT", "key=value,...;... (health/faults.py)", "people: tests, drills, benchmarks",
               "health/faults.py", "faults injected into a job: a corrupted, skipped or hung collective, a killed, "
                                   "slowed, stopped or leaking rank, a NaN")
EMULATED = EnvVar("DISTVAL_EMULATED", "JSON", "`distval emulate`, for every node", "meta.py",
                  "the emulated cluster's topology, recorded in every report's meta")
EMULATE_DIR = EnvVar("DISTVAL_EMULATE_DIR", "a folder", "`distval emulate`, for every node", "cli/node.py",
                     "where each emulated node writes its ranks' exit records")
NETCHECK = EnvVar("DISTVAL_NETCHECK", "0/off/no/false to disable", "people", "launch/netcheck.py",
                  "the check that a multi-node job's rendezvous address is reachable before ranks start")
PROGRESS_EVERY = EnvVar("DISTVAL_PROGRESS_EVERY", "seconds (default 10)", "people", "train/progress.py",
                        "how often `distval train` prints a progress line when stderr is not a terminal")
FR_DUMPS = EnvVar("DISTVAL_FR_DUMPS", "a folder", "the local launcher, for every worker (`--fr-dumps`)",
                  "health/heartbeat.py", "where a rank that is stopped or fails writes its Flight Recorder dump, "
                                         "which the launcher keeps on a hang verdict (`distval diagnose` reads it)")

ALL = (CHANNEL, PROBE, TRACE, FAULT, EMULATED, EMULATE_DIR, NETCHECK, PROGRESS_EVERY, FR_DUMPS)


@contextlib.contextmanager
def scoped(values: Mapping[str, str]) -> Iterator[None]:
    """`values` set in this process's environment for the block (and the processes it starts),
    then what was there before put back: library code leaves the environment as it found it."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
