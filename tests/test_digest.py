"""The node digests and the leader (health/digest.py): every verdict kind the same from the
digests as from the ranks' own heartbeats, at the node level (one node: the node's watcher is
the leader) and at the leader level (the culprit on another node); then the real pieces over
real TCPStores: node watchers publishing digests, the leader's Watchdog naming a stopped rank on
another node and a fingerprint mismatch read from a node's store, and the requests each costs."""

from __future__ import annotations

import datetime
import json
import time

import pytest
import torch.distributed as dist

from distval.health import digest, fingerprints
from distval.health.config import HangPolicy
from distval.health.digest import DigestReader, NodeAgent, expand, node_digest
from distval.health.hang import decide, diagnose_hang
from distval.health.watchdog import Watchdog
from distval.launch.channel import ChannelReader, RankChannel, put
from distval.protocol import Kind

WORLD = 8


def beat(r: int, issued: int, done: int, pending: list | None = None, **groups: list[int]) -> dict:
    return {"pid": 4000 + r, "host": f"node{r // 4}", "status": "train step 5", "busy": False, "step": 5,
            "groups": {"0": [issued, done], **groups}, "pending": pending or [], "cpu_s": 1.0 + r,
            "windows": {"0": {"1": "9f2c4e1d"}}, "time": 1e9 + r}


def pending(seq: int, op: str = "all_reduce", sizes=((64,),), pg: str = "0") -> list[dict]:
    return [{"pg": pg, "seq": seq, "op": op, "sizes": [list(s) for s in sizes], "dtypes": ["Float"]}]


def waiting(r: int) -> dict:
    return beat(r, 48, 47, pending(48))


# every verdict kind: (flat heartbeats, /proc states as the culprit's own node sees them), culprit rank 5
SCENARIOS = {
    "stopped": ({r: beat(r, 47, 47) if r == 5 else waiting(r) for r in range(WORLD)}, {5: "T"}),
    "dead": ({r: beat(r, 47, 47) if r == 5 else waiting(r) for r in range(WORLD)}, {5: "gone"}),
    "silent": ({r: None if r == 5 else waiting(r) for r in range(WORLD)}, {}),
    "outside": ({r: beat(r, 47, 47) if r == 5 else waiting(r) for r in range(WORLD)}, {}),
    "skipped": ({r: beat(r, 47, 47, pending(14, pg="1"), **{"1": [14, 13]}) if r == 5
                 else beat(r, 48, 47, pending(48), **{"1": [13, 13]}) for r in range(WORLD)}, {}),
    "mismatch": ({r: beat(r, 48, 47, pending(48, sizes=((5,),))) if r == 5 else waiting(r)
                  for r in range(WORLD)}, {}),
    "network": ({r: waiting(r) for r in range(WORLD)}, {}),
}
KINDS = {"stopped": "stopped", "dead": "dead", "silent": "outside", "outside": "outside", "skipped": "outside",
         "mismatch": "mismatch", "network": "network"}


def digests_of(beats: dict, states: dict, per_node: int) -> list[dict]:
    out = []
    for node in range(WORLD // per_node):
        ranks = list(range(node * per_node, (node + 1) * per_node))
        status = {r: {"status": "train step 5", "step": 5, "time": 1e9 + r} for r in ranks}
        mine = {r: beats[r] for r in ranks}
        out.append(node_digest(node, ranks, mine, status, {r: s for r, s in states.items() if r in ranks},
                               host=f"node{node}"))
    return out


@pytest.fixture
def no_sleep(monkeypatch):
    monkeypatch.setattr("distval.health.hang.time.sleep", lambda s: None)


@pytest.mark.parametrize("per_node", [WORLD, 4], ids=["node-level", "leader-level"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_verdict_from_the_digests_is_the_verdict_from_the_heartbeats(name, per_node, no_sleep):
    """Flat: a watchdog on the culprit's host (it sees the /proc state). From digests: the leader
    on another host (leader level: node 1 holds rank 5) knows the state only from the digest."""
    beats, states = SCENARIOS[name]
    flat = decide(beats, states)
    assert (flat[0], flat[1]) == ([5] if name != "network" else [], KINDS[name]), flat
    expanded, _ = expand(digests_of(beats, states, per_node), WORLD)
    hang = diagnose_hang(expanded, 9.0, with_stacks=False)
    assert (hang.culprits, hang.kind, hang.verdict) == flat
    assert hang.certain == (name != "outside")  # a rank outside any collective stays a pause, as flat


def test_ranks_in_step_cost_one_entry_and_come_back_whole():
    beats = {r: waiting(r) for r in range(4)}
    d = node_digest(0, [0, 1, 2, 3], beats, {r: {"status": "train step 5", "time": r} for r in range(4)}, {},
                    host="node0")
    assert len(d["beats"]) == 1 and d["beats"][0][1] == [0, 1, 2, 3] and len(d["statuses"]) == 1
    assert len(json.dumps(d)) < len(json.dumps(beats)) / 2  # the 280-byte heartbeat, once per node
    back, statuses = expand([d], 4)
    assert back[2] == {k: v for k, v in beats[2].items() if k not in ("cpu_s", "time")}
    assert statuses[3] == {"status": "train step 5"}
    beats[1] = beat(1, 49, 48)  # one rank moved on: two entries
    assert len(node_digest(0, [0, 1, 2, 3], beats, {}, {}, host="node0")["beats"]) == 2


class Counting:
    """A store that counts the requests made to it."""

    def __init__(self, store):
        self.store, self.requests = store, 0

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def counted(*args, **kwargs):
            self.requests += 1
            return method(*args, **kwargs)
        return counted


def server() -> tuple[dist.TCPStore, str]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=10))
    return store, f"127.0.0.1:{store.port}"


def test_the_leader_names_a_stopped_rank_on_another_node_and_every_node_learns_it():
    """Two nodes of 4 ranks, each with its own store; the leader's Watchdog reads only the central
    store's digests. Rank 5 (node 1) stops while the others wait: the leader names it stopped at
    the floor, from node 1's digest; node 0 learns the verdict at its next tick."""
    central, central_at = server()
    nodes = [server() for _ in range(2)]
    counted = Counting(dist.TCPStore("127.0.0.1", central.port, is_master=False))
    channels = {r: RankChannel(r, nodes[r // 4][0]) for r in range(WORLD)}
    stopped: set[int] = set()
    watches = [NodeAgent(n, list(range(4 * n, 4 * n + 4)), ChannelReader(nodes[n][0]), ChannelReader(central),
                         lambda kind, d, n=n: put(central, kind, n, d), store=nodes[n][1], host=f"node{n}",
                         states=lambda beats: {r: "T" for r in stopped if r in beats})
               for n in range(2)]
    found = []

    def on_hang(hang):
        found.append((time.monotonic(), hang))
        put(central, Kind.VERDICT, 0, digest.verdict(hang))

    leader = Watchdog(WORLD, HangPolicy(floor_s=1.0), on_hang, every_s=0.1, say=lambda line: None)
    reader = DigestReader(ChannelReader(counted), 2, ChannelReader)
    stopped_at, learned = None, None
    for tick in range(60):
        for r, ch in channels.items():
            frozen = stopped_at is not None
            b = (beat(r, 47, 47) if r == 5 else waiting(r)) if frozen else beat(r, tick + 1, tick + 1)
            ch.publish(Kind.HEARTBEAT, b, flush=True)
            ch.publish("status", {"status": b["status"], "step": tick}, flush=True)
        if tick == 6:
            stopped_at = time.monotonic()
            stopped.add(5)
        verdicts = [w.tick() for w in watches]
        before = counted.requests
        leader.tick(reader)
        if tick == 5:
            assert counted.requests - before == 2  # every node's digest in one check and one multi_get
        if any(verdicts):
            learned = verdicts
            break
        time.sleep(0.1)
    assert found, "the leader declared nothing"
    when, hang = found[0]
    assert (hang.kind, hang.culprits) == ("stopped", [5]) and "rank 5 stopped" in hang.verdict
    assert when - stopped_at < 3.0  # the floor (1 s) and a tick: the digest carries the state
    assert learned and all(v and v["culprits"] == [5] and v["kind"] == "stopped" for v in learned)


def test_a_fingerprint_mismatch_is_read_from_the_nodes_stores():
    """While every rank runs: rank 6's window digest differs; the leader reads the fingerprints
    of the windows from the nodes' stores (their addresses ride in the digests) and names rank 6."""
    central, _ = server()
    nodes = [server() for _ in range(2)]
    prints = {"windows": {"0": {"1": {"prints": ["all_reduce[64]float"] * fingerprints.EVERY,
                                      "times": [1e9] * fingerprints.EVERY}}}}
    odd = {"windows": {"0": {"1": {"prints": ["all_reduce[64]float"] * 9 + ["broadcast[5]float"]
                                   + ["all_reduce[64]float"] * (fingerprints.EVERY - 10),
                                   "times": [1e9] * fingerprints.EVERY}}}}
    for r in range(WORLD):
        ch = RankChannel(r, nodes[r // 4][0])
        b = beat(r, 128, 128)
        b["windows"] = {"0": {"1": "odd" if r == 6 else "9f2c4e1d"}}
        ch.publish(Kind.HEARTBEAT, b, flush=True)
        ch.publish(Kind.FINGERPRINTS, odd if r == 6 else prints, flush=True)
    for n in range(2):
        NodeAgent(n, list(range(4 * n, 4 * n + 4)), ChannelReader(nodes[n][0]), ChannelReader(central),
                  lambda kind, d, n=n: put(central, kind, n, d), store=nodes[n][1], host=f"node{n}",
                  states=lambda beats: {}).tick()
    found = []
    leader = Watchdog(WORLD, HangPolicy(floor_s=1.0), found.append, say=lambda line: None)
    leader.tick(DigestReader(ChannelReader(central), 2, ChannelReader))
    assert found and (found[0].kind, found[0].culprits, found[0].hung) == ("mismatch", [6], False)
    assert "collective #10 of group 0 differs: rank 6 issued broadcast" in found[0].verdict
