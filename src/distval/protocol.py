"""The rank channel's protocol: every kind of message on it, declared once with its payload's fields.

The channel (launch/channel.py) carries JSON objects under `distval/<kind>/<index>` of a c10d store:
ranks publish under their rank, a node's watcher its digest under its node, the leader its verdict
under 0; every payload gets "time" (epoch s) added. `check(kind, payload)` runs on every publish and
put: a kind not declared here, or a field its payload does not declare, is a programming error
raised at once (tests/test_architecture.py also fails on a kind spelled as a string).

Kinds, who writes them, who reads them:
  status        a rank, at once (RankContext.status; the shim)   hang watchdog, failure diagnosis
  step          rank 0 of `distval train`, per finished step      progress line, OpenMetrics
  state         a rank that fails or is stopped, at once          failure diagnosis (health/diagnose.py)
  note          a rank asking the agent not to restart            the launcher's monitor loop
  health        rank 0 of `distval train`, per new finding        progress line
  heartbeat     every rank's heartbeat thread (health/heartbeat.py)   watchdog, lost time, metrics
  fingerprints  the heartbeat thread, per window of collectives   watchdog's mismatch check
  steps         a script's step clock (health/steps.py)           ScriptDetectors, straggler rule
  probe         a script's NaN/replica probe (health/probe.py)    ScriptDetectors
  probe_names   the probe, once                                   ScriptDetectors
  position      rank 0 of `distval train` at each checkpoint      a restarted attempt (ckpt/checkpointer.py)
  node          a node's watcher (health/digest.py)               the leader's DigestReader
  verdict       the leader's watcher                              every node's watcher
"""

from __future__ import annotations

import enum
from typing import Any, TypedDict


class Kind(str, enum.Enum):
    STATUS = "status"
    STEP = "step"
    STATE = "state"
    NOTE = "note"
    HEALTH = "health"
    HEARTBEAT = "heartbeat"
    FINGERPRINTS = "fingerprints"
    STEPS = "steps"
    PROBE = "probe"
    PROBE_NAMES = "probe_names"
    POSITION = "position"
    NODE = "node"
    VERDICT = "verdict"

    def __str__(self) -> str:  # the key's part, as Python 3.11+'s StrEnum would write it
        return self.value


class Status(TypedDict, total=False):
    status: str  # what the rank is about to do ("train zero2 step 41"): named if it dies or hangs there
    pid: int  # the worker's process (the launcher names a death by it)
    host: str
    step: int  # the training step it is in (distval train)
    busy: bool  # a long phase that is not a hang (a checkpoint save): the watchdog allows busy_s
    script: bool  # a user's script under `distval launch` (the shim)
    stepped: bool  # the script finished its first optimizer step (start-up is over)
    done: bool  # the script returned: the worker is exiting, not hung


class Step(TypedDict, total=False):
    step: int
    loss: float
    step_time_s: float
    tokens_per_s: float
    ranks: list  # per rank: the health monitor's live figures (compute, waiting, memory)
    findings: dict  # "kind/status" -> how many so far


class State(TypedDict, total=False):
    rank: int
    error: str | None  # None: stopped from outside (SIGTERM)
    status: str  # its last status
    issued: int  # collectives issued on the measured and control groups
    pending: list  # the collectives issued and not completed (comm/layer.py OpRecord dicts)
    last_op: dict | None
    traceback: str
    recent: dict  # the fingerprints of its last collectives per group (the Flight Recorder's)
    script_step: int  # a script's optimizer steps finished (0: it died during start-up)


class Note(TypedDict, total=False):
    no_restart: str  # why the agent must not restart the job
    exit_code: int  # 1 a finding, 2 bad input, 3 could not run
    rank: int | None  # the culprit, when one
    startup: bool  # the script's own error before its first step


class Health(TypedDict, total=False):
    status: str
    summary: str


class Heartbeat(TypedDict, total=False):
    pid: int
    host: str
    status: str
    busy: bool  # declared busy, or inside torch.compile
    step: int | None
    groups: dict  # process group -> [last enqueued, last completed] collective number
    pending: list  # once stalled: what it waits in ({pg, seq, op, sizes, dtypes})
    windows: dict  # process group -> {window: digest} of its last fingerprint windows
    cpu_s: float  # the process's CPU time
    state: str  # added by a node's digest (not by the rank): the /proc state letter


class Fingerprints(TypedDict, total=False):
    windows: dict  # process group -> {window: {"prints": [...], ...}}


class Steps(TypedDict, total=False):
    host: str
    rows: list  # the step clock's last rows: step, arrival, compute, memory


class Probe(TypedDict, total=False):
    layout: str  # how the parameters are held (replicated, sharded)
    shard: Any
    names_key: int  # crc32 of the names in checksum order (probe_names)
    nonfinite: Any  # the first non-finite tensor seen, if any
    checked: int  # the last step checked
    replicas: list  # the last checksums, a few steps' worth
    nan_every: int
    replicas_every: int


class ProbeNames(TypedDict, total=False):
    names: list  # the parameters' names in checksum order


class Position(TypedDict, total=False):
    attempt: int
    step: int


class Node(TypedDict, total=False):
    node: int
    host: str
    store: str | None
    ranks: list
    pids: list
    beats: list  # heartbeats grouped where equal (per-rank fields left out)
    statuses: list
    states: dict  # rank -> a /proc state letter other than running


class Verdict(TypedDict, total=False):
    kind: str  # stopped, dead, outside, mismatch, network
    culprits: list
    verdict: str
    hung: bool
    attempt: int


PAYLOADS: dict[Kind, type] = {
    Kind.STATUS: Status, Kind.STEP: Step, Kind.STATE: State, Kind.NOTE: Note, Kind.HEALTH: Health,
    Kind.HEARTBEAT: Heartbeat, Kind.FINGERPRINTS: Fingerprints, Kind.STEPS: Steps, Kind.PROBE: Probe,
    Kind.PROBE_NAMES: ProbeNames, Kind.POSITION: Position, Kind.NODE: Node, Kind.VERDICT: Verdict,
}
_FIELDS = {kind: frozenset(payload.__annotations__) | {"time"} for kind, payload in PAYLOADS.items()}  # time: added


def check(kind: Kind | str, payload: dict[str, Any]) -> str:
    """The key part of `kind`; raises ValueError for a kind or a field not declared here."""
    try:
        known = Kind(kind)
    except ValueError:
        raise ValueError(f"the rank channel has no kind {kind!r}: declare it in distval/protocol.py") from None
    extra = payload.keys() - _FIELDS[known]
    if extra:
        raise ValueError(f"the rank channel's {known.value!r} has no field(s) {', '.join(sorted(extra))}: declare "
                         f"them in distval/protocol.py")
    return known.value
